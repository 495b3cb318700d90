"""rl_otel on a GPU process, against what runs there without it: one script, one GPU, a few minutes.

    python benchmarks/bench_gpu.py [--quick] [--rounds 7] [--check]

1. **Phase cost** (target <= 50 us): ``tel.phase()`` around an empty body in a process using CUDA - one allocator
   read per snapshot and the CUDA events of its GPU times - against the old way (16 whole
   ``torch.cuda.memory_stats()`` dicts a phase, no GPU times) measured beside it; with ``onload``/``offload`` too,
   and, for information, the parts: one allocator read each way, one ``Event.record``.
2. **Step overhead** (target: everything <= 1.01x) against a bare ~50 ms GPU training step (six bf16 4096x4096
   linear layers, forward, backward, AdamW, ``loss.item()``): ``init()`` alone, the phase alone (and the old phase),
   a 285-key ROLL-shaped ``log()`` (``bench_bridge.roll_step_keys`` and ROLL's statistics keys), + the TensorBoard
   mirror, + a scrape a second, everything; and the TensorBoard way (ROLL-style bookkeeping with its GPU memory
   reads, ``SummaryWriter.add_scalar`` per key). Interleaved rounds in one process: each round runs every
   variant's steps with only its own Telemetry alive (built before, closed after, both untimed); the ratio is the
   median over rounds of (variant / bare) in the same round.
3. **GPU vs host phase time** (target: GPU ``execute`` within 5% of CUDA events around the same kernels): a
   ``generate`` phase of 60 bf16 8192x8192 matmuls, and a phase with ``onload``/``offload`` moving a model onto the
   GPU and back around matmuls; the host's parts beside them for information.
4. **ppo_stats** wall time and kernels against the frameworks' metric code: ``bench_stats.gpu_comparison("cuda")``
   (the statistics' own benchmark) where it exists.
5. **First do no harm** (issue 39), each a pass/fail row: a torch-importing process that never used CUDA stays
   without a context through ``init()``, phases, a ``log()`` and scrapes (``torch.cuda.is_initialized()`` and NVML's
   list of the GPUs' compute processes, in a child process); ``torch.cuda.max_memory_allocated()`` unchanged by
   phases with ``phase_peaks=False`` and, with the default, by nested phases inside an outer one; 10 of 10 CUDA-graph
   captures (global mode, the default) succeed right after phases whose GPU work is still pending; the host syncs
   of a 50-key ``log()`` of CUDA scalars, counted with ``torch.cuda.set_sync_debug_mode("warn")`` (target 1);
   the cost of a ``phase(..., memory=False)`` (events only, target <= 50 us).

Without a CUDA device it says so and exits 0, measuring nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row, ab_rounds, table

PHASE_TARGET_US = 50.0
OVERHEAD_TARGET = 1.01
GPU_TIME_TOLERANCE = 0.05
STEP_MS = 50.0
# the workloads' sizes and device (module constants, so a dry run of the script's logic can shrink them)
DEVICE = "cuda"
LAYER = 4096  # the step's six linear layers, LAYER x LAYER
MATMUL = 8192  # the generate phase's matmuls, MATMUL x MATMUL
MATMULS = 60
MODEL_TENSORS = 64  # the offloaded model: this many LAYER x LAYER bf16 tensors (64: 2 GiB)


def cuda_torch() -> Any | None:
    """torch, if it is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# -- the old way, kept here as the baseline ---------------------------------------------------------------------


