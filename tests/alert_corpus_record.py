"""Record the demo's real trajectory for the alert corpus: ``python -m tests.alert_corpus_record STEPS SEED...``.

Runs ``rl_otel.demo.run`` (the real PPO demo, on CPU) and writes every scalar key each step logged, as the trackers
receive it, to ``/tmp/alert_corpus_raw/demo-<seed>.json``; ``tests/alert_corpus.py compact`` turns those into the
committed fixture ``tests/data/alert_corpus/demo.json`` (the quantities the alerts read, 4 significant digits).
"""

from __future__ import annotations

import json
import math
import sys
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


def record(steps: int, seed: int) -> Path:
    import rl_otel
    from rl_otel.demo import DemoConfig, run
    from rl_otel.sinks import register_sink

    out: dict[int, dict[str, float]] = {}
    register_sink("corpus_capture", lambda **kw: _Capture(out))
    tel = rl_otel.init(run=f"demo-{seed}", prometheus=False, track_with="corpus_capture", handle_sigterm=False)
    try:
        run(DemoConfig(steps=steps, seed=seed), telemetry=tel)
    finally:
        tel.close()
    RAW.mkdir(exist_ok=True)
    path = RAW / f"demo-{seed}.json"
    path.write_text(json.dumps({str(k): out[k] for k in sorted(out)}))
    return path


if __name__ == "__main__":
    n = int(sys.argv[1])
    for s in sys.argv[2:]:
        print(record(n, int(s)), flush=True)
