"""SignalFlush in-process: a signal inside a held section waits for release(), the action runs before the
previous handler, and uninstall() puts the previous handler back. (End to end, with trackers and a real process
killed by SIGTERM: test_faults.py.)"""

from __future__ import annotations

import os
import signal

import pytest

from rl_otel._internal.runtime.signals import SignalFlush


@pytest.fixture
def previous_sigint():
    calls: list[str] = []
    original = signal.signal(signal.SIGINT, lambda signum, frame: calls.append("previous"))
    yield calls
    signal.signal(signal.SIGINT, original)


def test_signal_in_a_held_section_is_handled_at_release_then_chained(previous_sigint):
    calls = previous_sigint
    guard = SignalFlush(on_term=lambda: calls.append("close"), on_int=lambda: calls.append("flush"), timeout_s=5)
    assert set(guard.installed) == {signal.SIGTERM, signal.SIGINT}
    guard.hold()
    guard.hold()  # nested, as log() inside a phase
    os.kill(os.getpid(), signal.SIGINT)
    assert calls == []  # the step in progress is not interrupted
    guard.release()
    assert calls == []
    guard.release()
    assert calls == ["flush", "previous"]
    os.kill(os.getpid(), signal.SIGINT)  # outside a held section: at once, and still installed after SIGINT
    assert calls == ["flush", "previous", "flush", "previous"]
    guard.uninstall()
    os.kill(os.getpid(), signal.SIGINT)
    assert calls[-2:] == ["previous", "previous"] and guard.installed == ()


def test_sigterm_that_does_not_end_the_process_only_flushes_and_stays_installed():
    """SIG_IGN, or the application's own graceful handler: the run goes on, so nothing is closed (before: the
    Telemetry closed first, and the final steps the application logged while stopping were lost)."""
    calls: list[str] = []
    for previous in (signal.SIG_IGN, lambda signum, frame: calls.append("application")):
        original = signal.signal(signal.SIGTERM, previous)
        try:
            guard = SignalFlush(on_term=lambda: calls.append("close"), on_int=lambda: calls.append("flush"),
                                timeout_s=5)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one is handled the same way: still installed
            assert signal.SIGTERM in guard.installed
            guard.uninstall()
            assert signal.getsignal(signal.SIGTERM) == previous
        finally:
            signal.signal(signal.SIGTERM, original)
    assert calls == ["flush", "flush", "flush", "application", "flush", "application"]


def test_a_signal_during_close_is_delivered_to_the_previous_handler_after_uninstall(previous_sigint):
    """Between begin_close() and uninstall() (the whole close) a signal is held: the close is not cut short, and
    the handler that was there before gets it once the close is over - once, however often it arrived."""
    calls = previous_sigint
    guard = SignalFlush(on_term=lambda: calls.append("close"), on_int=lambda: calls.append("flush"), timeout_s=5)
    guard.begin_close()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    calls.append("closing")  # the close goes on
    guard.uninstall()
    assert calls == ["closing", "previous"] and guard.installed == ()
