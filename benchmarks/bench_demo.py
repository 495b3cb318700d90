"""End to end: the demo's PPO training step with rl_otel fully on, against the same step with telemetry off, paired.

    python benchmarks/bench_demo.py [--steps 64] [--rounds 6] [--big] [--inline]

"Fully on" is what the README's main job runs: a Prometheus endpoint scraped once a second over HTTP, five
phases a step with real onload/offload and memory snapshots, ``ppo_stats`` with 15 distributions, Trinity-style
rollout and eval aggregation and ~100 keys, handed to ``Telemetry.submit`` (computed on its metrics worker), and a
TensorBoard tracker. "Off" is the same step with no
rl_otel call at all (``_step(trainer, None, ...)``: the same math, a test checks it). An evaluation (and its
Trinity aggregation) runs every 4th step.

Why paired: this shared 2-core VM drifts in speed by 20-30% over about a second, more than the ~1 ms (1% of a
~100-130 ms step) to be resolved, so whole runs compared one after the other (this benchmark's first method)
measured the drift as much as rl_otel (five runs: +4% to +12%). Here one process builds two trainers from the
same config and seed, one logging to a Telemetry and one not, and runs them in blocks of ``BLOCK`` (4) steps
each, alternating ABBA (on-block, off-block, off-block, on-block, ...: a linear drift cancels over each pair
of blocks, and each side follows itself and the other equally often). Step k does the same work in both (the
benchmark checks that their scores are equal), so the per-step difference ``on - off`` carries the drift of
~0.5 s, not of a whole run. The estimate is the MEAN difference (evaluation steps included: their statistics
and aggregation are real cost, a median would drop them) with its standard error over blocks (each holds one
evaluation step, so blocks are alike); the overhead is the mean difference over the mean "off" step. Rounds
repeat this with fresh trainers and a fresh Telemetry (seed + round, which trainer is built first alternating).

Why blocks, and not single steps: telemetry works on other threads too - ``Telemetry.submit``'s metrics worker
computes a step's statistics while the next step trains, the TensorBoard tracker writes it, the endpoint's
handler renders a scrape. In a real run that work overlaps the next step and competes with it for the GIL and
the CPU; that cost is part of the overhead and only shows if "on" steps follow each other. Within a block they
do; at the end of an on-block the loop waits until telemetry is idle (``tel.flush()`` and any scrape in flight)
so nothing spills into the off-block. Blocks start two steps after an evaluation period, so each block's
evaluation step is its second and its (larger) statistics job overlaps the block's last two steps. Figures:

1. training-thread overhead of the steps that follow an "on" step in their block (positions 2-4, every one
   overlapped by its predecessor's background work, as in a real run): the headline figure, shown against
   ``TARGET`` (a goal, see there);
2. the same over every step of a block (the first has nothing overlapping it, so this is lower);
3. an upper bound: every step plus the block's final wait, as if that last background work were on the
   critical path too;

and the CPU time the other threads use per "on" step (process CPU time minus the training thread's
``time.thread_time()``, over the block and its wait; the scraper's own client-side CPU, an artefact of scraping
from inside the process, is measured on its thread and left out), against the same for an "off" step (which
should be ~0: if not, something spills over). A cross-check that other processes' load barely touches: the
training thread's CPU time (``time.thread_time()``), "on" minus "off" - it leaves out what the thread waits for
(the GIL held by another thread, I/O), so it is not the judged figure.

The scraper: Prometheus scrapes every second of wall time, and a real run spends all of it in "on" steps; here
half the wall time is "off" steps, so a 1 Hz wall-clock scraper would scrape twice as often per "on" step as a
real run does, and its scrapes would land in "off" steps too. So scrapes are paced by the accumulated time of
"on" steps (one per second of it, the real rate per step) and start only during an "on" step, at a random point
within it (a step's length after it starts, at most: a real scrape's phase is random), so the handler's
rendering competes with the training thread as it would; a scrape not yet started when its step ends starts
then, during the next step of the block (or the block's final wait).

``--inline`` computes the statistics on the training thread (``log(fn(...))`` where the demo calls ``submit``),
to compare the two: on this CPU step they cost about the same, because the training thread is Python-bound -
thousands of small torch ops whose dispatch holds the GIL - so work moved to another thread still competes for
it (on a GPU the training thread waits in CUDA calls that release the GIL, and the worker runs beside it).

``--big`` also runs a heavier configuration (batch 512, hidden 1024), closer to a real step's length, to show how
the cost scales.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row, metrics_url

# The < 1% goal of an earlier issue, printed as information: issue 20 replaced it with the step-overhead targets of
# bench_overhead.py. On this 2-core VM the demo's step is CPU-bound (torch's 2 threads), so the background work
# (the statistics on the metrics worker, the TensorBoard writer: "other threads' CPU per step") competes with it
# for the same two cores; on a GPU step the host thread waits and that work overlaps the wait.
TARGET = 0.01
EVAL_EVERY = 4  # an evaluation step every 4: one in each block below
BLOCK = 4  # steps each side runs in a row (one evaluation period); blocks alternate ABBA
OFFSET = 2  # blocks start 2 steps after an evaluation period: each block's evaluation step is its second
SCRAPE_PERIOD_S = 1.0


class _Scraper:
    """Scrapes ``url`` on its own thread when told to, after a given delay or as soon as the step ends, whichever
    comes first (the main thread never waits for the delay itself); its thread's CPU time is counted (a
    Prometheus server does this in another process)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0
        self.cpu_s = 0.0  # the client side: this thread's CPU time in its requests
        self._delay = 0.0
        self._go = threading.Event()
        self._step_done = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def start(self, delay: float) -> None:
        self._delay = delay
        self._step_done.clear()
        self._idle.clear()
        self._go.set()

    def step_ended(self) -> None:
        """The step it was started in has ended: a scrape still waiting for its delay starts now."""
        self._step_done.set()

    def wait_idle(self) -> None:
        """Called at the end of a block: a scrape still waiting starts now; returns once it is served."""
        self._step_done.set()
        self._idle.wait()

    def close(self) -> None:
        self._stop = True
        self._go.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            self._step_done.wait(self._delay)
            cpu = time.thread_time()
            try:
                urllib.request.urlopen(self.url, timeout=5).read()
                self.count += 1
            except OSError:
                pass
            self.cpu_s += time.thread_time() - cpu
            self._idle.set()


