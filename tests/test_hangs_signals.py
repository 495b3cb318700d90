"""Issue 41 item 6: after close(), a signal rl_otel handled does what the program set since, never what was there at
init(): rl_otel puts back only what is still its own (SIGUSR1's faulthandler registration, SIGTERM/SIGINT's
handlers). Each case runs in a process of its own, since the old code killed it."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_otel._internal.runtime.signals import SignalFlush

ROOT = Path(__file__).resolve().parents[1]
POSIX = pytest.mark.skipif(not hasattr(signal, "SIGUSR1") or sys.platform == "win32", reason="POSIX signals")

_PROLOGUE = textwrap.dedent("""
    import faulthandler, os, signal, sys, time
    import rl_otel

    out = sys.argv[1]
    def init(run):
        return rl_otel.init(run=run, prometheus=False, stack_dump_dir=out, handle_sigterm=False)
    def wait(what, condition):
        deadline = time.monotonic() + 60
        while not condition():
            if time.monotonic() > deadline:
                sys.exit(f"timed out waiting for {what}")
            time.sleep(0.01)
""")

_CASES = {
    # the program's own handler, set after init()
    "own_handler": """
        tel = init("a")
        ran = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append(signum))
        tel.close()
        os.kill(os.getpid(), signal.SIGUSR1)
        wait("the program's handler", lambda: ran)
        print("alive: the program's handler ran")
    """,
    # the program's own faulthandler.register, after init()
    "own_faulthandler": """
        tel = init("b")
        log = open(os.path.join(out, "own.txt"), "w+")
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
        tel.close()
        os.kill(os.getpid(), signal.SIGUSR1)
        wait("faulthandler's traceback", lambda: os.path.getsize(log.name) > 0)
        print("alive: the program's faulthandler wrote", os.path.getsize(log.name), "bytes")
    """,
    # a second Telemetry, made while the first held the signal, gets it when the first closes
    "second_telemetry": """
        first, second = init("c1"), init("c2")
        first.close()
        os.kill(os.getpid(), signal.SIGUSR1)
        wait("the second Telemetry's dump", lambda: second.value("rl_stack_dumps_total", reason="signal") == 1.0)
        second.close()
        print("alive: the second Telemetry dumped; handler", signal.getsignal(signal.SIGUSR1))
    """,
}


@POSIX
@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_CASES))
def test_sigusr1_after_close_does_what_the_program_set_since(tmp_path, case):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = _PROLOGUE + textwrap.dedent(_CASES[case])
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # the old code: -10 (killed by SIGUSR1)
    assert proc.stdout.startswith("alive:"), proc.stdout


@POSIX
def test_the_faulthandler_and_sigaction_adapters_read_what_the_kernel_and_faulthandler_hold(tmp_path):
    """posix.py's adapters against the real faulthandler and kernel: they fail loudly if either changes."""
    from rl_otel._internal.probes.hangs import _PipeEnd
    from rl_otel._internal.probes.posix import faulthandler_holds, os_action, os_handler, set_os_action

    sig = signal.SIGUSR2
    assert os_handler(sig) == 0
    with open(tmp_path / "a.txt", "w") as first, open(tmp_path / "b.txt", "w") as second:
        mine = _PipeEnd(first.fileno())  # the object rl_otel registers faulthandler with
        faulthandler.register(sig, file=mine, all_threads=False)
        try:
            assert faulthandler_holds(mine)
            registered = os_action(sig)
            assert registered is not None and os_handler(sig) not in (0, None)
            faulthandler.register(sig, file=second, all_threads=False)  # registered again: not ours any more
            assert not faulthandler_holds(mine)
        finally:
            faulthandler.unregister(sig)
        assert os_handler(sig) == 0
        assert set_os_action(sig, registered) and os_handler(sig) not in (0, None)  # put back as it was
        signal.signal(sig, signal.SIG_DFL)
        assert os_handler(sig) == 0


def test_a_sigterm_handler_is_never_put_back_from_a_telemetry_already_closed():
    """Two Telemetry objects in a row: the second found the first's handler at install; when both are closed
    (first, then second) the handler from before both is back, not the first's (it would close a closed
    Telemetry and end the process)."""
    original, original_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    first = SignalFlush(on_term=lambda: None, on_int=lambda: None, timeout_s=1)
    second = SignalFlush(on_term=lambda: None, on_int=lambda: None, timeout_s=1)
    first.uninstall()
    assert signal.getsignal(signal.SIGTERM) == second._handle  # the second's stays while it is open
    second.uninstall()
    assert signal.getsignal(signal.SIGTERM) == original
    assert signal.getsignal(signal.SIGINT) == original_int


_FLOOD_CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    import rl_otel
    from rl_otel._internal.probes import hangs
    from rl_otel._internal.probes.posix import os_handler

    hangs.ON_DEMAND_SPACING_S = 600.0  # parked for the whole test unless put back by hand
    tel = rl_otel.init(run="flood", prometheus=False, stack_dump_dir=sys.argv[1], handle_sigterm=False)
    watch = tel._components.hangs
    stop = threading.Event()

    def busy():
        def f(n):
            return n if n < 2 else f(n - 1) + f(n - 2)
        while not stop.is_set():
            f(10)

    def wait_parked():
        deadline = time.monotonic() + 60
        while os_handler(signal.SIGUSR1) != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        return os_handler(signal.SIGUSR1) == 1

    threading.Thread(target=busy, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:  # the test says what to do
        word = line.strip()
        if word == "after-flood":
            print("dumps", tel.value("rl_stack_dumps_total", reason="signal"), "parked", wait_parked(), flush=True)
            watch._unpark_when_due(force=True)  # the spacing over
            print("rearmed", os_handler(signal.SIGUSR1) not in (0, 1), flush=True)
        elif word == "parked?":
            print("parked", wait_parked(), flush=True)
        elif word == "close":
            stop.set()
            tel.close()
            print("closed, handler", os_handler(signal.SIGUSR1), flush=True)
            break
""")


def _ask(proc: subprocess.Popen, word: str) -> list[str]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


@POSIX
@pytest.mark.slow
def test_a_flood_of_the_dump_signal_is_survived_and_the_handler_comes_back(tmp_path):
    """Item 7: after a signal the kernel ignores it (SIG_IGN, set from the dumping thread) for the spacing, so a
    flood is not one frame walk per signal; faulthandler's handler is back after it, and a close while parked gives
    the default back. ``benchmarks/bench_signal_flood.py`` runs the issue's 40 six-second floods."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _FLOOD_CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent, end = 0, time.monotonic() + 2.0
        while time.monotonic() < end:
            for _ in range(500):
                os.kill(proc.pid, signal.SIGUSR1)
            sent += 500
        assert _ask(proc, "after-flood") == ["dumps", "1.0", "parked", "True"], sent  # old code: not parked
        assert proc.stdout.readline().split() == ["rearmed", "True"]
        os.kill(proc.pid, signal.SIGUSR1)  # faulthandler's again: it wakes the thread, which parks it again
        assert _ask(proc, "parked?") == ["parked", "True"]
        assert _ask(proc, "close") == ["closed,", "handler", "0"]  # closed while parked: the default
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
        assert len(list(tmp_path.glob("stacks-*-signal-*.txt"))) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
