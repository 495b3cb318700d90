"""One training rank for the multi-rank tests: ``python -m tests.rank_worker RUN FILE_SD_DIR`` with RANK,
LOCAL_RANK and WORLD_SIZE set. It logs values known from its rank (:func:`expected`), publishes its ephemeral
port in FILE_SD_DIR, prints ``ready <metrics_url>`` and serves until its stdin closes, then closes cleanly."""

from __future__ import annotations

import os
import sys


def expected(rank: int) -> dict[str, object]:
    """What rank ``rank`` logs at step 10: the test checks Prometheus' aggregates against these."""
    return {"critic/score/mean": 0.125 * (rank + 1), "actor/approxkl": 0.001 * rank * rank,
            "system/samples": 100 * (rank + 1), "env/reward_dist": [0.0] * (rank + 1)}


def main() -> None:
    import rl_otel

    run, file_sd = sys.argv[1], sys.argv[2]
    tel = rl_otel.init(run=run, prometheus={"host": "127.0.0.1", "port": 0, "file_sd": file_sd})
    tel.log(expected(tel.config.rank), step=10)
    print("ready", tel.metrics_url, os.environ["LOCAL_RANK"], flush=True)
    sys.stdin.read()  # until the test closes our stdin
    tel.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
