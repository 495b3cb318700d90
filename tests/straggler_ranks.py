"""A real multi-process CPU training run with one slow rank, for the straggler tests and for feeding a real
Prometheus (and ``promtool``) with what its ranks serve.

``start_ranks()`` spawns ``world_size`` processes joined by ``torch.distributed`` (gloo, loopback). Each rank runs
``rl_otel.init()`` with its own endpoint (port 0), then, every step, in the phase ``actor_train/train_step``:
computes (64x64 matmuls for ``compute_s`` of wall time; ``slow_factor`` times that on ``slow_rank``), then
all-reduces a gradient inside ``tel.collective("allreduce")``, and logs the step. The all-reduce equalises the
phase's duration across ranks (the trap: the raw phase times look alike), while the compute and wait counters tell
the slow rank from the ranks waiting for it::

    from tests.straggler_ranks import start_ranks

    with start_ranks(slow_rank=2) as ranks:    # 4 ranks, stepping until stopped
        ranks.urls                               # one metrics URL per rank, rank 0 first
        ranks.wait_for_step(30)                  # optional: until every rank has logged step 30
    # leaving the block (or ranks.stop()) stops every rank together and waits for them to exit

With ``file_sd=DIR`` each rank also writes a Prometheus ``file_sd`` targets file there (a real Prometheus can
discover them). The ranks stop stepping together (the stop flag rides on the all-reduce, so no rank is left
blocked in a collective), keep serving until ``stop()``, then close cleanly.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

SLOW_RANK = 1
RUN = "stragglers"


@dataclass
class Ranks:
    """The running ranks: ``urls`` and ``pids`` in rank order; :meth:`stop` ends them all (idempotent)."""

    urls: list[str]
    pids: list[int]
    run: str
    slow_rank: int
    _processes: list[Any] = field(repr=False)
    _stop: Any = field(repr=False)

    def wait_for_step(self, step: int, timeout_s: float = 120.0) -> None:
        """Until every rank serves ``rl_step`` >= ``step`` (a condition, polled; fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        for url, process in zip(self.urls, self._processes, strict=True):
            while _served_step(url) < step:
                if not process.is_alive():
                    raise RuntimeError(f"rank at {url} exited with {process.exitcode} before step {step}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} did not reach step {step} in {timeout_s} s")
                time.sleep(0.05)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop stepping (all ranks at the same step), close every rank's Telemetry and wait for them to exit."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for process in self._processes:
            process.join(max(0.1, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():  # a wedged rank: never leave it behind
                process.kill()
                process.join(5)

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _served_step(url: str) -> float:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return -1.0
    for line in text.splitlines():
        if line.startswith("rl_step{"):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world_size: int = 4, *, slow_rank: int = SLOW_RANK, slow_factor: float = 2.0,
                compute_s: float = 0.05, steps: int | None = None, run: str = RUN, host: str = "127.0.0.1",
                file_sd: str | None = None, timeout_s: float = 180.0) -> Ranks:
    """Spawn the ranks and return once each serves its endpoint. ``steps``: how many steps each runs before it
    only serves (``None``: until :meth:`Ranks.stop`)."""
    if not 0 <= slow_rank < world_size:
        raise ValueError(f"slow_rank must be in [0, {world_size}), got {slow_rank}")
    ctx = mp.get_context("spawn")  # a fresh interpreter per rank, as torchrun would start it
    queue, stop = ctx.Queue(), ctx.Event()
    conf = {"world_size": world_size, "slow_rank": slow_rank, "slow_factor": slow_factor, "compute_s": compute_s,
            "steps": steps, "run": run, "host": host, "file_sd": file_sd, "port": _free_port()}
    processes = [ctx.Process(target=_rank_main, args=(rank, conf, queue, stop), name=f"rank{rank}", daemon=True)
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    urls: dict[int, tuple[str, int]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(urls) < world_size:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with {dead[0].exitcode} before serving")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(urls)} of {world_size} ranks served within {timeout_s} s")
            try:
                rank, url, pid = queue.get(timeout=0.5)
            except Exception:  # queue.Empty: poll the processes again
                continue
            urls[rank] = (url, pid)
    except BaseException:
        stop.set()
        for process in processes:
            process.kill()
            process.join(5)
        raise
    return Ranks([urls[r][0] for r in range(world_size)], [urls[r][1] for r in range(world_size)], run, slow_rank,
                 processes, stop)


def _rank_main(rank: int, conf: dict[str, Any], queue: Any, stop: Any) -> None:
    """One rank (in a spawned process)."""
    world_size = conf["world_size"]
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    import torch
    import torch.distributed as dist

    import rl_otel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{conf['port']}", rank=rank,
                            world_size=world_size)
    prometheus: dict[str, Any] = {"host": conf["host"], "port": 0}
    if conf["file_sd"]:
        prometheus["file_sd"] = conf["file_sd"]
    tel = rl_otel.init(run=conf["run"], prometheus=prometheus, handle_sigterm=False)
    queue.put((rank, tel.metrics_url, os.getpid()))
    budget = conf["compute_s"] * (conf["slow_factor"] if rank == conf["slow_rank"] else 1.0)
    weights = torch.randn(64, 64) / 8
    grad = torch.zeros(256)
    step, steps = 0, conf["steps"]
    try:
        while steps is None or step < steps:
            with tel.phase("actor_train", "train_step", step=step):
                deadline = time.perf_counter() + budget
                x = torch.randn(64, 64)
                while time.perf_counter() < deadline:  # busy: the slow rank's work simply takes longer
                    x = torch.tanh(x @ weights)
                grad.fill_(float(x.mean()))
                grad[0] = 1.0 if stop.is_set() else 0.0  # every rank learns of a stop at the same step
                with tel.collective("allreduce"):
                    dist.all_reduce(grad)
            tel.log({"actor/pg_loss": float(grad[1]) / world_size, "actor/grad_norm": float(grad.norm())},
                    step=step)
            step += 1
            if grad[0] > 0:
                break
        stop.wait()
    finally:
        tel.close()
        dist.destroy_process_group()
