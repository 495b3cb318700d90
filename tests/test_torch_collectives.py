"""Issue 41 item 1: which rank is stuck. Three real gloo ranks; two wait inside an unwrapped ``dist.all_reduce``, the
third is blocked on a lock before its own. Each rank serves, from torch's flight recorder (no user code), how many
collectives it issued per process group and the one it is in now, since when; its stack dumps say the same. The
adapter (``probes/torch_collectives.py``) is checked against the real torch here: it fails when torch changes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.promtools import samples, scrape
from tests.test_watch_support import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

_RANK = textwrap.dedent("""
    import os, sys, threading
    import torch
    import torch.distributed as dist
    import rl_otel

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tel = rl_otel.init(run="hang", rank=rank, prometheus={"host": "127.0.0.1", "port": 0}, stack_dump_dir=out,
                       handle_sigterm=False, hang_min_s=None)
    print(tel.metrics_url, flush=True)
    t = torch.ones(4)
    with tel.phase("actor_train", "train_step"):
        dist.all_reduce(t)  # collective 1: every rank
    tel.log({"actor/pg_loss": 0.1}, step=1)
    never = threading.Lock()
    never.acquire()
    with tel.phase("actor_train", "train_step"):
        if rank == world - 1:
            never.acquire()  # the stuck rank: blocked before its all_reduce
        dist.all_reduce(t)  # collective 2: the others wait in it
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _when(state: tuple[dict, dict], part: int) -> tuple[dict, dict] | None:
    return state if state[part] else None


def _in_second(state: tuple[dict, dict]) -> tuple[dict, dict] | None:
    return state if state[1] and set(state[0].values()) == {2.0} else None


def _all(found: list[Path], n: int) -> list[Path] | None:
    return found if len(found) == n else None


def test_the_ranks_in_a_collective_and_the_one_not_in_it_are_told_apart(tmp_path):
    world, port = 3, _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(world), str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for r in range(world)]
    try:
        urls = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("http://"), (line, proc.stderr.read() if proc.poll() is not None else "")
            urls.append(line)

        def state(url: str) -> tuple[dict, dict]:
            text = scrape(url)
            return samples(text, "rl_collectives_total"), samples(text, "rl_collective_started_timestamp_seconds")

        world_group = frozenset({("group", "0:default_pg")})
        for rank, url in enumerate(urls[:-1]):  # the waiting ranks: in collective 2, since it was enqueued
            issued, started = wait_for(lambda url=url: _in_second(state(url)), 120,
                                       "a waiting rank in collective 2, in its series")
            [(labels, since)] = started.items()
            assert dict(labels) == {"group": "0:default_pg", "op": "gloo:all_reduce", "run": "hang",
                                    "role": "trainer", "rank": str(rank)}, labels
            assert time.time() - 300 < since <= time.time()
        issued, started = wait_for(lambda: _when(state(urls[-1]), 0), 60, "the stuck rank's series")
        assert list(issued.values()) == [1.0] and started == {}  # one collective behind, and in none
        assert world_group <= next(iter(issued))

        for proc in procs:  # each rank's dump says where it is
            os.kill(proc.pid, signal.SIGUSR1)
        dumps = wait_for(lambda: _all(sorted(tmp_path.glob("stacks-*-signal-*.txt")), world), 120,
                         "a dump from every rank")
        texts = {int(p.name.split("-rank")[1].split("-")[0]): p.read_text() for p in dumps}
        for rank in range(world - 1):
            assert "process group 0:default_pg: 2 collectives issued; in collective #2 (gloo:all_reduce)" \
                in texts[rank]
        assert "process group 0:default_pg: 1 collectives issued; in no collective of it" in texts[world - 1]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.communicate(timeout=60)


def test_without_torch_distributed_nothing_is_served_and_torch_is_not_imported():
    code = ("import sys, rl_otel\n"
            "tel = rl_otel.init(run='x', prometheus=False, handle_sigterm=False)\n"
            "tel.log({'actor/pg_loss': 1.0}, step=1)\n"
            "from rl_otel._internal.probes.torch_collectives import groups_now\n"
            "assert groups_now() is None and tel.value('rl_collectives_total', group='0:default_pg') is None\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "tel.close(); print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
