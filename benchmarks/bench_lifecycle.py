"""``rl_otel.init()`` and ``Telemetry.close()`` with the Prometheus endpoint on, in a fresh process each time,
against prometheus_client started and stopped by hand.

    python benchmarks/bench_lifecycle.py [--rounds 9]

Each round starts two fresh Python processes, alternating which goes first (a fresh process: what a training
job pays once, imports included):

- rl_otel: in a process that has imported torch (a training job's; numpy comes with it), after ``import
  rl_otel`` (timed apart), ``rl_otel.init(run, prometheus={port: 0})``; one ``log()``
  and one scrape (the endpoint serves); then ``tel.close()``;
- prometheus_client: ``import prometheus_client``, a registry, a Gauge, ``start_http_server(0)`` (what
  ``init()`` replaces: it defers its own imports into ``init()``, so the baseline's import is inside its timing
  too); one ``set()`` and one scrape; then ``server.shutdown(); server.server_close()`` (socketserver's
  ``shutdown()`` waits for its 0.5 s poll).

The figures are the medians over rounds; the ratios the medians of the per-round ratios. Targets: 50 ms each.

For information (no target), a third fresh process per round times the first ``phase()`` after ``init()``
against a later one: the first builds the Telemetry's SDK TracerProvider (its imports, the SDK ``Resource``
that ``init()`` no longer builds). A full garbage collection runs before it (``gc.collect()``): in a process
holding torch's objects the first allocation-heavy moment after ``init()`` sets one off (~80 ms, whatever
allocates), which is torch's cost, not the phase's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 50.0

OURS = """
import json, sys, time, urllib.request
import torch  # a training job's process has torch (and with it numpy) loaded before it starts rl_otel
sys.path.insert(0, ROOT)
t0 = time.perf_counter()
import rl_otel
t1 = time.perf_counter()
tel = rl_otel.init("bench-lifecycle", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
t2 = time.perf_counter()
tel.log({"actor/pg_loss": 0.5, "critic/score/mean": 1.0}, step=0)
urllib.request.urlopen(tel.metrics_url, timeout=30).read()
t3 = time.perf_counter()
tel.close()
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "init": t2 - t1, "close": t4 - t3}))
"""

THEIRS = """
import json, sys, time, urllib.request
t1 = time.perf_counter()
import prometheus_client
registry = prometheus_client.CollectorRegistry()
gauge = prometheus_client.Gauge("rl_actor_pg_loss", "pg loss", ["run"], registry=registry).labels(run="bench")
server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
t2 = time.perf_counter()
gauge.set(0.5)
urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30).read()
t3 = time.perf_counter()
server.shutdown()
server.server_close()
t4 = time.perf_counter()
print(json.dumps({"init": t2 - t1, "close": t4 - t3}))
"""


PHASE = """
import gc, json, sys, time
import torch
sys.path.insert(0, ROOT)
import rl_otel
tel = rl_otel.init("bench-lifecycle", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
gc.collect()  # the full collection torch's objects are due (see the module docstring), outside the timing
t0 = time.perf_counter()
with tel.phase("actor_train", "train_step"):
    pass
t1 = time.perf_counter()
with tel.phase("actor_train", "train_step"):
    pass
t2 = time.perf_counter()
tel.close()
print(json.dumps({"first": t1 - t0, "later": t2 - t1}))
"""

_PYC = tempfile.mkdtemp(prefix="rl_otel-bench-pyc-")


def run(code: str) -> dict[str, float]:
    # Bytecode cached, as for any installed package (pip compiles at install): without it (PYTHONDONTWRITEBYTECODE
    # is set on these machines) every fresh process would compile rl_otel's sources again, ~80 ms not in a job's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = _PYC
    out = subprocess.run([sys.executable, "-c", code.replace("ROOT", repr(str(ROOT)))], capture_output=True,
                         text=True, timeout=120, check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(rounds: int) -> dict[str, float]:
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    phases: list[dict[str, float]] = []
    run(OURS), run(THEIRS), run(PHASE)  # warm the file cache
    for r in range(rounds):
        if r % 2 == 0:
            ours.append(run(OURS))
            theirs.append(run(THEIRS))
        else:
            theirs.append(run(THEIRS))
            ours.append(run(OURS))
        phases.append(run(PHASE))
    out = {f"{side}_{k}": statistics.median(d[k] for d in data) * 1e3
           for side, data in (("ours", ours), ("theirs", theirs), ("phase", phases)) for k in data[0]}
    for k in ("init", "close"):
        out[f"{k}_ratio"] = statistics.median(a[k] / b[k] for a, b in zip(ours, theirs, strict=True))
    return out


def rows_from(m: dict[str, float]) -> list[Row]:
    base = "prometheus_client by hand"
    # information rows (under TARGET_MS when last measured): milliseconds once per process, not felt per step
    info = f"(information; was <= {TARGET_MS:g} ms)"
    return [
        Row(f"init(), endpoint on, fresh process (after import rl_otel: {m['ours_import']:.0f} ms)", m["ours_init"],
            m["theirs_init"], "ms", info, None, f"{base}: import + start_http_server", paired_ratio=m["init_ratio"]),
        Row("close(), endpoint on", m["ours_close"], m["theirs_close"], "ms", info, None,
            f"{base}: server.shutdown() + server_close()", paired_ratio=m["close_ratio"]),
        Row("first phase() after init(), fresh process (no tracing=)", m["phase_first"], m["phase_later"], "ms",
            "(information)", None, "a later phase()"),
    ]


def rows(quick: bool = False) -> list[Row]:
    return rows_from(measure(3 if quick else 9))


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    m = measure(args.rounds)
    print(f"{args.rounds} rounds of three fresh processes (rl_otel, prometheus_client, a first phase); medians (ms)")
    print(table(rows_from(m)))


if __name__ == "__main__":
    main()
