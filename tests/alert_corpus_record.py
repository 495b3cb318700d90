"""Record the demo's real trajectory for the alert corpus: ``python -m tests.alert_corpus_record [--live] STEPS
SEED...``.

Runs ``rl_otel.demo.run`` (the real PPO demo, on CPU) and writes every scalar key each step logged, as the trackers
receive it, to ``/tmp/alert_corpus_raw/demo-<seed>.json``; ``tests/alert_corpus.py compact`` turns those into the
committed fixture ``tests/data/alert_corpus/demo.json.gz`` (the quantities the alerts read, 3 significant digits).

``--live`` also records when each step ended (seconds since the run started, the ``_t`` key): the demo as
docker-compose runs it (``rl-otel demo`` at its default steps, one step every ~0.1-0.3 s), which Prometheus samples
at its scrape interval; written to ``demo-live-<seed>.json``, compacted by ``tests/alert_corpus.py compact-live``
into ``tests/data/alert_corpus/demo_live.json.gz``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

RAW = Path("/tmp/alert_corpus_raw")


class _Capture:
    def __init__(self, out: dict[int, dict[str, float]], **_: object) -> None:
        self.out = out

    def log(self, metrics: dict[str, object], step: int) -> None:
        row = self.out.setdefault(step, {})
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                row[k] = float(v)

    def close(self) -> None:
        pass


def record(steps: int, seed: int, live: bool = False) -> Path:
    import rl_otel
    from rl_otel.demo import DemoConfig, run
    from rl_otel.sinks import register_sink

    out: dict[int, dict[str, float]] = {}
    ended: dict[int, float] = {}
    register_sink("corpus_capture", lambda **kw: _Capture(out))
    tel = rl_otel.init(run=f"demo-{seed}", prometheus=False, track_with="corpus_capture", handle_sigterm=False)
    start = time.monotonic()
    try:
        run(DemoConfig(steps=steps, seed=seed), telemetry=tel,
            on_step=lambda report: ended.__setitem__(report.step, time.monotonic() - start))
    finally:
        tel.close()
    if live:
        for step, t in ended.items():
            out.setdefault(step, {})["_t"] = round(t, 3)
    RAW.mkdir(exist_ok=True)
    path = RAW / (f"demo-live-{seed}.json" if live else f"demo-{seed}.json")
    path.write_text(json.dumps({str(k): out[k] for k in sorted(out)}))
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    live = args[:1] == ["--live"]
    n, seeds = int(args[live]), args[live + 1:]
    for s in seeds:
        print(record(n, int(s), live=live), flush=True)