def legacy_probe() -> Any:
    """A GpuProbe that snapshots as phases did before (3124f14): the four public functions per stage, each a whole
    ``memory_stats()`` dict, every stage read afresh."""
    from rl_otel._internal.probes.memory import GIB, GpuProbe

    class LegacyGpuProbe(GpuProbe):
        def snapshot(self, infix: str, stage: str, out: dict[str, float], *, with_frac: bool = False,
                     reading: Any = None, at_start: bool = False) -> None:
            cuda = self.cuda()
            if cuda is None:
                return None
            device = cuda.current_device()
            allocated, reserved = cuda.memory_allocated(device), cuda.memory_reserved(device)
            max_allocated, max_reserved = cuda.max_memory_allocated(device), cuda.max_memory_reserved(device)
            prefix = f"memory/{infix}/{stage}/"
            out[f"{prefix}allocated/{device}"] = allocated / GIB
            out[f"{prefix}reserved/{device}"] = reserved / GIB
            out[f"{prefix}max_allocated/{device}"] = max_allocated / GIB
            out[f"{prefix}max_reserved/{device}"] = max_reserved / GIB
            if with_frac:
                total = float(cuda.get_device_properties(device).total_memory)
                out[f"{prefix}max_allocated_frac/{device}"] = max_allocated / total
                out[f"{prefix}max_reserved_frac/{device}"] = max_reserved / total
            return None  # no reading to share: the next stage reads again

    return LegacyGpuProbe()


def old_way(tel: Any) -> Any:
    """``tel`` with its phases made the old way (the legacy probe, no GPU times)."""
    runtime = tel._components.phase_runtime()
    runtime.gpu = legacy_probe()
    runtime.gpu_timer = None
    return tel


def without_gpu_times(tel: Any) -> Any:
    tel._components.phase_runtime().gpu_timer = None
    return tel


def settle(tel: Any, timeout_s: float = 60.0) -> bool:
    """Wait until ``tel``'s phases have their GPU times written."""
    return bool(tel._components.phase_runtime().flush(timeout_s))


def drops(tel: Any) -> float:
    """GPU-timed phases dropped (backlog, unresolved at close)."""
    return sum(tel.value("rl_telemetry_errors_total", sink="phase", reason=r) or 0.0
               for r in ("gpu_time_backlog", "gpu_time_unresolved"))


@contextlib.contextmanager
def roll_gpu_phase(torch: Any, metrics: dict[str, float], infix: str = "actor_train/train_step") -> Iterator[None]:
    """ROLL's state_offload_manager as a ROLL trainer runs it on a GPU: perf_counter timings, psutil CPU memory,
    the peaks reset and the four allocator functions at the four stages (fractions at end/onload)."""
    import psutil

    from rl_otel._internal.probes.memory import GIB

    cuda, process = torch.cuda, psutil.Process()

    def gpu(stage: str, frac: bool = False) -> None:
        d = cuda.current_device()
        for kind, fn in (("allocated", cuda.memory_allocated), ("reserved", cuda.memory_reserved),
                         ("max_allocated", cuda.max_memory_allocated), ("max_reserved", cuda.max_memory_reserved)):
            metrics[f"memory/{infix}/{stage}/{kind}/{d}"] = fn(d) / GIB
        if frac:
            total = cuda.get_device_properties(d).total_memory
            metrics[f"memory/{infix}/{stage}/max_allocated_frac/{d}"] = cuda.max_memory_allocated(d) / total
            metrics[f"memory/{infix}/{stage}/max_reserved_frac/{d}"] = cuda.max_memory_reserved(d) / total

    def cpu(stage: str) -> None:
        mem = process.memory_info()
        metrics[f"memory/cpu/{infix}/{stage}/rss"], metrics[f"memory/cpu/{infix}/{stage}/vms"] = mem.rss / GIB, \
            mem.vms / GIB

    t0 = time.perf_counter()
    cuda.reset_peak_memory_stats()
    gpu("start/offload")
    gpu("start/onload")
    cpu("start")
    t1 = time.perf_counter()
    yield
    t2 = time.perf_counter()
    gpu("end/onload", frac=True)
    gpu("end/offload")
    cpu("end")
    t3 = time.perf_counter()
    metrics.update({f"time/{infix}/total": t3 - t0, f"time/{infix}/onload": t1 - t0,
                    f"time/{infix}/execute": t2 - t1, f"time/{infix}/offload": t3 - t2})


