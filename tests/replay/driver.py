"""Replay a recorded run (``run.jsonl``) through rl_otel's public API and write what a user sees, byte for byte.

Issue 40's proof that a restructuring changes no behaviour: the same run replayed on the code before and after
gives the same scrapes and the same tracker output. ``tests/test_replay.py`` runs this driver in a fresh process
and compares every file it writes with ``tests/replay/expected/``.

Regenerating the golden files (the driver runs the rl_otel found on ``PYTHONPATH``)::

    PYTHONPATH=$PWD python tests/replay/driver.py --out tests/replay/expected

They change only when behaviour changes on purpose, in the same commit as that change (its message saying why);
a restructuring leaves them as they are.

What it writes into ``--out``:

- ``scrape_<name>.prom`` / ``scrape_<name>.om``: the body of ``GET /metrics`` over real HTTP from the process's own
  endpoint (127.0.0.1, a free port), in the Prometheus text format and in OpenMetrics (``Accept`` header), at each
  ``scrape`` event of the run and at its end (``final``), each after ``flush()``; the families of
  :data:`MACHINE_FAMILIES` left out.
- ``stdout_json.txt``: the stdout tracker's ``metrics_tag:`` JSON lines (``format="json"`` into a file).
- ``sink_calls.txt``: every call the trackers' bridge makes on a sink (a sink registered with
  ``rl_otel.register_sink``): step, then each key, its type and its exact value (``repr``; arrays with their dtype).
- ``tensorboard.txt``: the TensorBoard event file read back with TensorBoard's own loader: per event its
  ``wall_time``, ``step`` and each value's tag with its scalar or histogram.
- ``values.txt``: what ``tel.value()`` answered at the run's ``value`` events (and the phases whose body raised).
- ``log.txt``: the records of the ``rl_otel`` logger (what the library says once, on bad input and failures).

Determinism. The clocks rl_otel reads for what it serves - ``time.time``, ``time.time_ns``, ``time.perf_counter``,
``time.perf_counter_ns`` - are replaced by :class:`FakeClock` before rl_otel is imported (its modules that do
``from time import perf_counter`` bind the fake one). The clock moves only when the driver moves it: 1 s before
each top-level event, and inside a phase by the seconds its event gives (onload, body, offload), so every
duration, timestamp and goodput second is exact. Each top-level event, and each event of a phase's body, ends with
``tel.flush()``, so no background thread (the metrics worker, the trackers' bridge writing TensorBoard's
``wall_time``) reads the clock after it moved on; the events issued while a submitted job is held (its
``while_pending``) move no clock. ``time.monotonic`` stays real: rl_otel waits on it for deadlines (the submit
worker's queue, the bridge's close, the HTTP server's timeouts) and the endpoint uses it only to share one rendering
between concurrent scrapes; nothing served or mirrored is read from it. The process's start time
(``psutil.Process.create_time``, where goodput's start-up begins) is pinned to 5 s before the fake clock's start.
Options that would add the machine or chance: the host name and instance id given as ``resource`` attributes,
``stack_dump_signal=None``, ``stack_dump_http=False``, ``hang_min_s=None`` (no stack dumps), ``handle_sigterm=False``,
``otlp=False``, ``engines=False``, ``phase_memory=False`` (no memory snapshots, whose values are the machine's). torch
runs on one CPU thread, and ``CUDA_VISIBLE_DEVICES`` is empty: no GPU family (torch's allocator, NVML) and no GPU
time, on a machine with GPUs as without. Tracing is off: span and trace ids are random.

The golden files also hold what the test environment's packages make: ``target_info``'s
``telemetry_sdk_version`` (opentelemetry-sdk), ``ppo_stats``' float digits (torch). A change of those versions is
a reason to regenerate them, said so in the commit.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUN = HERE / "run.jsonl"

# Families whose values are the machine's or the moment's, left out of the scrapes (every other line stays, byte
# for byte). Each with its reason:
MACHINE_FAMILIES = frozenset({
    "rl_process_resident_memory_bytes",  # psutil's RSS of this process at scrape time
    "rl_process_virtual_memory_bytes",  # psutil's VMS of this process at scrape time
})

EPOCH_NS = 1_700_000_000_000_000_000  # the fake Unix time at start: 2023-11-14T22:13:20Z
PERF0_NS = 1_000_000_000_000  # the fake perf_counter at start: 1000 s
PROCESS_START_S = EPOCH_NS / 1e9 - 5.0  # the process "started" 5 s before the clock's start: 5 s of start-up
OUTPUTS = ("stdout_json.txt", "sink_calls.txt", "tensorboard.txt", "values.txt", "log.txt")  # and scrape_*
GATE_TIMEOUT_S = 30.0  # a submitted job waits this long at most for the driver to release it


class FakeClock:
    """The Unix time and ``perf_counter`` the driver moves explicitly, in integer nanoseconds (exact sums)."""

    def __init__(self) -> None:
        self.elapsed_ns = 0
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.elapsed_ns += round(seconds * 1e9)

    def time_ns(self) -> int:
        return EPOCH_NS + self.elapsed_ns

    def time(self) -> float:
        return self.time_ns() / 1e9

    def perf_counter_ns(self) -> int:
        return PERF0_NS + self.elapsed_ns

    def perf_counter(self) -> float:
        return self.perf_counter_ns() / 1e9


CLOCK = FakeClock()


def install_clock() -> None:
    """Before rl_otel (and torch, tensorboard) are imported: the fake clock, one CPU thread, a pinned process start,
    none of the environment variables that change what rl_otel does."""
    time.time, time.time_ns = CLOCK.time, CLOCK.time_ns
    time.perf_counter, time.perf_counter_ns = CLOCK.perf_counter, CLOCK.perf_counter_ns
    for name in list(os.environ):
        if name.startswith(("OTEL_", "WANDB_", "RL_OTEL_", "SWANLAB_")) or name in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                "PROMETHEUS_MULTIPROC_DIR", "RAY_ADDRESS"):
            del os.environ[name]
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU for torch nor NVML: the same run on a machine with GPUs
    import psutil

    psutil.Process.create_time = lambda self: PROCESS_START_S  # type: ignore[method-assign]


# -- the run's submitted functions (named by the run's "submit" events) ------------------------------------------

def stats_dict(values: dict[str, Any]) -> dict[str, Any]:
    """Returns its dict as it is (nested dicts and all)."""
    return values


def ppo(seed: int, batch: int, length: int) -> dict[str, Any]:
    """``rl_otel.stats.ppo_stats`` of fixed tensors (a seeded generator), ROLL's names, with distributions."""
    import torch

    from rl_otel.stats import ppo_stats

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    new = old + (torch.rand(batch, length, generator=g, dtype=torch.float64) - 0.5) * 0.2
    ref = old + (torch.rand(batch, length, generator=g, dtype=torch.float64) - 0.5) * 0.1
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    adv = torch.randn(batch, length, generator=g, dtype=torch.float64)
    scores = torch.randn(batch, generator=g, dtype=torch.float64)
    return ppo_stats(log_probs=new, old_log_probs=old, ref_log_probs=ref, response_mask=mask, advantages=adv,
                     scores=scores, distributions=True)