@dataclass
class Paired:
    """Per-step figures (seconds) of the steps after warm-up, one entry per step pair, in order; ``rounds``: how
    many consecutive pairs each round contributed (a block of :meth:`mean_se` never straddles two rounds)."""

    on: list[float] = field(default_factory=list)  # the "on" step's iteration, training thread
    off: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)  # tel.flush() + a scrape in flight, after the "on" step
    logging: list[float] = field(default_factory=list)  # the "on" step's statistics + log(): iteration - training
    main_cpu_on: list[float] = field(default_factory=list)  # training thread's CPU time
    main_cpu_off: list[float] = field(default_factory=list)
    queued_on: list[float] = field(default_factory=list)  # the training thread's run-queue wait in the step
    queued_off: list[float] = field(default_factory=list)
    gc_on: list[float] = field(default_factory=list)  # garbage collection inside the step (one heap for both)
    gc_off: list[float] = field(default_factory=list)
    other_cpu_on: list[float] = field(default_factory=list)  # other threads, over the "on" step and its wait
    other_cpu_off: list[float] = field(default_factory=list)
    position: list[int] = field(default_factory=list)  # the step's place in its block (0: after the other side)
    rounds: list[int] = field(default_factory=list)  # pairs per round
    scrapes: int = 0
    mismatches: int = 0  # steps whose scores differ between the two trainers (must be 0: the same work)

    def diff(self, upper: bool = False) -> list[float]:
        return [a + (w if upper else 0.0) - b for a, w, b in zip(self.on, self.wait, self.off, strict=False)]

    def diff_unqueued(self) -> list[float]:
        """``on - off`` without the time the training thread sat runnable in the run queue (others' load)."""
        return [(a - qa) - (b - qb)
                for a, qa, b, qb in zip(self.on, self.queued_on, self.off, self.queued_off, strict=False)]

    def mean_se(self, values: list[float], steady: bool = False) -> tuple[float, float]:
        """Mean and its standard error over blocks of ``BLOCK`` consecutive pairs of one round: a drift that is
        linear over an ABBA pair of blocks cancels, and each block holds one evaluation step, so the blocks are
        closer to independent, and alike, than single pairs are. ``steady``: only the steps that follow an "on"
        step of their block (position > 0), whose background work they overlap as in a real run."""
        keep = [not steady or p > 0 for p in self.position]
        blocks, chosen, start = [], [], 0
        for n in self.rounds:
            for i in range(start, start + n, BLOCK):
                picked = [v for v, k in zip(values[i:i + BLOCK], keep[i:i + BLOCK], strict=False) if k]
                blocks.append(statistics.fmean(picked))
                chosen += picked
            start += n
        se = statistics.stdev(blocks) / len(blocks) ** 0.5 if len(blocks) > 1 else float("nan")
        return statistics.fmean(chosen), se

    def overhead(self, upper: bool = False, steady: bool = False) -> tuple[float, float]:
        """(mean on - off) / mean off, and its standard error (that of the difference over the mean off step;
        the mean off step's own error is second order for an overhead near 0)."""
        mean, se = self.mean_se(self.diff(upper), steady)
        off = statistics.fmean(self.off)
        return mean / off, se / off

    def summary(self, name: str) -> str:
        ms = 1e3
        off, on = statistics.fmean(self.off), statistics.fmean(self.on)
        d, d_se = self.mean_se(self.diff(), steady=True)
        a, a_se = self.mean_se(self.diff())
        u, u_se = self.mean_se(self.diff(upper=True))
        o, o_se = self.overhead(steady=True)
        oa, oa_se = self.overhead()
        ub, ub_se = self.overhead(upper=True)
        cpu_d, cpu_se = self.mean_se([a - b for a, b in zip(self.main_cpu_on, self.main_cpu_off, strict=False)])
        cpu_off = statistics.fmean(self.main_cpu_off)
        run_d, run_se = self.mean_se(self.diff_unqueued())
        run_off = statistics.fmean(self.off) - statistics.fmean(self.queued_off)
        return "\n".join([
            f"{name}: {len(self.on)} step pairs in {len(self.rounds)} round(s), {self.scrapes} scrapes"
            + (f", {self.mismatches} PAIRS WITH DIFFERENT SCORES" if self.mismatches else ", the same work"),
            f"  step: off {off * ms:.2f} ms, on {on * ms:.2f} ms (mean, eval steps included)",
            f"  training thread, steps after an on step (its background work overlapping): {d * ms:+.3f} +- "
            f"{d_se * ms:.3f} ms -> overhead {o:+.2%} +- {o_se:.2%} (goal < {TARGET:.0%}: "
            f"{'reached' if o < TARGET else 'not reached'})",
            f"  training thread, every step of a block (the first has nothing overlapping): {a * ms:+.3f} +- "
            f"{a_se * ms:.3f} ms -> {oa:+.2%} +- {oa_se:.2%}",
            f"  upper bound (+ the block's wait for telemetry idle, {statistics.fmean(self.wait) * ms:.2f} ms a "
            "step): "
            f"{u * ms:+.3f} +- {u_se * ms:.3f} ms -> {ub:+.2%} +- {ub_se:.2%}",
            f"  less the training thread's run-queue wait (others' load; off {(off - run_off) * ms:.2f} ms, "
            f"on {statistics.fmean(self.queued_on) * ms:.2f} ms): {run_d * ms:+.3f} +- {run_se * ms:.3f} ms -> "
            f"{run_d / run_off:+.2%} +- {run_se / run_off:.2%}",
            f"  in the on step: after the training work (statistics inline, or their submit()) "
            f"{statistics.fmean(self.logging) * ms:.2f} ms, "
            f"the rest (phases, scrapes, contention) {(a - statistics.fmean(self.logging)) * ms:.2f} ms; "
            f"training-thread CPU on - off {cpu_d * ms:+.3f} +- {cpu_se * ms:.3f} ms "
            f"({cpu_d / cpu_off:+.2%} +- {cpu_se / cpu_off:.2%} of the off step's {cpu_off * ms:.1f} ms CPU)",
            f"  other threads' CPU per step: on block + wait {statistics.fmean(self.other_cpu_on) * ms:.2f} ms, "
            f"off step {statistics.fmean(self.other_cpu_off) * ms:.2f} ms (scraper client excluded); "
            f"garbage collection in a step: on {statistics.fmean(self.gc_on) * ms:.2f} ms, "
            f"off {statistics.fmean(self.gc_off) * ms:.2f} ms",
        ])


