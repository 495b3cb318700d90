"""``rl-otel watch``'s cost: values followed per second per % of one core, and peak memory.

    python benchmarks/bench_watch.py [--steps 20000] [--keys 10] [--rate 2000]

Three figures, each in a child process of its own (so the peak RSS is the watcher's alone, and the CPU time is
the child's: every thread of it):

- ``backlog``: an event file of ``steps`` x ``keys`` scalars, one Event per value as torch's ``SummaryWriter``
  writes them (TFRecord framing by rl_otel's own writer, TensorBoard's protos), read from its start to its end:
  values/s, CPU %, and values/s per % of one core.
- ``backlog-jsonl``: the same values as JSONL lines (one line per step).
- ``follow``: a writer appends ``rate`` values/s for a few seconds while the watcher follows at its default poll
  (0.5 s): the watcher's CPU % of one core at that rate (what a sidecar costs beside a training).

A benchmark module of ``run.py``'s kind: :func:`rows` gives the figures (for information: no target).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row

KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl",
        "response_length/mean", "timing_s/gen", "timing_s/update_actor", "perf/throughput", "my/custom_metric")


def _keys(n: int) -> list[str]:
    return [KEYS[i] if i < len(KEYS) else f"my/extra_{i}" for i in range(n)]


def write_events(path: Path, steps: range, keys: list[str], append: bool = False) -> int:
    """Events as torch's SummaryWriter writes scalars (one Event per add_scalar); returns the values written."""
    from tensorboard.compat.proto.event_pb2 import Event

    from rl_otel._internal.tfrecord import encode as record

    chunks = [] if append else [record(Event(file_version="brain.Event:2", wall_time=time.time()).SerializeToString())]
    for step in steps:
        for i, key in enumerate(keys):
            e = Event(step=step, wall_time=time.time())
            e.summary.value.add(tag=key, simple_value=(step * 0.001 + i) % 7)
            chunks.append(record(e.SerializeToString()))
    with open(path, "ab" if append else "wb") as f:
        f.write(b"".join(chunks))
        f.flush()
    return len(steps) * len(keys)


def write_jsonl(path: Path, steps: range, keys: list[str]) -> int:
    with open(path, "a") as f:
        for step in steps:
            f.write(json.dumps({"step": step, **{k: (step * 0.001 + i) % 7 for i, k in enumerate(keys)}}) + "\n")
    return len(steps) * len(keys)


def _child(mode: str, root: str, total: int, last_step: int) -> dict:
    """In the child: follow ``root`` until ``rl_step`` is ``last_step``; CPU and wall seconds, peak RSS."""
    import threading

    from rl_otel.watch.served import ServeOptions
    from rl_otel.watch.watcher import Watcher, WatchOptions

    t_wall, t_cpu = time.perf_counter(), time.process_time()
    w = Watcher([root], WatchOptions(serve=ServeOptions(host="127.0.0.1", port=0)))
    stop = threading.Event()
    if mode == "follow":
        thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
        thread.start()
        print("ready", flush=True)
        sys.stdin.readline()  # the parent has written everything
        while not any(t.state.step == last_step for t in w.runs.values()):
            time.sleep(0.05)
        stop.set()
        thread.join()
    else:
        while not any(t.state.step == last_step for t in w.runs.values()):
            if not w.poll():
                time.sleep(0.01)
    wall, cpu = time.perf_counter() - t_wall, time.process_time() - t_cpu
    w.close()
    return {"values": total, "wall_s": wall, "cpu_s": cpu,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run(mode: str, steps: int, keys: int, rate: float) -> dict:
    names = _keys(keys)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "exp"
        run.mkdir()
        cmd = [sys.executable, __file__, "--child", mode, "--root", tmp, "--last", str(steps - 1),
               "--total", str(steps * keys)]
        if mode == "backlog":
            write_events(run / "events.out.tfevents.1.bench", range(steps), names)
        elif mode == "backlog-jsonl":
            write_jsonl(run / "metrics.jsonl", range(steps), names)
        if mode != "follow":
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
            return json.loads(out.splitlines()[-1])
        path = run / "events.out.tfevents.1.bench"
        write_events(path, range(1), names)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()
        per_step = 1.0 / (rate / keys)
        start = time.perf_counter()
        for step in range(1, steps):  # one step's values at a time, at the rate asked
            write_events(path, range(step, step + 1), names, append=True)
            delay = start + step * per_step - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.read().splitlines()[-1])
        proc.wait(60)
        return result


def _figures(result: dict) -> dict:
    cpu_pct = 100 * result["cpu_s"] / result["wall_s"]
    return {**result, "values_per_s": result["values"] / result["wall_s"], "cpu_pct": cpu_pct,
            "values_per_s_per_pct_core": result["values"] / result["cpu_s"] / 100}


def rows(quick: bool = False) -> list[Row]:
    """Values/s per % of one core (backlog: TensorBoard, JSONL), CPU % while following, peak RSS."""
    steps = 2_000 if quick else 20_000
    out = []
    for mode in ("backlog", "backlog-jsonl"):
        f = _figures(_run(mode, steps, 10, 0))
        out.append(Row(f"watch {mode}: values/s per % of one core", f["values_per_s_per_pct_core"], 0.0,
                       "values/s/%", "information", None))
        out.append(Row(f"watch {mode}: peak RSS", f["peak_rss_mib"], 0.0, "MiB", "information", None))
    f = _figures(_run("follow", 200 if quick else 1_000, 10, 2_000))
    out.append(Row("watch follow at 2000 values/s: CPU % of one core", f["cpu_pct"], 0.0, "%", "information", None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--rate", type=float, default=2_000.0, help="values/s written in the follow run")
    parser.add_argument("--follow-steps", type=int, default=1_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--last", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.root, args.total, args.last)), flush=True)
        return
    print(f"{'mode':<14} {'values':>9} {'wall s':>7} {'CPU s':>7} {'values/s':>10} {'CPU %':>6} "
          f"{'values/s per %core':>19} {'peak RSS MiB':>13}")
    for mode, steps in (("backlog", args.steps), ("backlog-jsonl", args.steps), ("follow", args.follow_steps)):
        f = _figures(_run(mode, steps, args.keys, args.rate))
        print(f"{mode:<14} {f['values']:>9} {f['wall_s']:>7.2f} {f['cpu_s']:>7.2f} {f['values_per_s']:>10.0f} "
              f"{f['cpu_pct']:>6.1f} {f['values_per_s_per_pct_core']:>19.0f} {f['peak_rss_mib']:>13.1f}")
    print(f"(one Event per value as SummaryWriter writes them; follow: {args.rate:.0f} values/s written for "
          f"{args.follow_steps * args.keys / args.rate:.0f} s, polled every 0.5 s; os.cpu_count()={os.cpu_count()})")


if __name__ == "__main__":
    main()
