from __future__ import annotations

from pathlib import Path

import pytest

import rl_otel

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch):
    """The standard OTEL_* variables change what init() does (rl_otel honours them): a test sets the ones it
    means, none leak in from the machine running the suite."""
    import os

    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def tel():
    """A Telemetry serving on a free loopback port, closed after the test."""
    t = rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0})
    yield t
    t.close()


@pytest.fixture(scope="session")
def seed_keys() -> list[str]:
    lines = (DATA / "seed_keys.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]
