"""How far one value travels: the rl_otel modules one ``tel.log()`` of a float crosses on the training thread,
and those one scrape crosses on the endpoint's thread (issue 40's "hops").

    python benchmarks/hops.py [--calls]

Traced with ``sys.setprofile`` (``threading.setprofile`` for the server's threads, set before ``init()``), on a
warmed-up Telemetry with a scrape endpoint (one step logged before, so routes are cached and the first-time work
is not counted). Counted, for each operation:

- ``modules``: the distinct rl_otel modules whose Python functions ran;
- ``hops``: Python calls from a function of one rl_otel module into a function of another;
- ``recorder entries``: calls into ``pipeline/recorder.py`` from another module (re-entries of the recorder).

Not a timing: the same counts on a busy machine as on a quiet one. Run it on two checkouts to compare
(``PYTHONPATH=<checkout> python <checkout>/benchmarks/hops.py``).
"""

from __future__ import annotations

import argparse
import sys
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one

_RECORDER = "rl_otel/_internal/pipeline/recorder.py"


class Trace:
    """Records Python calls between rl_otel modules while ``on`` is set (on any thread, or one given thread)."""

    def __init__(self) -> None:
        self.on = False
        self.thread: int | None = None  # only this thread's calls, when set
        self.calls: list[tuple[str, str, str]] = []  # (caller module, callee module, callee function)

    def __call__(self, frame, event, arg):
        if not self.on or event != "call":
            return
        if self.thread is not None and threading.get_ident() != self.thread:
            return
        callee = _module(frame.f_code.co_filename)
        if callee is None:
            return
        caller = frame.f_back
        while caller is not None and _module(caller.f_code.co_filename) is None:
            caller = caller.f_back  # through the standard library and dependencies, back to rl_otel
        self.calls.append((_module(caller.f_code.co_filename) if caller is not None else "", callee,
                           frame.f_code.co_qualname))


def _module(filename: str) -> str | None:
    marker = "/rl_otel/"
    at = filename.rfind(marker)
    return None if at < 0 else "rl_otel/" + filename[at + len(marker):]


def summary(calls: list[tuple[str, str, str]]) -> dict[str, object]:
    modules = sorted({callee for _, callee, _ in calls})
    hops = [(a, b, f) for a, b, f in calls if a and a != b]
    entries = [c for c in hops if c[1] == _RECORDER]
    return {"modules": modules, "hops": len(hops), "recorder_entries": len(entries), "path": hops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", action="store_true", help="print each hop")
    args = parser.parse_args()
    trace = Trace()
    threading.setprofile(trace)  # the endpoint's threads, started by init()
    import rl_otel

    tel = rl_otel.init(run="hops", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                       stack_dump_signal=None)
    try:
        tel.log({"actor/pg_loss": 0.5, "critic/score/mean": 1.0})
        urllib.request.urlopen(tel.metrics_url, timeout=30).read()  # warm: routes cached, encoder compiled
        sys.setprofile(trace)
        trace.thread = threading.get_ident()
        trace.on = True
        tel.log({"actor/pg_loss": 0.25})
        trace.on = False
        sys.setprofile(None)
        logged = summary(trace.calls)
        trace.calls, trace.thread = [], None
        tel.log({"actor/pg_loss": 0.125})  # a changed store: the scrape renders it
        trace.on = True
        urllib.request.urlopen(tel.metrics_url, timeout=30).read()
        trace.on = False
        scraped = summary(trace.calls)
    finally:
        threading.setprofile(None)
        tel.close()
    for name, result in (("one log() of a float", logged), ("one scrape", scraped)):
        mods = result["modules"]
        print(f"{name}: {len(mods)} modules, {result['hops']} hops, {result['recorder_entries']} recorder entries")
        for mod in mods:
            print(f"    {mod}")
        if args.calls:
            for a, b, f in result["path"]:
                print(f"      {a} -> {b}:{f}")


if __name__ == "__main__":
    main()
