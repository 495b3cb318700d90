"""A training process killed outright (SIGKILL, the OOM killer, a segfault) runs no handler: what the trackers
hold in memory is lost. The TensorBoard and stdout-file sinks hand each step to the OS as they write it, so every
step the sink worker has written is on disk after the kill, with no later ``log()`` needed (a stalled run: a hung
collective, a long evaluation, a debugger), as with TensorBoard's own ``SummaryWriter``.

Before: records waited in the writer's buffer for the next ``add_event()`` after ``flush_secs``; 500 steps then a
15 s stall then SIGKILL left 0 of 500 steps in the event file."""

from __future__ import annotations

import glob
import json
import time

import pytest

pytest.importorskip("tensorboard")

from tests._child import Child
from tests._readers import tensorboard_scalars
from tests._sinks import REPO

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

STEPS = 200
KEYS = 20

RUN = f"""
import rl_otel
tel = rl_otel.init(prometheus=False, handle_sigterm=False, sink_queue_size={STEPS},  # a burst: no step dropped
                   trackers={{"tensorboard": {{"log_dir": "tb"}}, "stdout": {{"file": "out.log"}}}})
for step in range({STEPS}):
    tel.log({{f"actor/k{{i}}": float(step * 100 + i) for i in range({KEYS})}}, step=step)
say(logged={STEPS})
wait()  # stalled: no further log(), no flush(), no close() - until the test kills the process
"""


def _steps_in_event_file(log_dir) -> set[int]:
    """The steps TensorBoard's own loader reads from the event file as it is now (a record being written is
    not read)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps: set[int] = set()
    for path in glob.glob(str(log_dir / "events.out.tfevents.*")):
        steps |= {e.step for e in EventFileLoader(path).Load() if e.HasField("summary")}
    return steps


def _json_lines(path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line[len("metrics_tag: "):]) for line in lines if line.endswith("}")]


def test_a_stalled_run_killed_by_sigkill_keeps_every_logged_step(tmp_path):
    child = Child(RUN, [], tmp_path, env={"PYTHONPATH": str(REPO)})
    try:
        assert child.expect() == {"logged": STEPS}
        # the sinks' worker writes the steps on its own: wait (bounded) until the file holds them all
        deadline = time.monotonic() + 60
        while (len(_steps_in_event_file(tmp_path / "tb")) < STEPS or len(_json_lines(tmp_path / "out.log")) < STEPS) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.proc.poll() is None  # still running, stalled: nothing but the worker wrote the records
    finally:
        child.kill()  # SIGKILL: no atexit, no close(), no flush
    assert _steps_in_event_file(tmp_path / "tb") == set(range(STEPS)), "steps on disk after SIGKILL"
    scalars = tensorboard_scalars(str(tmp_path / "tb"))  # and TensorBoard's EventAccumulator reads them all
    assert set(scalars) == {f"actor/k{i}" for i in range(KEYS)}
    assert scalars["actor/k3"] == [(s, float(s * 100 + 3)) for s in range(STEPS)]
    lines = _json_lines(tmp_path / "out.log")
    assert [line["step"] for line in lines] == list(range(STEPS))
    assert lines[-1]["metrics"]["actor/k3"] == (STEPS - 1) * 100 + 3
