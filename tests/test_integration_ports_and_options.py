"""What every integration does with a taken port and with a mistaken option.

A taken port never stops training: each integration serves on the next free port (``prometheus`` ``port_search``
on by default) and says which in a warning. A mistaken option is refused when the integration object is built -
before the framework loads a model - not at the first hook that starts the Telemetry.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from importlib.util import find_spec
from urllib.parse import urlsplit

import pytest

from rl_otel import ConfigurationError
from tests.promtools import free_port, samples, scrape


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port another process is listening on (a second trainer, a node exporter, ...)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        yield holder.getsockname()[1]


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