def raises(message: str) -> dict[str, Any]:
    """A user's function that fails: counted and said once, the training goes on."""
    raise RuntimeError(message)


FUNCTIONS = {"stats_dict": stats_dict, "ppo": ppo, "raises": raises}


# -- reading the run ----------------------------------------------------------------------------------------------

def metrics_of(event: dict[str, Any]) -> dict[str, Any]:
    """A log event's metrics: ``metrics`` as given (JSON's NaN/Infinity included), ``tensors`` as 1-d float32 torch
    tensors, ``arrays`` as float64 numpy arrays, ``scalars`` as 0-d float32 torch tensors, ``numpy`` as numpy float32
    scalars."""
    import numpy as np
    import torch

    metrics = dict(event.get("metrics", {}))
    for key, value in event.get("scalars", {}).items():
        metrics[key] = torch.tensor(value, dtype=torch.float32)
    for key, value in event.get("numpy", {}).items():
        metrics[key] = np.float32(value)
    for key, values in event.get("tensors", {}).items():
        metrics[key] = torch.tensor(values, dtype=torch.float32)
    for key, values in event.get("arrays", {}).items():
        metrics[key] = np.asarray(values, dtype=np.float64)
    return metrics


class PhaseBodyError(Exception):
    """What a phase body of the run raises (``"raises"``), caught by the driver once it has left the phase."""