# -- 1. phase cost ----------------------------------------------------------------------------------------------


def phase_cost(torch: Any, rounds: int) -> tuple[list[Row], dict[str, float]]:
    import rl_otel

    n = 500
    inits: dict[str, Any] = {"prometheus": {"host": "127.0.0.1", "port": 0}, "handle_sigterm": False}
    new = rl_otel.init("bench-gpu-phase", **inits)
    old = old_way(rl_otel.init("bench-gpu-phase-old", **inits))
    no_timer = without_gpu_times(rl_otel.init("bench-gpu-phase-no-timer", **inits))
    noop = lambda: None
    keep = torch.ones(64 << 20, dtype=torch.uint8, device=DEVICE)  # an allocator with something in it

    def phases(tel: Any, user_code: bool) -> Callable[[], None]:
        onload = offload = noop if user_code else None

        def run() -> None:
            for _ in range(n):
                with tel.phase("actor_train", "train_step", onload=onload, offload=offload):
                    pass
        return run

    try:
        t = ab_rounds([phases(new, False), phases(old, False), phases(no_timer, False)], rounds, inner=1,
                      budget_s=10)
        u = ab_rounds([phases(new, True), phases(old, True)], rounds, inner=1, budget_s=6)
        assert settle(new)
        dropped = drops(new)
        device = torch.cuda.current_device()
        reader_new = new._components.phase_runtime().gpu
        reader_new.read()
        event = torch.cuda.Event(enable_timing=True)
        parts = ab_rounds([lambda: reader_new.read(), lambda: torch.cuda.memory_stats(device),
                           lambda: torch.cuda.memory_allocated(device),
                           lambda: event.record(torch.cuda.current_stream(device))], rounds, budget_s=4)
    finally:
        for tel in (new, old, no_timer):
            tel.close()
        del keep
    us = lambda s: s / n * 1e6
    m = {"new": us(t.median(0)), "old": us(t.median(1)), "no_timer": us(t.median(2)), "ratio": t.ratio(0, 1),
         "new_io": us(u.median(0)), "old_io": us(u.median(1)), "ratio_io": u.ratio(0, 1), "dropped": dropped,
         "read": parts.median(0) * 1e6, "memory_stats": parts.median(1) * 1e6,
         "memory_allocated": parts.median(2) * 1e6, "record": parts.median(3) * 1e6}
    old_name = "the old way: 16 memory_stats() dicts, no GPU times"
    rows = [
        Row("phase(), empty body (2 allocator reads, 2 CUDA events)", m["new"], m["old"], "us",
            f"<= {PHASE_TARGET_US:g} us", m["new"] <= PHASE_TARGET_US, old_name, paired_ratio=m["ratio"]),
        Row("phase() with onload/offload (4 reads, 4 events)", m["new_io"], m["old_io"], "us",
            f"<= {PHASE_TARGET_US:g} us", m["new_io"] <= PHASE_TARGET_US, old_name, paired_ratio=m["ratio_io"]),
        Row("phase(), empty body, GPU times off (information)", m["no_timer"], m["new"], "us", "-", None,
            "the same, GPU times on"),
        Row("one allocator read (memory_stats_as_nested_dict + 4 values)", m["read"], m["memory_stats"], "us", "-",
            None, "torch.cuda.memory_stats()"),
        Row("torch.cuda.memory_allocated() (what the old way called 16 times)", m["memory_allocated"],
            m["memory_stats"], "us", "-", None, "torch.cuda.memory_stats()"),
        Row("Event.record(current_stream()) (one phase edge)", m["record"], m["read"], "us", "-", None,
            "one allocator read"),
    ]
    return rows, m


# -- 2. step overhead -------------------------------------------------------------------------------------------


