"""One RL step, one trace, across processes: torchrun's gloo ranks and a Ray job's driver and actors push their
spans over OTLP/HTTP to a receiver in the test; every span of step N of every process is in the trace
``step_ids(run, N)``, under one root, the ``step`` span rank 0 of the trainer writes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_otel._internal.tracing.steps import step_ids
from tests.otlp_receiver import OtlpReceiver
from tests.step_traces import one_trace, received

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PHASES = {"actor_infer/generate", "actor_train/train_step"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def _torchrun(url: str, run: str, first: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             f"--master_port={_free_port()}", str(ROOT / "tests" / "trace_ranks.py"),
                             f"{url}/v1/traces", run, str(first)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_torchrun_jobs_at_once_one_resumed_each_step_is_one_trace(receiver):
    """Two jobs at once (different runs), one resumed at step 5; the ranks are never told the step of a phase
    (the first one is known only at the first log()): each step of each run is one trace of 17 spans - the
    step span, and two phases of four spans on each of the two ranks."""
    jobs = {("job_a", 0): _torchrun(receiver.url, "job_a", 0), ("job_b", 5): _torchrun(receiver.url, "job_b", 5)}
    for (run, _), job in jobs.items():
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"{run}:\n{out[-4000:]}"
    spans = received(receiver)
    for run, first in jobs:
        for step in range(first, first + 3):
            trace_id, step_span = step_ids(run, step)
            root, rest = one_trace(spans, trace_id)
            assert (root.name, root.span_id, root.resource["rl.rank"]) == ("step", step_span, 0)
            assert root.attributes["step"] == step
            phases = [s for s in rest if s.name in PHASES]
            assert sorted((s.resource["rl.rank"], s.name) for s in phases) == sorted(
                (rank, name) for rank in (0, 1) for name in PHASES)
            assert all(s.parent_id == step_span and s.attributes["step"] == step for s in phases)
            assert len(rest) == 2 * 2 * 4
            assert {s.resource["rl.run"] for s in rest} == {run}
    assert len(spans) == 2 * 3 * 17  # nothing else, nothing twice


def _ray_job(receiver, run: str, *mode: str) -> None:
    """Run ``tests/trace_ray_driver.py`` (its own local Ray cluster) and wait, bounded, until Ray has ended its
    actors: what they sent is then all that arrives."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.run([sys.executable, str(ROOT / "tests" / "trace_ray_driver.py"), f"{receiver.url}/v1/traces",
                             run, *mode], env=env, capture_output=True, text=True, timeout=300)
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
    pids = [int(p) for p in driver.stdout.split("actor pids", 1)[1].split()]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids), f"{run}: Ray did not end the actors within 30 s"


def _assert_steps_of(spans, run: str) -> None:
    """Each of the driver's two steps is one trace: the driver's step span over its phase and each actor's."""
    for step in range(2):
        trace_id, step_span = step_ids(run, step)
        root, rest = one_trace(spans, trace_id)
        assert (root.name, root.span_id, root.resource["rl.role"]) == ("step", step_span, "trainer")
        assert sorted((s.resource["rl.role"], s.resource["rl.rank"], s.name) for s in rest if s.parent_id ==
                      step_span) == [("actor_infer", 0, "actor_infer/generate"), ("actor_infer", 1,
                                     "actor_infer/generate"), ("trainer", 0, "driver/rollout")]


def test_ray_actors_spans_reach_the_steps_trace_when_the_driver_just_exits(receiver):
    """A Ray driver started on this machine (``ray.init(address="local")``), two actors told their step by the
    driver's call; the driver returns without closing them and Ray ends them: every one of the actors' 16 spans
    (2 actors x 2 steps x 4) arrives, each step one trace under the driver's step span."""
    _ray_job(receiver, "ray_run")
    spans = received(receiver)
    workers = [s for s in spans if s.resource["rl.role"] == "actor_infer"]
    assert len(workers) == 16, sorted((s.resource["rl.rank"], s.attributes.get("step"), s.name) for s in workers)
    _assert_steps_of(spans, "ray_run")


ROLL_RUNS = 10


def test_roll_shaped_workers_lose_no_span_at_the_normal_end_of_a_run(receiver):
    """The issue's ROLL defect, 10 runs: workers with the Telemetry ROLL's get (``handle_sigterm=False``), never
    closed, whose exit skips the exit handlers registered before their own teardown (the OTel SDK's, rl_otel's);
    each driver exits right after its last step, and Ray ends the workers as it does at a driver's exit. Every
    run: 16 of 16 worker spans, in their steps' traces. (The same driver with the code before phases were
    flushed at their end - 3effae0, the SDK's 5 s batch delay - got 0 of 16 in each of 3 runs.)"""
    written = {}
    for i in range(ROLL_RUNS):
        run = f"roll_end_{i}"
        _ray_job(receiver, run, "roll")
        spans = [s for s in received(receiver) if s.resource["rl.run"] == run]
        written[run] = len([s for s in spans if s.resource["rl.role"] == "actor_infer"])
        if written[run] == 16:
            _assert_steps_of(spans, run)
    assert written == {f"roll_end_{i}": 16 for i in range(ROLL_RUNS)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


SIGTERM_WORKER = r"""
import os, signal, sys, time
import rl_otel

def app_handler(signum, frame):  # a worker's own handler, as Ray's: it ends the process, skipping exit handlers
    print("app handler ran", flush=True)
    os._exit(3)

signal.signal(signal.SIGTERM, app_handler)
tel = rl_otel.init(run="sigterm", role="rollout", prometheus=False,
                   tracing={"exporter": "otlp", "endpoint": sys.argv[1]})
for _ in range(2):  # no step logged: the spans are held for one (tracing/pending.py)
    with tel.phase("actor_infer", "generate"):
        pass
print("ready", flush=True)
time.sleep(60)
"""


def test_sigterm_sends_the_held_spans_then_runs_the_workers_own_handler(receiver):
    """A worker with its own SIGTERM handler that ends the process at once (no exit handlers run) and phases
    still waiting for a step: rl_otel's handler, chained in front, sends them first; the worker's handler still
    runs (its exit status)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_WORKER, f"{receiver.url}/v1/traces"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "app handler ran" in out, out
    spans = received(receiver)
    assert sorted(s.name for s in spans) == sorted(["actor_infer/generate", "onload", "execute", "offload"] * 2)
    assert {s.resource["rl.run"] for s in spans} == {"sigterm"}