class Replay:
    """Runs the events on one Telemetry and writes the outputs."""

    def __init__(self, tel: Any, out: Path) -> None:
        self.tel, self.out = tel, out
        self.values: list[str] = []
        self.gate = threading.Event()

    def top(self, event: dict[str, Any]) -> None:
        CLOCK.advance(1.0)
        self.run(event)
        self.flush(event)

    def flush(self, event: dict[str, Any]) -> None:
        """Before the clock moves on: no background thread reads it after that."""
        if not self.tel.flush(timeout_s=30.0):
            raise RuntimeError(f"flush() did not finish within 30 s after {event}")

    def run(self, event: dict[str, Any]) -> None:
        op = event["op"]
        getattr(self, f"op_{op}")(event)

    def op_log(self, event: dict[str, Any]) -> None:
        self.tel.log(metrics_of(event), event.get("step"), wait_for_trackers=event.get("wait_for_trackers", False))

    def op_advance(self, event: dict[str, Any]) -> None:
        CLOCK.advance(event["seconds"])

    def op_submit(self, event: dict[str, Any]) -> None:
        fn = FUNCTIONS[event["fn"]]
        pending = event.get("while_pending", [])
        gate = threading.Event()

        def job(**kwargs: Any) -> Any:
            if pending and not gate.wait(GATE_TIMEOUT_S):  # held so that the pending events queue behind it
                raise RuntimeError("the driver did not release the job")
            return fn(**kwargs)

        job.__qualname__ = job.__name__ = fn.__name__  # rl_otel names the function in what it says
        future = self.tel.submit(job, step=event.get("step"), **event.get("kwargs", {}))
        for inner in pending:
            self.run(inner)
        gate.set()
        future.exception(timeout=GATE_TIMEOUT_S)  # done (its result or fn's exception): bounded

    def op_phase(self, event: dict[str, Any]) -> None:
        onload = (lambda: CLOCK.advance(event["onload_s"])) if "onload_s" in event else None
        offload = (lambda: CLOCK.advance(event["offload_s"])) if "offload_s" in event else None
        kwargs = {k: event[k] for k in ("step", "bucket", "memory", "policy_step") if k in event}
        try:
            with self.tel.phase(event["cluster"], event["phase"], onload=onload, offload=offload, **kwargs):
                for inner in event.get("body", []):
                    self.run(inner)
                    self.flush(inner)
                CLOCK.advance(event.get("seconds", 0.0))
                if event.get("raises"):  # the user's code fails: it propagates, the phase records no metrics
                    raise PhaseBodyError(event["raises"])
        except PhaseBodyError as exc:
            self.values.append(f"phase {event['cluster']}/{event['phase']} raised {exc}")

    def op_collective(self, event: dict[str, Any]) -> None:
        with self.tel.collective(event["point"]):
            CLOCK.advance(event["seconds"])

    def op_value(self, event: dict[str, Any]) -> None:
        got = self.tel.value(event["key"], **event.get("labels", {}))
        self.values.append(f"{event['key']} {json.dumps(event.get('labels', {}), sort_keys=True)} -> {got!r}")

    def op_scrape(self, event: dict[str, Any]) -> None:
        self.scrape(event["name"])

    def scrape(self, name: str) -> None:
        url = self.tel.metrics_url
        for suffix, accept in ((".prom", None), (".om", "application/openmetrics-text; version=1.0.0")):
            request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read().decode()
            (self.out / f"scrape_{name}{suffix}").write_text(without_machine_families(body), encoding="utf-8")


def without_machine_families(body: str) -> str:
    """The exposition without the lines of :data:`MACHINE_FAMILIES` (their ``# HELP``/``# TYPE``/``# UNIT`` lines
    and their samples, which follow them)."""
    kept, family = [], None
    for line in body.splitlines(keepends=True):
        if line.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
            family = line.split(" ", 3)[2]
        elif line.startswith("# EOF"):
            family = None
        if family not in MACHINE_FAMILIES:
            kept.append(line)
    return "".join(kept)


# -- the trackers' output -----------------------------------------------------------------------------------------

