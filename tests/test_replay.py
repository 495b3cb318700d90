"""Behaviour unchanged: a recorded run (``tests/replay/run.jsonl``: keys, phases, submits, collectives) replayed
through the public API gives, byte for byte, the scrapes, the tracker output, ``tel.value()``'s answers and what the
library said that the code of the golden files gave (``tests/replay/expected/``, written by
``tests/replay/driver.py``, whose docstring says how they are regenerated and what is left out and why).

Runs the driver in a fresh process (its fake clock is installed before rl_otel is imported): slow.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "tests" / "replay"
EXPECTED = REPLAY / "expected"
DRIVER_TIMEOUT_S = 120  # about 2 s on an idle core; the bound is for a loaded machine
DIFF_LINES = 60


def run_driver(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, str(REPLAY / "driver.py"), "--out", str(out)], cwd=out, env=env,
                              capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the replay driver ran past {DRIVER_TIMEOUT_S} s; its stderr:\n{exc.stderr}")
    assert done.returncode == 0, f"the replay driver failed ({done.returncode}); its stderr:\n{done.stderr}"


def mismatches(expected: Path, got: Path) -> list[str]:
    """What differs between two output directories: a missing or extra file, or a file's unified diff (its first
    :data:`DIFF_LINES` lines)."""
    want = {p.name for p in expected.iterdir() if p.is_file()}
    have = {p.name for p in got.iterdir() if p.is_file()}
    problems = [f"missing: {name}" for name in sorted(want - have)]
    problems += [f"not in the golden files: {name}" for name in sorted(have - want)]
    for name in sorted(want & have):
        a, b = (expected / name).read_bytes(), (got / name).read_bytes()
        if a != b:
            diff = list(difflib.unified_diff(a.decode(errors="replace").splitlines(),
                                             b.decode(errors="replace").splitlines(),
                                             f"expected/{name}", f"replayed/{name}", lineterm=""))
            more = f"\n... {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
            problems.append("\n".join(diff[:DIFF_LINES]) + more)
    return problems


def test_the_recorded_run_replays_to_the_golden_scrapes_and_tracker_output(tmp_path):
    run_driver(tmp_path)
    problems = mismatches(EXPECTED, tmp_path)
    assert not problems, ("the replayed run differs from tests/replay/expected/ (regenerate them only for a "
                          "behaviour change made on purpose: see tests/replay/driver.py):\n\n" + "\n\n".join(problems))


def test_the_golden_files_cover_the_run():
    """What the run must reach, so that the comparison above means something: every kind of event, both formats."""
    names = {p.name for p in EXPECTED.iterdir()}
    assert {"scrape_final.prom", "scrape_final.om", "scrape_after_nan.prom", "scrape_in_phase.prom", "stdout_json.txt",
            "sink_calls.txt", "tensorboard.txt", "values.txt", "log.txt"} <= names
    scrapes = "".join((EXPECTED / f"scrape_{name}.prom").read_text() for name in ("after_nan", "mid", "final"))
    for line in ('rl_telemetry_errors_total{rank="0",reason="bad_value",role="trainer",run="replay",sink="input"}',
                 'reason="bad_step"', 'reason="exception",role="trainer",run="replay",sink="submit"',
                 'reason="bad_bucket"', "rl_collective_wait_seconds_total", "rl_phase_duration_seconds_bucket",
                 "rl_actor_importance_ratio_dist_bucket", "rl_my_custom_metric", "rl_goodput_bucket_seconds_total",
                 " NaN\n", " -Inf\n"):
        assert line in scrapes, line
    assert "rl_phase_started_timestamp_seconds{" in (EXPECTED / "scrape_in_phase.prom").read_text()
    assert (EXPECTED / "scrape_final.om").read_text().endswith("# EOF\n")
    assert "histo" in (EXPECTED / "tensorboard.txt").read_text()


def test_a_changed_golden_value_is_reported_with_its_diff(tmp_path):
    """The comparison can fail: one value changed in a copy of the golden files is a mismatch showing that line."""
    for path in EXPECTED.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    scrape = tmp_path / "scrape_final.prom"
    lines = scrape.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("rl_step{"))
    served = lines[at].rstrip("\n")
    changed = served.rsplit(" ", 1)[0] + " 12345.0"
    lines[at] = changed + "\n"
    scrape.write_text("".join(lines))
    (tmp_path / "values.txt").unlink()
    problems = mismatches(EXPECTED, tmp_path)
    assert problems[0] == "missing: values.txt"
    assert "--- expected/scrape_final.prom" in problems[1]
    assert f"\n-{served}\n+{changed}" in problems[1]
    assert len(problems) == 2
