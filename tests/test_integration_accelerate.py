"""The accelerate integration (``RLOtelTracker``) with a real ``Accelerator``: one process, and two ranks of one
gloo process group as ``accelerate launch`` / torchrun start them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._readers import tensorboard_scalars
from tests.promtools import free_port_pair, key_samples, samples, scrape

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


# One rank of a two-process gloo group (the environment accelerate launch / torchrun set), using the tracker the
# documented way, then - on every rank - directly.
RANK_WORKER = """
import json, sys
import accelerate
from rl_otel.integrations.accelerate import RLOtelTracker

base, tb = int(sys.argv[1]), sys.argv[2]
tracker = RLOtelTracker("acc-ranks", prometheus={"host": "127.0.0.1", "port": base},
                        trackers={"tensorboard": {"log_dir": tb}})
accelerator = accelerate.Accelerator(log_with=[tracker], cpu=True)
accelerator.init_trackers("proj", config={"lr": 0.1})
accelerator.log({"critic/score/mean": 0.5}, step=1)
report = {"rank": accelerator.process_index, "main": accelerator.is_main_process,
          "started_by_accelerate": tracker._telemetry is not None, "in_trackers": tracker in accelerator.trackers,
          "get_tracker_is_ours": accelerator.get_tracker("rl_otel") is tracker}
tracker.log({"actor/pg_loss": 1.0 + accelerator.process_index}, step=2)  # direct: works on every rank
tel = tracker.tracker
report.update(url=tel.metrics_url, trackers=list(tel.trackers))
accelerator.wait_for_everyone()
print(json.dumps(report), flush=True)
sys.stdin.readline()
accelerator.end_training()  # finishes the trackers init_trackers started: rank 0's; rank 1's closes at exit
"""



def test_two_ranks_accelerate_drives_the_main_process_only_direct_calls_serve_every_rank(tmp_path):
    """init_trackers and log are @on_main_process: rank 1's tracker is never started by accelerate (no endpoint,
    a blank tracker from get_tracker); a direct tracker.log() starts it there, on the port + LOCAL_RANK, with no
    tracker sink (rank 0 alone mirrors)."""
    base, tb = free_port_pair(), tmp_path / "tb"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
               "CUDA_VISIBLE_DEVICES": ""}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_WORKER, str(base), str(tb)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        lines = [p.stdout.readline() for p in procs]
        assert all(lines), [p.communicate(timeout=60)[1][-3000:] for p in procs]
        main, other = (json.loads(line) for line in lines)
        assert (main["rank"], main["main"], other["rank"], other["main"]) == (0, True, 1, False)
        assert main["started_by_accelerate"] and main["in_trackers"] and main["get_tracker_is_ours"]
        assert not other["started_by_accelerate"] and not other["in_trackers"] and not other["get_tracker_is_ours"]
        assert main["url"] == f"http://127.0.0.1:{base}/metrics" and main["trackers"] == ["tensorboard"]
        assert other["url"] == f"http://127.0.0.1:{base + 1}/metrics" and other["trackers"] == []
        text0, text1 = scrape(main["url"]), scrape(other["url"])
        assert samples(text0, "rl_critic_score") == {
            frozenset({("run", "acc-ranks"), ("rank", "0"), ("stat", "mean")}): 0.5}
        assert samples(text1, "rl_critic_score") == {}  # accelerator.log never reached rank 1
        assert samples(text1, "rl_actor_pg_loss") == {frozenset({("run", "acc-ranks"), ("rank", "1")}): 2.0}
    finally:
        outs = [p.communicate("\n", timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    scalars = tensorboard_scalars(str(tb))
    assert scalars["critic/score/mean"] == [(1, 0.5)] and scalars["actor/pg_loss"] == [(2, 1.0)]
