"""The accelerate integration (``RLOtelTracker``) with a real ``Accelerator``: one process, and two ranks of one
gloo process group as ``accelerate launch`` / torchrun start them."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._child import finish_ranks
from tests._readers import tensorboard_scalars
from tests.promtools import free_port_pair, key_samples, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}

accelerate = pytest.importorskip("accelerate")


def test_accelerate_tracker_with_a_real_accelerator(tmp_path):
    from rl_otel.integrations.accelerate import RLOtelTracker

    tracker = RLOtelTracker("acc-run", trackers={"tensorboard": {"log_dir": str(tmp_path)}}, **LOCAL)
    accelerator = accelerate.Accelerator(log_with=[tracker], cpu=True)
    accelerator.init_trackers("proj", config={"lr": 0.1})
    assert tracker.config == {"lr": 0.1}
    for step in range(3):
        accelerator.log({"critic/score/mean": 0.5 + step, "train/loss": 2.0 - step}, step=step)
    assert accelerator.get_tracker("rl_otel", unwrap=True) is tracker.tracker
    url = tracker.tracker.metrics_url
    assert key_samples(url, "critic/score/mean", "acc-run") == {frozenset({("stat", "mean")}): 2.5}
    accelerator.end_training()
    assert tensorboard_scalars(str(tmp_path))["train/loss"] == [(0, 2.0), (1, 1.0), (2, 0.0)]


# One rank of a two-process gloo group (the environment accelerate launch / torchrun set), following the README:
# the tracker object passed to log_with, kept and called on every rank. No run name: the ranks must still share
# one. Rank 1 starts its tracker when the test says so (a later second than rank 0's).
RANK_WORKER = """
import json, sys
import accelerate
from rl_otel.integrations.accelerate import RLOtelTracker

base, tb = int(sys.argv[1]), sys.argv[2]
tracker = RLOtelTracker(prometheus={"host": "127.0.0.1", "port": base}, trackers={"tensorboard": {"log_dir": tb}})
accelerator = accelerate.Accelerator(log_with=[tracker], cpu=True)
accelerator.init_trackers("proj", config={"lr": 0.1})  # starts the tracker on the main process only
rank = accelerator.process_index
report = {"rank": rank, "main": accelerator.is_main_process, "started_by_accelerate": tracker._telemetry is not None,
          "get_tracker_is_ours": accelerator.get_tracker("rl_otel") is tracker}
if rank == 1:
    sys.stdin.readline()
tracker.log({"critic/score/mean": 0.5 + rank}, step=1)  # the documented way: every rank
accelerator.log({"actor/pg_loss": 1.0}, step=1)  # accelerate's own: the main process only
tel = tracker.tracker
report.update(url=tel.metrics_url, trackers=list(tel.trackers), run=tel.config.run)
print(json.dumps(report), flush=True)
sys.stdin.readline()
accelerator.end_training()  # finishes the trackers init_trackers started: rank 0's; rank 1's closes at exit
"""


def read_line(proc: subprocess.Popen, timeout: float = 120) -> str:
    """The child's next stdout line, or '' when it prints none within ``timeout`` (it hung or died)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def test_two_ranks_the_tracker_passed_to_log_with_serves_every_rank_under_one_run(tmp_path):
    """accelerate starts and calls the tracker on the main process only (rank 1's get_tracker is accelerate's
    blank one); the tracker object itself, called on each rank, serves rank 0 on the port and rank 1 on the port +
    1, under one run label though the ranks started it in different seconds. Rank 0 alone mirrors."""
    base, tb = free_port_pair(), tmp_path / "tb"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
               "CUDA_VISIBLE_DEVICES": ""}
        env.pop("RL_OTEL_RUN", None)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_WORKER, str(base), str(tb)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        line = read_line(procs[0])
        assert line, "rank 0 did not report"
        main = json.loads(line)
        started = int(time.time())
        deadline = time.monotonic() + 30
        while int(time.time()) <= started:  # rank 1 starts its tracker in a later second
            assert time.monotonic() < deadline
            time.sleep(0.05)
        procs[1].stdin.write("go\n")
        procs[1].stdin.flush()
        line = read_line(procs[1])
        assert line, "rank 1 did not report"
        other = json.loads(line)
        assert (main["rank"], main["main"], other["rank"], other["main"]) == (0, True, 1, False)
        assert main["started_by_accelerate"] and main["get_tracker_is_ours"]
        assert not other["started_by_accelerate"] and not other["get_tracker_is_ours"]
        assert main["url"] == f"http://127.0.0.1:{base}/metrics" and main["trackers"] == ["tensorboard"]
        assert other["url"] == f"http://127.0.0.1:{base + 1}/metrics" and other["trackers"] == []
        run = main["run"]
        assert other["run"] == run
        text0, text1 = scrape(main["url"]), scrape(other["url"])
        assert samples(text0, "rl_critic_score") == {
            frozenset({("run", run), ("role", "trainer"), ("rank", "0"), ("stat", "mean")}): 0.5}
        assert samples(text1, "rl_critic_score") == {
            frozenset({("run", run), ("role", "trainer"), ("rank", "1"), ("stat", "mean")}): 1.5}
        assert samples(text0, "rl_actor_pg_loss") == {
            frozenset({("run", run), ("role", "trainer"), ("rank", "0")}): 1.0}
        assert samples(text1, "rl_actor_pg_loss") == {}  # accelerator.log never reaches rank 1
    finally:
        outs = finish_ranks(procs)
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    scalars = tensorboard_scalars(str(tb))
    assert scalars["critic/score/mean"] == [(1, 0.5)] and scalars["actor/pg_loss"] == [(1, 1.0)]