class Model:
    """Six bf16 4096x4096 linear layers, forward, backward and AdamW; the step ends with ``loss.item()``, where the
    host waits for the GPU as a trainer logging its loss does. ``batch`` is sized for a ~50 ms step."""

    def __init__(self, torch: Any, step_ms: float = STEP_MS) -> None:
        self.torch = torch
        layers = [torch.nn.Linear(LAYER, LAYER, bias=False, device=DEVICE, dtype=torch.bfloat16) for _ in range(6)]
        self.net = torch.nn.Sequential(*layers)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-5)
        self.batch = 4096
        for _ in range(2):  # size the batch for the step time asked: the matmuls scale with it
            self.x = torch.randn(self.batch, LAYER, device=DEVICE, dtype=torch.bfloat16)
            ms = self.time_ms(5)
            self.batch = max(256, min(1 << 18, round(self.batch * step_ms / ms / 256) * 256))
        self.x = torch.randn(self.batch, LAYER, device=DEVICE, dtype=torch.bfloat16)
        self.step_ms = self.time_ms(5)

    def step(self) -> float:
        loss = self.net(self.x).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.item())

    def time_ms(self, steps: int) -> float:
        self.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - t0) / steps * 1e3


@dataclass
class Variant:
    """One way of running the step: ``open()`` builds what it needs (untimed), ``step(i)`` runs one, ``close()``."""

    name: str
    open: Callable[[], Any]
    step: Callable[[Any, int], None]
    close: Callable[[Any], None]


