"""Many processes: each rank labels its series and serves its own endpoint; only rank 0 mirrors to trackers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_otel import ConfigurationError
from rl_otel._internal.runtime.ranks import ProcessRanks, env_ranks, launch_identity, port_lane
from tests._readers import tensorboard_scalars
from tests._waits import CHILD_ENV, read_line
from tests.promtools import samples, scrape

ROOT = Path(__file__).resolve().parent.parent

# A training process as torchrun starts it: rank from the environment, one shared TensorBoard directory.
WORKER = """
import sys, rl_otel
tel = rl_otel.init(run="ranks", prometheus={"host": "127.0.0.1", "port": 0},
                   trackers={"tensorboard": {"log_dir": sys.argv[1]}})
rank = tel.config.rank
for step in range(3):
    tel.log({"critic/score/mean": 10 * rank + step}, step=step)
print(tel.metrics_url, ",".join(tel.trackers), flush=True)
sys.stdin.readline()  # serve until the test has scraped
tel.close()
"""


def test_env_ranks_reads_torchrun_variables():
    assert env_ranks({}) == ProcessRanks(0, 0, 1)
    assert env_ranks({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == ProcessRanks(5, 1, 8)


@pytest.mark.parametrize("env, name", [({"RANK": "x"}, "RANK"), ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"),
                                       ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
                                       ({"RANK": "4", "WORLD_SIZE": "4"}, "WORLD_SIZE")])
def test_bad_environment_is_named(env, name):
    with pytest.raises(ConfigurationError, match=name):
        env_ranks(env)


def test_two_ranks_label_their_series_and_only_rank0_writes_tensorboard(tmp_path):
    tb = tmp_path / "tb"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(tb)], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        lines = [read_line(p, f"rank {rank}'s endpoint and trackers").split() for rank, p in enumerate(procs)]
        (url0, trackers0), (url1, *trackers1) = lines
        assert url0 != url1 and trackers0 == "tensorboard" and trackers1 == []
        for rank, url in ((0, url0), (1, url1)):
            text = scrape(url)
            labels = frozenset({("run", "ranks"), ("role", "trainer"), ("rank", str(rank)), ("stat", "mean")})
            assert samples(text, "rl_critic_score") == {labels: 10 * rank + 2}
            info = next(k for k in samples(text, "target_info"))
            assert ("rl_local_rank", str(rank)) in info and ("rl_world_size", "2") in info, info
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    assert [p.returncode for p in procs] == [0, 0]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    assert tensorboard_scalars(str(tb))["critic/score/mean"] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_a_port_is_a_base_offset_by_the_local_rank():
    """torchrun's ranks of one host given one port (explicit or the default 9464) each get their own: port +
    LOCAL_RANK, unless add_local_rank=False; port 0 (a free port) is never offset."""
    from rl_otel._internal.runtime.options import build_config
    from rl_otel._internal.runtime.ranks import serving_port

    assert [serving_port(9464, local_rank) for local_rank in range(3)] == [9464, 9465, 9466]
    assert serving_port(9464, 2, add_local_rank=False) == 9464
    assert serving_port(0, 2) == 0
    with pytest.raises(ConfigurationError, match="needs a base port"):
        serving_port(0, 2, add_local_rank=True)
    with pytest.raises(ConfigurationError, match="past 65535"):
        serving_port(65535, 1)

    def port(prometheus, local_rank):
        os.environ["LOCAL_RANK"] = str(local_rank)
        try:
            return build_config(run="r", rank=local_rank, role="trainer", prometheus=prometheus,
                                max_series_per_metric=1, max_unknown_keys=1, series_ttl_s=None).prometheus.port
        finally:
            del os.environ["LOCAL_RANK"]

    assert [port({"port": 9464}, r) for r in (0, 1)] == [9464, 9465]  # the README's example, two ranks
    assert [port(True, r) for r in (0, 1)] == [9464, 9465]  # the default port too
    assert port({"port": 9464, "add_local_rank": False}, 1) == 9464
    assert port({"port": 0}, 1) == 0


def test_a_launch_is_identified_by_its_launchers_store_one_token_per_launch():
    """torchrun's agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT for its launch: its ranks read one token there
    (on every node); a later launch on the same port - a new store - reads another, though its environment is
    the same (the issue: MASTER_ADDR:MASTER_PORT alone named both launches alike)."""
    dist = pytest.importorskip("torch.distributed")

    def env(rank: int, port: int) -> dict[str, str]:
        return {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the first launch's agent
    port = store.port
    first = [launch_identity(env(rank, port)) for rank in (0, 1)]
    assert first[0] == first[1] and first[0].startswith("store:")
    assert launch_identity(env(0, port)) == first[0]  # a restarted rank of the same launch: the same
    del store
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # the next launch, same port
    second = [launch_identity(env(rank, port)) for rank in (0, 1)]
    assert second[0] == second[1] != first[0]
    del store
    assert launch_identity({"WORLD_SIZE": "1"}) is None and launch_identity({}) is None


# A launcher without a store (no torch loaded, nothing at MASTER_PORT): it starts two ranks, which report their
# launch identity.
LAUNCHER = """
import json, os, subprocess, sys
env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], TORCHELASTIC_RUN_ID="none")
code = "from rl_otel._internal.runtime.ranks import launch_identity; print(launch_identity())"
print(json.dumps([subprocess.run([sys.executable, "-c", code], env={**env, "RANK": str(rank)}, capture_output=True,
                                 text=True, check=True).stdout.strip() for rank in (0, 1)]))
"""


def test_without_a_store_a_launch_is_its_launcher_process():
    """Two launches from two launcher processes, on the same master port: each launcher's ranks agree, the
    launches differ."""
    from tests.promtools import free_port

    port, env = str(free_port()), {**os.environ, "PYTHONPATH": str(ROOT)}
    launches = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", LAUNCHER, port], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        launches.append(json.loads(proc.stdout))
    (a0, a1), (b0, b1) = launches
    assert a0 == a1 and b0 == b1 and a0 != b0
    assert a0.startswith("launcher:") and f"127.0.0.1:{port}" in a0


def test_each_local_rank_searches_its_own_lane_of_ports():
    """A taken port moves only its rank: rank r of L on a host tries port + r + k*L, within port_search."""
    assert list(port_lane(9464, 0, 2, 100)) == list(range(9464, 9565, 2))
    assert [b + 1 for b in port_lane(9464, 1, 2, 4)] == [9465, 9467, 9469]
    assert list(port_lane(9464, 0, 1, 3)) == [9464, 9465, 9466, 9467]  # one process per host: the next ports
    assert list(port_lane(65530, 3, 4, 100)) == [65530]  # the port served (+ LOCAL_RANK) stays <= 65535
    assert list(port_lane(0, 1, 2, 100)) == [0]
