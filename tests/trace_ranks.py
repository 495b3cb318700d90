"""A torchrun training script for tests/test_tracing_processes.py: two gloo ranks, three steps, phases that are
never told their step (the step is the one each rank logs), spans pushed over OTLP/HTTP to the test's receiver.

Run as ``torchrun --nproc_per_node=2 tests/trace_ranks.py <traces URL> <run> <first step>``."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import rl_otel


def main() -> None:
    url, run, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    tel = rl_otel.init(run=run, prometheus=False, tracing={"exporter": "otlp", "endpoint": url})
    grad = torch.ones(64)
    for step in range(first, first + 3):
        with tel.phase("actor_infer", "generate"):
            torch.randn(64, 64) @ torch.randn(64, 64)
        with tel.phase("actor_train", "train_step"), tel.collective("allreduce"):
            dist.all_reduce(grad)
        tel.log({"actor/pg_loss": float(grad[0])}, step=step)
    dist.barrier()
    tel.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