def overhead(torch: Any, rounds: int, steps: int) -> tuple[list[Row], dict[str, float]]:
    import bench_stats
    from bench_bridge import roll_step_keys
    from bench_overhead import Scraper
    from torch.utils.tensorboard import SummaryWriter

    import rl_otel

    model = Model(torch)
    stats = bench_stats.Case("roll", 64, 512).ours()  # ROLL's statistics keys, computed once (values only)
    keys = roll_step_keys(8)
    step_keys = [{**{k: float((i * 7 + j) % 101) / 100 for j, k in enumerate(keys)}, **stats} for i in range(16)]
    tmp = tempfile.mkdtemp(prefix="bench-gpu-")

    class Ctx:
        """What one variant runs with in one round: its Telemetry, scraper or TensorBoard writer."""

        def __init__(self, tel: Any = None, scrape: bool = False, writer: Any = None) -> None:
            self.tel, self.writer = tel, writer
            self.scraper = Scraper(tel.metrics_url) if scrape else None
            self.on, self.next = 0.0, 1.0

        def maybe_scrape(self) -> None:
            if self.scraper is not None and self.on >= self.next:  # a scrape a second of steps, during a step
                self.next += 1.0
                self.scraper.asked.set()

        def close(self) -> None:
            if self.scraper is not None:
                self.scraper.close()
            if self.tel is not None:
                self.tel.close()
            if self.writer is not None:
                self.writer.close()

    def telemetry(tensorboard: bool = False, scrape: bool = False, old: bool = False) -> Callable[[], Ctx]:
        def make() -> Ctx:
            trackers = {"tensorboard": {"log_dir": tempfile.mkdtemp(dir=tmp)}} if tensorboard else None
            tel = rl_otel.init("bench-gpu-step", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                               trackers=trackers)
            return Ctx(old_way(tel) if old else tel, scrape=scrape)
        return make

    def run(phase: bool, log: bool) -> Callable[[Ctx, int], None]:
        def step(ctx: Ctx, i: int) -> None:
            t0 = time.perf_counter()
            ctx.maybe_scrape()
            if phase:
                with ctx.tel.phase("actor_train", "train_step"):
                    model.step()
            else:
                model.step()
            if log:
                ctx.tel.log(step_keys[i % len(step_keys)], step=i)
            ctx.on += time.perf_counter() - t0
        return step

    def roll_way(ctx: Ctx, i: int) -> None:
        metrics: dict[str, float] = {}
        with roll_gpu_phase(torch, metrics):
            model.step()
        for key, value in {**step_keys[i % len(step_keys)], **metrics}.items():
            ctx.writer.add_scalar(key, value, i)

    close = lambda ctx: ctx.close()
    variants = [
        Variant("bare", lambda: Ctx(), lambda ctx, i: model.step(), close),
        Variant("init", telemetry(), lambda ctx, i: model.step(), close),
        Variant("phase", telemetry(), run(phase=True, log=False), close),
        Variant("phase_old", telemetry(old=True), run(phase=True, log=False), close),
        Variant("log", telemetry(), run(phase=False, log=True), close),
        Variant("log_tb", telemetry(tensorboard=True), run(phase=False, log=True), close),
        Variant("log_tb_scrape", telemetry(tensorboard=True, scrape=True), run(phase=False, log=True), close),
        Variant("everything", telemetry(tensorboard=True, scrape=True), run(phase=True, log=True), close),
        Variant("everything_old", telemetry(tensorboard=True, scrape=True, old=True), run(phase=True, log=True),
                close),
        Variant("tensorboard_roll", lambda: Ctx(writer=SummaryWriter(log_dir=tempfile.mkdtemp(dir=tmp))),
                roll_way, close),
    ]
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    try:
        for r in range(rounds + 1):  # round 0 warms every variant (series, plans, the writer) and is left out
            for v in (variants if r % 2 == 0 else variants[::-1]):
                ctx = v.open()
                try:
                    v.step(ctx, 0)  # a warm step, untimed
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for i in range(1, steps + 1):
                        v.step(ctx, i)
                    elapsed = (time.perf_counter() - t0) / steps
                finally:
                    v.close(ctx)
                if r:
                    times[v.name].append(elapsed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = {name: statistics.median(a / b for a, b in zip(t, times["bare"], strict=True))
             for name, t in times.items()}
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    m = {"step_ms": model.step_ms, "batch": model.batch, "keys": len(step_keys[0]),
         **{f"{k}_ratio": v for k, v in ratio.items()}}
    bare = "bare GPU step"
    target = f"ratio <= {OVERHEAD_TARGET}"

    def row(label: str, name: str, with_target: bool = False) -> Row:
        return Row(label, ms[name], ms["bare"], "ms", target if with_target else "-",
                   ratio[name] <= OVERHEAD_TARGET if with_target else None, bare, paired_ratio=ratio[name])

    rows = [
        row("init() alone", "init"),
        row("the phase alone", "phase"),
        row("the phase alone, the old way (before)", "phase_old"),
        row(f"{m['keys']}-key ROLL-shaped log()", "log"),
        row("log() + TensorBoard mirror", "log_tb"),
        row("log() + TensorBoard + a scrape a second", "log_tb_scrape"),
        row("everything: phase + log() + TensorBoard + scrape", "everything", with_target=True),
        row("everything, the old phase (before)", "everything_old"),
        row("TensorBoard the ROLL way (ROLL-style phase, add_scalar per key)", "tensorboard_roll"),
    ]
    return rows, m


# -- 3. GPU vs host phase time -----------------------------------------------------------------------------------


def phase_times(torch: Any, reps: int) -> tuple[list[Row], dict[str, float]]:
    import rl_otel

    tel = rl_otel.init("bench-gpu-times", prometheus=False, handle_sigterm=False)
    runtime = tel._components.phase_runtime()
    got: list[dict[str, float]] = []
    runtime_record = runtime.record_gpu

    def record_gpu(cluster: str, phase: str, seconds: dict[str, float]) -> None:
        got.append(dict(seconds))
        runtime_record(cluster, phase, seconds)  # type: ignore[misc]

    runtime.record_gpu = record_gpu
    a = torch.randn(MATMUL, MATMUL, device=DEVICE, dtype=torch.bfloat16)
    event = lambda: torch.cuda.Event(enable_timing=True)
    m: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        m.setdefault(key, []).append(value)

    try:
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()
        for _ in range(reps):  # a generate phase: 60 matmuls queued in a few ms, ~90 ms of GPU work
            e0, e1 = event(), event()
            got.clear()
            with tel.phase("actor_infer", "generate") as ph:
                e0.record()
                for _ in range(MATMULS):
                    a @ a
                e1.record()
            assert settle(tel) and got, "the phase's GPU times never resolved"
            events = e0.elapsed_time(e1) / 1e3
            add("gen_events", events)
            add("gen_gpu", got[-1]["execute"])
            add("gen_host", ph.metrics["time/actor_infer/generate/execute"])
            add("gen_host_total", ph.metrics["time/actor_infer/generate/total"])
        model = [torch.randn(LAYER, LAYER, dtype=torch.bfloat16) for _ in range(MODEL_TENSORS)]  # 2 GiB, host
        on_gpu: list[Any] = []
        e = [event() for _ in range(4)]  # re-recorded each repetition

        def onload() -> None:
            e[0].record()
            on_gpu[:] = [t.to(DEVICE) for t in model]
            e[1].record()

        def offload() -> None:
            e[2].record()
            for i, t in enumerate(on_gpu):
                model[i] = t.to("cpu")
            on_gpu.clear()
            e[3].record()

        for _ in range(reps):  # a train step whose model is loaded before and offloaded after
            got.clear()
            with tel.phase("actor_train", "train_step", onload=onload, offload=offload) as ph:
                for _ in range(MATMULS):
                    a @ a
            assert settle(tel) and got, "the phase's GPU times never resolved"
            for part, (i, j) in (("onload", (0, 1)), ("execute", (1, 2)), ("offload", (2, 3))):
                add(f"io_{part}_events", e[i].elapsed_time(e[j]) / 1e3)
                add(f"io_{part}_gpu", got[-1][part])
                add(f"io_{part}_host", ph.metrics[f"time/actor_train/train_step/{part}"])
    finally:
        tel.close()
    med = {k: statistics.median(v) for k, v in m.items()}
    tol = f"within {GPU_TIME_TOLERANCE:.0%} of CUDA events"
    ok = lambda r: abs(r - 1) <= GPU_TIME_TOLERANCE
    ev = "CUDA events around the same work"
    rows = [
        Row("generate (60 bf16 8192^2 matmuls): GPU execute", med["gen_gpu"] * 1e3, med["gen_events"] * 1e3, "ms",
            tol, ok(med["gen_gpu"] / med["gen_events"]), ev),
        Row("generate: host execute (before: all a phase had)", med["gen_host"] * 1e3, med["gen_events"] * 1e3, "ms",
            "-", None, ev),
        Row("generate: host total (information)", med["gen_host_total"] * 1e3, med["gen_events"] * 1e3, "ms", "-",
            None, ev),
    ]
    for part in ("onload", "execute", "offload"):
        gpu, events, host = med[f"io_{part}_gpu"], med[f"io_{part}_events"], med[f"io_{part}_host"]
        rows.append(Row(f"onload/offload phase: GPU {part}", gpu * 1e3, events * 1e3, "ms",
                        tol if part == "execute" else "-", ok(gpu / events) if part == "execute" else None, ev))
        rows.append(Row(f"onload/offload phase: host {part} (before)", host * 1e3, events * 1e3, "ms", "-", None,
                        ev))
    return rows, med


# -- 4. ppo_stats -----------------------------------------------------------------------------------------------


def ppo_stats_rows() -> list[Row] | None:
    """``bench_stats.gpu_comparison("cuda")`` as rows, or None where the statistics' benchmark has none."""
    import bench_stats

    compare = getattr(bench_stats, "gpu_comparison", None)
    if compare is None:
        return None
    rows = []
    for r in compare(DEVICE):
        ours_ms, theirs_ms = float(r["ours_ms"]), float(r["theirs_ms"])
        kernels = int(r["ours_kernels"])
        met = ours_ms / theirs_ms <= 0.5 and kernels <= 40
        rows.append(Row(f"ppo_stats({r['framework']}) {r['shape']}: wall; kernels {kernels} vs "
                        f"{r['theirs_kernels']}", ours_ms, theirs_ms, "ms", "ratio <= 0.5 and <= 40 kernels", met,
                        f"{r['framework']}'s metric code", paired_ratio=float(r["ratio"])))
    return rows


# -- 5. first do no harm ---------------------------------------------------------------------------------------

_NO_CONTEXT_CHILD = r"""
import json, os, sys, urllib.request
import torch  # imported, never used for CUDA: a Ray driver, a controller, a reward worker
import rl_otel
tel = rl_otel.init("bench-gpu-no-context", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
for _ in range(20):
    with tel.phase("actor_train", "train_step", onload=lambda: None, offload=lambda: None):
        pass
tel.log({"actor/pg_loss": 0.5, "actor/custom": torch.tensor(1.0)}, step=1)
for _ in range(3):
    urllib.request.urlopen(tel.metrics_url, timeout=10).read()
tel.flush(10)
found = None
try:
    import pynvml
    pynvml.nvmlInit()
    found = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if any(p.pid == os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)):
            found.append(i)
except Exception as exc:
    print("NVML not usable here:", exc, file=sys.stderr)
tel.close()
print(json.dumps({"initialized": torch.cuda.is_initialized(), "nvml_devices": found}))
"""


def no_harm(torch: Any, rounds: int) -> list[Row]:
    import json
    import os
    import subprocess
    import warnings

    import rl_otel

    rows: list[Row] = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    child = subprocess.run([sys.executable, "-c", _NO_CONTEXT_CHILD], capture_output=True, text=True, timeout=300,
                           env=env)
    try:
        seen = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        seen = {"initialized": None, "nvml_devices": None, "error": child.stderr[-2000:]}
    clean = seen["initialized"] is False and not seen["nvml_devices"]
    print(f"no-context child: {seen}" + (f"; stderr: {child.stderr[-500:]}" if child.returncode else ""))
    rows.append(Row("no CUDA context in a torch process that never used CUDA (is_initialized, NVML processes)",
                    float(bool(seen["initialized"])) + float(len(seen["nvml_devices"] or [])), 0.0, "contexts",
                    "0", clean, "none"))

    inits: dict[str, Any] = {"prometheus": {"host": "127.0.0.1", "port": 0}, "handle_sigterm": False}
    spike = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    del spike
    before = torch.cuda.max_memory_allocated()
    tel = rl_otel.init("bench-gpu-peaks-off", phase_peaks=False, **inits)
    try:
        for _ in range(10):
            with tel.phase("actor_train", "train_step"), tel.phase("actor_train", "micro_batch"):
                torch.ones(1 << 20, device=DEVICE)
    finally:
        tel.close()
    after = torch.cuda.max_memory_allocated()
    rows.append(Row("max_memory_allocated() unchanged by phases with phase_peaks=False", after / 2**20,
                    before / 2**20, "MiB", "equal", after == before, "before the phases"))

    tel = rl_otel.init("bench-gpu-peaks-nested", **inits)
    try:
        with tel.phase("actor_train", "train_step"):
            spike = torch.empty(512 << 20, dtype=torch.uint8, device=DEVICE)
            del spike
            outer_peak = torch.cuda.max_memory_allocated()
            for _ in range(5):
                with tel.phase("actor_train", "micro_batch"):
                    torch.ones(1 << 20, device=DEVICE)
            nested = torch.cuda.max_memory_allocated()
    finally:
        tel.close()
    rows.append(Row("max_memory_allocated() inside an outer phase unchanged by nested phases", nested / 2**20,
                    outer_peak / 2**20, "MiB", "equal", nested == outer_peak, "before the nested phases"))

    tel = rl_otel.init("bench-gpu-capture", **inits)
    x = torch.randn(2048, 2048, device=DEVICE)
    good = 0
    errors: list[str] = []
    try:
        for _ in range(10):
            for _ in range(3):
                with tel.phase("rollout", "generate"):
                    for _ in range(20):
                        x = x @ x * 1e-3  # GPU work still pending when the capture starts
            graph = torch.cuda.CUDAGraph()
            static = torch.randn(1024, 1024, device=DEVICE)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do before a capture
                    for _ in range(2):
                        out = static @ static
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):  # capture_error_mode="global", torch's default
                    for _ in range(50):
                        out = static @ static
                graph.replay()
                torch.cuda.synchronize()
                good += 1
            except Exception as exc:  # what a broken capture raises
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                torch.cuda.synchronize()
        del out
    finally:
        tel.close()
    if errors:
        print("captures failed:", errors[:3])
    rows.append(Row("CUDA-graph captures right after phases with pending GPU work", good, 10, "of 10",
                    "10 of 10", good == 10, "attempted"))

    tel = rl_otel.init("bench-gpu-syncs", **inits)
    try:
        values = {f"actor/custom_{i}": torch.rand((), device=DEVICE) for i in range(50)}
        tel.log(values, step=0)  # the keys' routes are made once
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                tel.log(values, step=1)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
    finally:
        tel.close()
    rows.append(Row("host syncs of a 50-key log() of CUDA scalars (set_sync_debug_mode)", syncs, 50, "syncs",
                    "1", syncs <= 1, "one a key, as 3effae0 did"))

    n = 500
    cheap = rl_otel.init("bench-gpu-cheap", **inits)
    full = rl_otel.init("bench-gpu-full", **inits)

    def phases(tel: Any, memory: bool) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n):
                with tel.phase("actor_train", "micro_batch", memory=memory):
                    pass
        return run

    try:
        t = ab_rounds([phases(cheap, False), phases(full, True)], rounds, inner=1, budget_s=6)
        settle(cheap)
        settle(full)
    finally:
        cheap.close()
        full.close()
    us = t.median(0) / n * 1e6
    rows.append(Row("phase(..., memory=False): events only", us, t.median(1) / n * 1e6, "us",
                    f"<= {PHASE_TARGET_US:g} us", us <= PHASE_TARGET_US, "with memory snapshots",
                    paired_ratio=t.ratio(0, 1)))
    return rows


