"""SIGUSR1 floods against a training process with stack dumps on (issue 41 item 7).

    python benchmarks/bench_signal_flood.py [--floods 40] [--seconds 6]

Each flood starts a child that trains (phases, logged steps, a second Python thread busy beside it) with rl_otel's
stack dumps on SIGUSR1, sends it SIGUSR1 as fast as this process can for ``seconds``, then lets it finish: a flood
crashes when the child dies by a signal (faulthandler's frame walk: SIGSEGV). Prints the crashes, the signals sent
and the dumps written per flood. Target: 0 crashes in 40 floods (before: 3 of 37 six-second floods of ~700k signals
died by SIGSEGV). Information rows (no speed target).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import sys, threading, time
    import rl_otel

    tel = rl_otel.init(run="flood", prometheus=False, stack_dump_dir=sys.argv[1], handle_sigterm=False)
    stop = time.monotonic() + float(sys.argv[2])

    def busy():  # frames made and dropped all the time: where a frame walk in a signal handler goes wrong
        def f(n):
            return n if n < 2 else f(n - 1) + f(n - 2)
        while time.monotonic() < stop:
            f(12)

    threading.Thread(target=busy, daemon=True).start()
    print("ready", flush=True)
    step = 0
    while time.monotonic() < stop:
        with tel.phase("actor_train", "train_step"):
            sum(i * i for i in range(2000))
        tel.log({"actor/pg_loss": float(step)}, step=step)
        step += 1
    tel.close()
    print("steps", step, flush=True)
""")


def flood(seconds: float, directory: str) -> tuple[int, int, int]:
    """(the child's return code, signals sent, dumps written)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, directory, str(seconds + 3)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    sent, end = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for _ in range(1000):
                os.kill(proc.pid, signal.SIGUSR1)
            sent += 1000
    except ProcessLookupError:
        pass
    proc.communicate(timeout=120)
    return proc.returncode, sent, len(list(Path(directory).glob("stacks-*.txt")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--floods", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    crashes, total = 0, 0
    for i in range(args.floods):
        with tempfile.TemporaryDirectory() as directory:
            code, sent, dumps = flood(args.seconds, directory)
        total += sent
        crashed = code != 0
        crashes += crashed
        print(f"flood {i + 1:2d}: {sent:,} signals, {dumps} dumps, exit {code}{'  CRASH' if crashed else ''}",
              flush=True)
    print(f"crashes: {crashes} of {args.floods} floods ({total:,} signals; target 0)")


if __name__ == "__main__":
    main()
