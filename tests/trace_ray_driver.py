"""A Ray job for tests/test_tracing_processes.py: the driver (trainer, rank 0) starts a local Ray cluster and two
actors (role ``actor_infer``) that each run a phase per step; the actors log no step, the driver's call tells them
(``phase(step=...)``, the way ROLL's workers get ``global_step`` in their data). The driver then exits without
closing the actors: Ray ends them, as it does when a training driver returns. Spans go over OTLP/HTTP to the
test's receiver.

The actors are threaded (``max_concurrency=2``, as ROLL's are): their methods do not run on the main thread.
``roll`` as a third argument makes the actors' Telemetry the one ROLL's workers get (``roll_phases``: no signal
handler, ``handle_sigterm=False``), never closed, whose exit skips the exit handlers registered before the
worker's own teardown (the issue's ROLL workers: killed by Ray mid-exit, rl_otel's and the OTel SDK's handlers never
ran; here a handler registered last ends the process at once).

Run as ``python tests/trace_ray_driver.py <traces URL> <run> [roll]``."""

from __future__ import annotations

import atexit
import os
import sys
import time

import ray

import rl_otel

STEPS = 2
ACTORS = 2


class Rollout:
    def __init__(self, run: str, url: str, rank: int, roll: bool) -> None:
        # roll: the options integrations.roll gives a worker's Telemetry (trace_roll_phases), never closed
        extra = {"handle_sigterm": False} if roll else {}
        self.tel = rl_otel.init(run=run, role="actor_infer", rank=rank, prometheus=False,
                                tracing={"exporter": "otlp", "endpoint": url}, **extra)
        if roll:  # ends the process before the exit handlers registered earlier (the OTel SDK's, rl_otel's) run
            atexit.register(os._exit, 0)

    def generate(self, step: int) -> int:
        with self.tel.phase("actor_infer", "generate", step=step):
            time.sleep(0.02)
        return os.getpid()


def main() -> None:
    url, run = sys.argv[1], sys.argv[2]
    roll = sys.argv[3:] == ["roll"]
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    tel = rl_otel.init(run=run, prometheus=False, tracing={"exporter": "otlp", "endpoint": url})
    actors = [ray.remote(num_cpus=0, max_concurrency=2)(Rollout).remote(run, url, rank, roll) for rank in range(ACTORS)]
    pids: set[int] = set()
    for step in range(STEPS):
        with tel.phase("driver", "rollout"):
            pids.update(ray.get([a.generate.remote(step) for a in actors]))
        tel.log({"actor/pg_loss": 0.5}, step=step)
    print("actor pids", *sorted(pids), flush=True)
    # no close, no ray.shutdown(): the process ends and Ray ends the actors, as after a training driver's return


if __name__ == "__main__":
    main()