def exact(value: Any) -> str:
    """A value as the sink got it: its type and its exact digits."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"ndarray[{value.dtype}]{[float(v) for v in value.tolist()]!r}"
    if isinstance(value, float) and math.isnan(value):
        return "float nan"
    return f"{type(value).__name__} {value!r}"


class RecordingSink:
    """A tracker (``rl_otel.register_sink("replay", ...)``) writing every call the bridge makes on it."""

    def __init__(self, *, run: str, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close(), as a sink is

    def log(self, metrics: Any, step: int) -> None:
        lines = [f"step {step!r} ({len(metrics)} keys)"] + [f"  {k!r}: {exact(v)}" for k, v in metrics.items()]
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.write("close\n")
        self._file.close()


def dump_tensorboard(log_dir: Path) -> str:
    """Every event of the run's event file(s), read with TensorBoard's own loader, as text."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    files = sorted(p for p in log_dir.iterdir() if ".tfevents." in p.name)
    lines = [f"{len(files)} event file(s)"]
    for path in files:
        for event in LegacyEventFileLoader(str(path)).Load():
            head = f"wall_time={event.wall_time!r} step={event.step}"
            if event.HasField("file_version"):
                lines.append(f"{head} file_version={event.file_version!r}")
                continue
            lines.append(f"{head} values={len(event.summary.value)}")
            for v in event.summary.value:
                if v.HasField("histo"):
                    h = v.histo
                    lines.append(f"  {v.tag!r} histo min={h.min!r} max={h.max!r} num={h.num!r} sum={h.sum!r} "
                                 f"sum_squares={h.sum_squares!r} limits={list(h.bucket_limit)!r} "
                                 f"counts={list(h.bucket)!r}")
                else:
                    lines.append(f"  {v.tag!r} simple_value={v.simple_value!r}")
    return "\n".join(lines) + "\n"


# -- the run ------------------------------------------------------------------------------------------------------

def replay(out: Path, work: Path) -> None:
    import torch

    torch.set_num_threads(1)
    import rl_otel

    log_lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log_lines.append(f"{record.levelname} {record.getMessage()}")

    logger = logging.getLogger("rl_otel")
    logger.addHandler(Collect(level=logging.DEBUG))
    logger.setLevel(logging.INFO)

    rl_otel.register_sink("replay", RecordingSink)
    events = [json.loads(line) for line in RUN.read_text(encoding="utf-8").splitlines() if line.strip()]
    tel = rl_otel.init(
        run="replay", rank=0, role="trainer",
        prometheus={"host": "127.0.0.1", "port": 0},
        trackers=[{"name": "stdout", "file": str(work / "stdout.txt"), "format": "json"},
                  {"name": "tensorboard", "log_dir": str(work / "tb")},
                  {"name": "replay", "path": str(out / "sink_calls.txt")}],
        resource={"host.name": "replay-host", "service.instance.id": "replay-host/replay/trainer/0"},
        handle_sigterm=False, otlp=False, engines=False, hang_min_s=None, stack_dump_signal=None,
        stack_dump_http=False, stack_dump_dir=str(work / "dumps"), phase_memory=False)
    r = Replay(tel, out)
    for event in events:
        r.top(event)
    CLOCK.advance(1.0)
    r.scrape("final")
    tel.close()
    # after close(): what is still served is read back; a log() is ignored (said once), a submit() refused
    r.op_value({"key": "rl_run_finished"})
    tel.log({"critic/score/mean": 9.0})
    r.op_value({"key": "critic/score/mean"})
    refused = tel.submit(stats_dict, values={"critic/score/mean": 9.5})
    error = refused.exception(timeout=GATE_TIMEOUT_S)
    r.values.append(f"submit() after close(): {type(error).__name__}: {error}")
    (out / "values.txt").write_text("\n".join(r.values) + "\n", encoding="utf-8")
    shutil.copyfile(work / "stdout.txt", out / "stdout_json.txt")
    (out / "tensorboard.txt").write_text(dump_tensorboard(work / "tb"), encoding="utf-8")
    (out / "log.txt").write_text("".join(f"{line}\n" for line in log_lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the directory the outputs are written to")
    args = parser.parse_args(argv)
    install_clock()
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.iterdir():  # an earlier run's outputs (a scrape this run no longer takes): nothing else
        if stale.is_file() and (stale.name in OUTPUTS or stale.name.startswith("scrape_")):
            stale.unlink()
    with tempfile.TemporaryDirectory(prefix="rl_otel_replay_") as work:
        replay(args.out, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