class _GcClock:
    """Seconds spent in garbage collection since it started (``gc.callbacks``), whichever thread ran it."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _queued() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU (Linux schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def _blocks(steps: int) -> list[tuple[int, int, bool]]:
    """``(first, end, recorded)`` step ranges run as one block per side: a short lead-in of ``OFFSET`` steps, then
    blocks of ``BLOCK`` steps starting at ``OFFSET``, ``(BLOCK, 2 BLOCK, ...)`` + ``OFFSET`` - so each block's
    evaluation step (every ``EVAL_EVERY``-th) is its second, and its statistics job overlaps the two steps after
    it, as in a real run - and a short tail. The lead-in, the first whole block (warm-up) and the tail are not
    recorded."""
    out = [(0, OFFSET, False)]
    first = OFFSET
    while first + BLOCK <= steps:
        out.append((first, first + BLOCK, first >= OFFSET + BLOCK))
        first += BLOCK
    if first < steps:
        out.append((first, steps, False))
    return out


class _Inline:
    """A Telemetry whose ``submit`` computes on the calling thread and logs (``--inline``)."""

    def __init__(self, tel) -> None:
        self._tel = tel

    def __getattr__(self, name: str):
        return getattr(self._tel, name)

    def submit(self, fn, /, *args, step=None, **kwargs):
        self._tel.log(fn(*args, **kwargs), step=step)


def _round(config, seed: int, on_first: bool, out: Paired, inline: bool = False) -> None:
    """One round: two trainers of ``config`` with ``seed``, their steps run in blocks ABBA; appends to ``out``."""
    import dataclasses

    import torch

    import rl_otel
    from rl_otel.demo.ppo import _step, _Trainer

    cfg = dataclasses.replace(config, seed=seed)
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        if cfg.torch_threads is not None:
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(cfg.torch_threads)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_demo_")))
        for sub in ("on", "off", "tb"):
            (tmp / sub).mkdir()
        tel = rl_otel.init(run="bench-demo", prometheus={"host": "127.0.0.1", "port": 0},
                           trackers={"tensorboard": {"log_dir": str(tmp / "tb")}})
        stack.callback(tel.close)
        scraper = _Scraper(metrics_url(tel))
        stack.callback(scraper.close)
        gc_clock = stack.enter_context(_GcClock())
        built = {}
        for side in (("on", "off") if on_first else ("off", "on")):
            built[side] = _Trainer(cfg, tmp / side)
        since_scrape, last_on = 0.0, 0.0
        pairs = 0
        for b, (first, end, record) in enumerate(_blocks(cfg.steps)):
            order = ("on", "off") if (b % 2 == 0) == on_first else ("off", "on")
            scores: dict[str, list[float]] = {"on": [], "off": []}
            for side in order:
                trainer, tel_or_none = (built["on"], _Inline(tel) if inline else tel) if side == "on" else (
                    built["off"], None)
                p0, m0, client = time.process_time(), time.thread_time(), scraper.cpu_s
                for step in range(first, end):
                    g0, q0 = gc_clock.total, _queued()
                    if side == "on" and since_scrape >= SCRAPE_PERIOD_S and scraper.idle:
                        since_scrape = 0.0  # the real rate per "on" step, at a random point within one
                        scraper.start(rng.uniform(0.0, last_on))
                    m_step = time.thread_time()
                    t0 = time.perf_counter()
                    report = _step(trainer, tel_or_none, step, step * cfg.batch_size)  # type: ignore[arg-type]
                    it = time.perf_counter() - t0
                    cpu, queued, gc_s = time.thread_time() - m_step, _queued() - q0, gc_clock.total - g0
                    scores[side].append(report.score)
                    if side == "on":
                        scraper.step_ended()
                        last_on = it
                        since_scrape += it
                    if record:
                        if side == "on":
                            out.on.append(it)
                            out.queued_on.append(queued)
                            out.gc_on.append(gc_s)
                            out.main_cpu_on.append(cpu)
                            out.logging.append(it - report.seconds)
                            out.position.append(step - first)
                        else:
                            out.off.append(it)
                            out.queued_off.append(queued)
                            out.gc_off.append(gc_s)
                            out.main_cpu_off.append(cpu)
                if side == "on":
                    t1 = time.perf_counter()
                    tel.flush()  # the block's last background work, before the other side runs
                    scraper.wait_idle()
                    wait = time.perf_counter() - t1
                    if record:
                        out.wait.extend([0.0] * (end - first - 1) + [wait])
                        other = (time.process_time() - p0) - (time.thread_time() - m0) - (scraper.cpu_s - client)
                        out.other_cpu_on.extend([other / (end - first)] * (end - first))
                elif record:
                    other = (time.process_time() - p0) - (time.thread_time() - m0)
                    out.other_cpu_off.extend([other / (end - first)] * (end - first))
            out.mismatches += sum(a != b for a, b in zip(scores["on"], scores["off"], strict=False))
            pairs += (end - first) if record else 0
        out.rounds.append(pairs)
        out.scrapes += scraper.count


def measure(config, rounds: int, inline: bool = False) -> Paired:
    """``rounds`` rounds of paired, ABBA-interleaved steps (seed + round; the side built and run first
    alternating)."""
    out = Paired()
    for r in range(rounds):
        _round(config, config.seed + r, r % 2 == 0, out, inline)
    return out


def configs(quick: bool, big: bool, steps: int | None, rounds: int) -> list[tuple[str, object, int]]:
    """(name, config, rounds) of each configuration measured."""
    from rl_otel.demo.ppo import DemoConfig

    steps = steps or (3 * BLOCK if quick else 16 * BLOCK)
    steps = max(3 * BLOCK, -(-steps // BLOCK) * BLOCK)  # whole periods: the last step evaluates (in the tail)
    out: list[tuple[str, object, int]] = [("demo step (B=128, hidden 256)",
                                           DemoConfig(steps=steps, eval_every=EVAL_EVERY), rounds)]
    if big:  # a ~3 s step, ~30x the default's: a quarter of the steps, a third of the rounds (~1 s of effect each)
        out.append(("demo step (B=512, hidden 1024)",
                    DemoConfig(steps=max(3 * BLOCK, steps // 4 // BLOCK * BLOCK), eval_every=EVAL_EVERY,
                               batch_size=512, minibatch_size=256, hidden=1024), max(1, rounds // 3)))
    return out


def rows(quick: bool = False, big: bool = False, steps: int | None = None, rounds: int | None = None,
         details: list[str] | None = None, inline: bool = False) -> list[Row]:
    """The table rows; ``details`` collects each configuration's :meth:`Paired.summary`."""
    rounds = rounds or (1 if quick else 6)
    out = []
    for name, config, n in configs(quick, big, steps, rounds):
        p = measure(config, n, inline)
        name += ", statistics inline" if inline else ""
        if details is not None:
            details.append(p.summary(name))
        on, off = statistics.fmean(p.on), statistics.fmean(p.off)
        _, o_se = p.overhead(steady=True)
        _, ub_se = p.overhead(upper=True)
        d, _ = p.mean_se(p.diff(), steady=True)
        out.append(Row(f"{name}, rl_otel fully on, training thread (overhead +- {o_se:.2%})", (off + d) * 1e3,
                       off * 1e3, "ms", f"(goal < {TARGET:.0%})", None, "the same step, telemetry off"))
        out.append(Row(f"{name}: + wait for background work, upper bound (+- {ub_se:.2%})",
                       (on + statistics.fmean(p.wait)) * 1e3, off * 1e3, "ms", "-", None,
                       "the same step, telemetry off"))
        what = "ppo_stats + rollout/eval aggregation + log()" if inline else "the statistics' hand-off (submit)"
        out.append(Row(f"{name}: {what} in it",
                       statistics.fmean(p.logging) * 1e3, off * 1e3, "ms", "-", None, "the step, telemetry off"))
        out.append(Row(f"{name}: other threads' CPU per step", statistics.fmean(p.other_cpu_on) * 1e3, off * 1e3,
                       "ms", "-", None, "the step, telemetry off"))
    return out


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16 * BLOCK,
                        help=f"steps per round, rounded up to a multiple of {BLOCK} (the first {OFFSET + BLOCK} and "
                             f"the last {BLOCK - OFFSET}: warm-up and tail)")
    parser.add_argument("--rounds", type=int, default=6, help="the standard error falls as 1/sqrt(rounds)")
    parser.add_argument("--big", action="store_true", help="also a heavier configuration (batch 512, hidden 1024)")
    parser.add_argument("--inline", action="store_true", help="statistics on the training thread, not submit()")
    args = parser.parse_args()
    if args.steps < 3 * BLOCK:
        parser.error(f"--steps must be at least {3 * BLOCK}")
    details: list[str] = []
    result = rows(big=args.big, steps=args.steps, rounds=args.rounds, details=details, inline=args.inline)
    print(table(result))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
