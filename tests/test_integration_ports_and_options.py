"""What every integration does with a taken port and with a mistaken option.

A taken port never stops training: each integration serves on a free port further on (``prometheus``
``port_search`` on by default; with several ranks on a host, in steps of ``LOCAL_WORLD_SIZE``, each rank on its own
lane) and says which in a warning. A mistaken option is refused when the integration object is built -
before the framework loads a model - not at the first hook that starts the Telemetry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rl_otel import ConfigurationError
from tests._child import finish_ranks
from tests._waits import CHILD_ENV, read_line
from tests.promtools import free_port, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port another process is listening on (a second trainer, a node exporter, ...)."""
    with taken_port_at(free_port()) as port:
        yield port


@contextlib.contextmanager
def taken_port_at(port: int) -> Iterator[int]:
    """Loopback ``port``, listened on (by another process, as far as the code under test can tell)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield port


def prometheus(port: int) -> dict:
    return {"host": "127.0.0.1", "port": port}


def served_elsewhere(url: str | None, taken: int, caplog: pytest.LogCaptureFixture) -> int:
    """The port ``url`` serves on: not ``taken``, one of the next ones, scraped fine, and named in a warning."""
    assert url is not None
    port = urlsplit(url).port
    assert port is not None and taken < port <= taken + 100, url
    assert samples(scrape(url), "rl_otel_build_info")
    assert any(r.levelno == logging.WARNING and str(taken) in r.getMessage() and str(port) in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    return port


def test_roll_tracker_takes_the_next_free_port(caplog):
    from rl_otel.integrations.roll import RLOtelTracker

    with taken_port() as taken:
        tracker = RLOtelTracker({"exp_name": "roll-port"}, prometheus=prometheus(taken))
        try:
            served_elsewhere(tracker.telemetry.metrics_url, taken, caplog)
        finally:
            tracker.finish()


def test_trinity_roles_sharing_one_configured_port_both_serve(caplog):
    from rl_otel.integrations.trinity import RLOtelMonitor

    port = free_port()
    config = {"monitor": {"monitor_args": {"prometheus": prometheus(port)}}}
    explorer = RLOtelMonitor("p", "g", "trinity-port", "explorer", config)
    trainer = RLOtelMonitor("p", "g", "trinity-port", "trainer", config)  # colocated, same monitor_args
    try:
        assert explorer.telemetry is not None and trainer.telemetry is not None
        assert urlsplit(explorer.telemetry.metrics_url).port == port
        served_elsewhere(trainer.telemetry.metrics_url, port, caplog)
    finally:
        explorer.close()
        trainer.close()


@pytest.mark.skipif(find_spec("verl") is None, reason="needs verl")
def test_verl_tracking_takes_the_next_free_port(caplog):
    import verl  # noqa: F401  (loads the plugin)
    from verl.utils.tracking import Tracking

    with taken_port() as taken:
        config = {"trainer": {"rl_otel": {"prometheus": prometheus(taken)}}}
        tracking = Tracking("p", "verl-port", default_backend=["rl_otel"], config=config)
        try:
            served_elsewhere(tracking.logger["rl_otel"].telemetry.metrics_url, taken, caplog)
        finally:
            tracking.finish()


def test_transformers_callback_takes_the_next_free_port_and_checks_options_when_built(caplog):
    transformers = pytest.importorskip("transformers")
    from rl_otel.integrations.transformers import RLOtelCallback

    with pytest.raises(ConfigurationError, match="promethues"):
        RLOtelCallback(promethues={"port": 9464})
    with pytest.raises(ConfigurationError, match="port"):
        RLOtelCallback(prometheus={"port": "9464"})
    with pytest.raises(ConfigurationError, match="tracker_ranks"):
        RLOtelCallback(tracker_ranks="some")

    class Args:
        run_name, output_dir = "trl-port", "out"

    with taken_port() as taken:
        callback = RLOtelCallback(prometheus=prometheus(taken))
        callback.on_train_begin(Args(), transformers.TrainerState(), transformers.TrainerControl())
        try:
            assert callback.telemetry is not None
            served_elsewhere(callback.telemetry.metrics_url, taken, caplog)
        finally:
            callback.close()


def test_accelerate_tracker_takes_the_next_free_port_and_checks_options_when_built(caplog):
    pytest.importorskip("accelerate")
    from rl_otel.integrations.accelerate import RLOtelTracker

    with pytest.raises(ConfigurationError, match="promethues"):
        RLOtelTracker("r", promethues={"port": 9464})
    with pytest.raises(ConfigurationError, match="sink_queue_size"):
        RLOtelTracker("r", sink_queue_size=0)
    with taken_port() as taken:
        tracker = RLOtelTracker("acc-port", prometheus=prometheus(taken))
        try:
            tracker.start()
            served_elsewhere(tracker.tracker.metrics_url, taken, caplog)
        finally:
            tracker.finish()


def test_a_port_search_the_user_sets_is_kept(caplog):
    """``port_search: 0`` said explicitly keeps init()'s refusal of a taken port."""
    from rl_otel.errors import PortInUseError
    from rl_otel.integrations.roll import RLOtelTracker

    with taken_port() as taken, pytest.raises(PortInUseError):
        RLOtelTracker({"exp_name": "roll-port"}, prometheus={**prometheus(taken), "port_search": 0})