# -- the run ----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 3)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    torch = cuda_torch()
    if torch is None:
        print("bench_gpu: no CUDA device visible to torch here (not installed, a CPU build, or no GPU): nothing "
              "measured. Run it on a GPU machine: python benchmarks/bench_gpu.py")
        return 0
    rounds = args.rounds or (3 if args.quick else 7)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"bench_gpu: {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}; {rounds} interleaved "
          "rounds; ratio = measured / baseline (median of per-round ratios where paired)")
    started = time.perf_counter()
    every: list[Row] = []

    rows, m = phase_cost(torch, rounds)
    every += rows
    print(f"\n1. phase cost, us a phase ({m['dropped']:.0f} GPU-timed phases dropped)")
    print(table(rows))

    rows, m = overhead(torch, rounds, steps=6 if args.quick else 12)
    every += rows
    print(f"\n2. step overhead: bare step {m['step_ms']:.1f} ms (batch {m['batch']:.0f} x {LAYER}, bf16), ms a step")
    print(table(rows))

    rows, _ = phase_times(torch, reps=3 if args.quick else 5)
    every += rows
    print("\n3. GPU vs host phase time, ms (medians)")
    print(table(rows))

    stats = ppo_stats_rows()
    print("\n4. ppo_stats on the GPU")
    if stats is None:
        print("ppo_stats: bench_stats.gpu_comparison not available")
    else:
        every += stats
        print(table(stats))

    rows = no_harm(torch, rounds)
    every += rows
    print("\n5. first do no harm")
    print(table(rows))

    targets = [r for r in every if r.passed is not None]
    missed = [r.name for r in targets if not r.passed]
    print(f"\n{len(targets) - len(missed)} of {len(targets)} targets met in {time.perf_counter() - started:.0f} s"
          + (": missed " + "; ".join(missed) if missed else ""))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