def free_ports(n: int) -> int:
    """A port ``p`` with ``p .. p + n - 1`` all free on loopback (now)."""
    for _ in range(50):
        base = free_port()
        if base + n - 1 > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


# One of two ranks on a host as torchrun starts them, driving the callback as a Trainer does, one port for all.
LANE_RANK = """
import json, sys
from transformers import TrainerControl, TrainerState
from rl_otel.integrations.transformers import RLOtelCallback

class Args:
    run_name, output_dir = "trl-lanes", "out"

callback = RLOtelCallback(prometheus={"host": "127.0.0.1", "port": int(sys.argv[1])})
callback.on_train_begin(Args(), TrainerState(), TrainerControl())
print(json.dumps({"url": callback.telemetry.metrics_url}), flush=True)
sys.stdin.readline()
callback.close()
"""


def test_a_taken_port_moves_only_its_rank_along_its_lane():
    """torchrun's two ranks given port p, p taken: rank 0 serves on p + 2 (its lane: p + 0 + 2k), rank 1 keeps
    p + 1 - though rank 0 started first (a search in steps of 1 put rank 0 on p + 1 and pushed rank 1 to p + 2).
    Rank 0's warning names the range the host's ranks serve within and file_sd."""
    base = free_ports(4)
    with taken_port_at(base):
        procs, urls = [], []
        try:
            for rank in (0, 1):  # one after the other: rank 0 has moved before rank 1 starts
                env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
                procs.append(subprocess.Popen([sys.executable, "-c", LANE_RANK, str(base)], env=env, text=True,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                line = read_line(procs[-1], f"rank {rank} serving")
                urls.append(json.loads(line)["url"])
            assert [urlsplit(url).port for url in urls] == [base + 2, base + 1]
            for url in urls:
                assert samples(scrape(url), "rl_otel_build_info")
        finally:
            outs = finish_ranks(procs)
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    warning = next(line for line in outs[0][1].splitlines() if "is taken" in line)
    assert f"port {base} is taken; serving on port {base + 2}" in warning
    assert f"within {base}..{base + 101}" in warning and "file_sd" in warning
    assert "is taken" not in outs[1][1]  # rank 1's own port was free


def test_a_rank_whose_whole_lane_is_taken_is_told_which_ports(monkeypatch):
    """port_search 2 with two ranks per host: local rank 0 tries p and p + 2 only (p + 1 is rank 1's); both taken
    is a PortInUseError naming them and file_sd."""
    from rl_otel.errors import PortInUseError
    from rl_otel.integrations.roll import RLOtelTracker

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    base = free_ports(3)
    with taken_port_at(base), taken_port_at(base + 2), \
            pytest.raises(PortInUseError, match=f"ports {base}, {base + 2} .*file_sd"):
        RLOtelTracker({"exp_name": "lane"}, prometheus={**prometheus(base), "port_search": 2})


def test_the_lane_holds_for_a_prometheus_option_from_the_config_file(monkeypatch, tmp_path, caplog):
    """A config file giving the port and its own port_search: local rank 0 of 2, its port taken, serves 2 further."""
    pytest.importorskip("accelerate")
    from rl_otel.integrations.accelerate import RLOtelTracker

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    base = free_ports(3)
    config = tmp_path / "rl_otel.yaml"
    config.write_text(f"prometheus: {{host: 127.0.0.1, port: {base}, port_search: 4}}\n")
    with taken_port_at(base):
        tracker = RLOtelTracker("lane-file", config=str(config))
        try:
            assert served_elsewhere(tracker.tracker.metrics_url, base, caplog) == base + 2
        finally:
            tracker.finish()
