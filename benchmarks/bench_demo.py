"""End to end: the demo's PPO training step with rl_otel fully on, against the same step with telemetry off, paired.

    python benchmarks/bench_demo.py [--steps 64] [--rounds 6] [--big]

"Fully on" is what the README's main job runs: a Prometheus endpoint scraped once a second over HTTP, five
phases a step with real onload/offload and memory snapshots, ``ppo_stats`` with 15 distributions, Trinity-style
rollout and eval aggregation, ``log()`` of ~100 keys, and a TensorBoard tracker. "Off" is the same step with no
rl_otel call at all (``_step(trainer, None, ...)``: the same math, a test checks it). An evaluation (and its
Trinity aggregation) runs every 4th step.

Why paired: this shared 2-core VM drifts in speed by 20-30% over about a second, more than the ~1 ms (1% of a
~100-130 ms step) to be resolved, so whole runs compared one after the other (this benchmark's first method)
measured the drift as much as rl_otel (five runs: +4% to +12%). Here one process builds two trainers from the
same config and seed, one logging to a Telemetry and one not, and runs step k of both back to back, in ABBA
order (on, off, off, on, on, off, ...: a linear drift cancels within each block of two pairs, and each side
follows itself and the other equally often). Step k does the same work in both (the benchmark checks that their
scores are equal), so the per-step difference ``on - off`` carries the drift of ~0.2 s, not of a whole run.
The estimate is the MEAN difference over every step after warm-up, evaluation steps included (their statistics
and aggregation are real cost: a median would drop them), with its standard error over blocks of 4 pairs (ABBA
twice, one evaluation period: a block's mean carries no drift that is linear over it, and every block holds the
same mix of steps); the overhead is the mean difference over the mean "off" step. Rounds repeat this with
fresh trainers and a fresh Telemetry (seed + round, which trainer is built first alternating).

Background threads: telemetry also works off the training thread (the TensorBoard tracker's worker after each
``log()``, the endpoint's handler serving a scrape, and ``Telemetry.flush()`` waits for whatever else it runs).
Left running, the "on" step's background work would spill into the next "off" step, make it slower and hide
cost. So after every "on" step the loop waits until telemetry is idle (``tel.flush()``, and any scrape in
flight) before the next step starts, and reports two figures:

1. training-thread overhead: the "on" step's own iteration time against the "off" step's - what a run whose
   second core absorbs the background work pays (the judged figure, ``TARGET``);
2. an upper bound: the "on" step plus that wait, as if all background work were on the critical path.

In a real run the tracker's work for step k overlaps step k+1 and takes the GIL now and then; here it runs in
the wait, so the truth lies between the two figures. (``flush()`` also makes the TensorBoard writer hand its
buffer to the OS every step, which it would otherwise do every few seconds: a few us, in the wait only.)

and the CPU time the other threads use per "on" step (process CPU time minus the training thread's
``time.thread_time()``, over the step and its wait; the scraper's own client-side CPU, an artefact of scraping
from inside the process, is measured on its thread and left out), against the same for an "off" step (which
should be ~0: if not, something spills over). A cross-check that other processes' load barely touches: the
training thread's CPU time (``time.thread_time()``), "on" minus "off" - it leaves out what the thread waits for
(the GIL held by a scrape's rendering, I/O), so it is not the judged figure.

The scraper: Prometheus scrapes every second of wall time, and a real run spends all of it in "on" steps; here
half the wall time is "off" steps, so a 1 Hz wall-clock scraper would scrape twice as often per "on" step as a
real run does, and its scrapes would land in "off" steps too. So scrapes are paced by the accumulated time of
"on" steps (one per second of it, the real rate per step) and start only during an "on" step, at a random point
within it (a step's length after it starts, at most: a real scrape's phase is random), so the handler's
rendering competes with the training thread as it would; a scrape that outlasts its step, or has not started
when it ends, is served while the loop waits for telemetry to be idle, and lands in the upper bound.

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

from common import Row  # noqa: E402

TARGET = 0.01  # training-thread overhead under 1% of step time
EVAL_EVERY = 4  # an evaluation step every 4: one in each block below
BLOCK = 4  # step pairs per block: ABBA twice (on off, off on, on off, off on), one evaluation period
WARMUP = BLOCK  # steps of each round left out (first calls: allocator, lazy state); a whole block, so blocks align
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

    def start(self, delay: float) -> None:
        self._delay = delay
        self._step_done.clear()
        self._idle.clear()
        self._go.set()

    def wait_idle(self) -> None:
        """Called when the step has ended: a scrape still waiting starts now; returns once it is served."""
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
    rounds: list[int] = field(default_factory=list)  # pairs per round
    scrapes: int = 0
    mismatches: int = 0  # steps whose scores differ between the two trainers (must be 0: the same work)

    def diff(self, upper: bool = False) -> list[float]:
        return [a + (w if upper else 0.0) - b for a, w, b in zip(self.on, self.wait, self.off)]

    def diff_unqueued(self) -> list[float]:
        """``on - off`` without the time the training thread sat runnable in the run queue (others' load)."""
        return [(a - qa) - (b - qb) for a, qa, b, qb in zip(self.on, self.queued_on, self.off, self.queued_off)]

    def mean_se(self, values: list[float]) -> tuple[float, float]:
        """Mean and its standard error over blocks of ``BLOCK`` consecutive pairs of one round: a drift that is
        linear over an ABBA half cancels in it, and each block holds one evaluation step, so the blocks are closer
        to independent, and alike, than single pairs are."""
        blocks, start = [], 0
        for n in self.rounds:
            blocks += [statistics.fmean(values[i:min(i + BLOCK, start + n)]) for i in range(start, start + n, BLOCK)]
            start += n
        mean = statistics.fmean(values)
        se = statistics.stdev(blocks) / len(blocks) ** 0.5 if len(blocks) > 1 else float("nan")
        return mean, se

    def overhead(self, upper: bool = False) -> tuple[float, float]:
        """(mean on - off) / mean off, and its standard error (that of the difference over the mean off step;
        the mean off step's own error is second order for an overhead near 0)."""
        mean, se = self.mean_se(self.diff(upper))
        off = statistics.fmean(self.off)
        return mean / off, se / off

    def summary(self, name: str) -> str:
        ms = 1e3
        off, on = statistics.fmean(self.off), statistics.fmean(self.on)
        d, d_se = self.mean_se(self.diff())
        u, u_se = self.mean_se(self.diff(upper=True))
        o, o_se = self.overhead()
        ub, ub_se = self.overhead(upper=True)
        cpu_d, cpu_se = self.mean_se([a - b for a, b in zip(self.main_cpu_on, self.main_cpu_off)])
        cpu_off = statistics.fmean(self.main_cpu_off)
        run_d, run_se = self.mean_se(self.diff_unqueued())
        run_off = statistics.fmean(self.off) - statistics.fmean(self.queued_off)
        return "\n".join([
            f"{name}: {len(self.on)} step pairs in {len(self.rounds)} round(s), {self.scrapes} scrapes"
            + (f", {self.mismatches} PAIRS WITH DIFFERENT SCORES" if self.mismatches else ", the same work"),
            f"  step: off {off * ms:.2f} ms, on {on * ms:.2f} ms (mean, eval steps included)",
            f"  training thread: {d * ms:+.3f} +- {d_se * ms:.3f} ms -> overhead {o:+.2%} +- {o_se:.2%} "
            f"(target < {TARGET:.0%}: {'pass' if o < TARGET else 'FAIL'})",
            f"  upper bound (+ wait for telemetry idle, {statistics.fmean(self.wait) * ms:.2f} ms): "
            f"{u * ms:+.3f} +- {u_se * ms:.3f} ms -> {ub:+.2%} +- {ub_se:.2%}",
            f"  less the training thread's run-queue wait (others' load; off {(off - run_off) * ms:.2f} ms, "
            f"on {statistics.fmean(self.queued_on) * ms:.2f} ms): {run_d * ms:+.3f} +- {run_se * ms:.3f} ms -> "
            f"{run_d / run_off:+.2%} +- {run_se / run_off:.2%}",
            f"  in the on step: statistics + aggregation + log() {statistics.fmean(self.logging) * ms:.2f} ms, "
            f"the rest (phases, scrapes) {(d - statistics.fmean(self.logging)) * ms:.2f} ms; "
            f"training-thread CPU on - off {cpu_d * ms:+.3f} +- {cpu_se * ms:.3f} ms "
            f"({cpu_d / cpu_off:+.2%} +- {cpu_se / cpu_off:.2%} of the off step's {cpu_off * ms:.1f} ms CPU)",
            f"  other threads' CPU per step: on step + wait {statistics.fmean(self.other_cpu_on) * ms:.2f} ms, "
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


def _round(config, seed: int, on_first: bool, out: Paired) -> None:
    """One round: two trainers of ``config`` with ``seed``, their steps interleaved ABBA; appends to ``out``."""
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
        scraper = _Scraper(tel.metrics_url)
        stack.callback(scraper.close)
        gc_clock = stack.enter_context(_GcClock())
        built = {}
        for side in (("on", "off") if on_first else ("off", "on")):
            built[side] = _Trainer(cfg, tmp / side)
        on_trainer, off_trainer = built["on"], built["off"]
        since_scrape, last_on = 0.0, 0.0
        pairs, samples = 0, 0
        for step in range(cfg.steps):
            record = step >= WARMUP
            order = ("on", "off") if (step % 2 == 0) == on_first else ("off", "on")
            scores = {}
            for side in order:
                p0, m0, q0, g0 = time.process_time(), time.thread_time(), _queued(), gc_clock.total
                if side == "off":
                    t0 = time.perf_counter()
                    report = _step(off_trainer, None, step, samples)
                    it = time.perf_counter() - t0
                    q1, m1, p1 = _queued(), time.thread_time(), time.process_time()
                    scores["off"] = report.score
                    if record:
                        out.off.append(it)
                        out.queued_off.append(q1 - q0)
                        out.gc_off.append(gc_clock.total - g0)
                        out.main_cpu_off.append(m1 - m0)
                        out.other_cpu_off.append((p1 - p0) - (m1 - m0))
                    continue
                if since_scrape >= SCRAPE_PERIOD_S:  # the real rate per "on" step, at a random point within one
                    since_scrape = 0.0
                    scraper.start(rng.uniform(0.0, last_on))
                client = scraper.cpu_s
                t0 = time.perf_counter()
                report = _step(on_trainer, tel, step, samples)
                t1 = time.perf_counter()
                q1, m1, g1 = _queued(), time.thread_time(), gc_clock.total
                tel.flush()
                scraper.wait_idle()
                t2 = time.perf_counter()
                p2, m2 = time.process_time(), time.thread_time()
                last_on = t1 - t0
                since_scrape += last_on
                scores["on"] = report.score
                if record:
                    out.on.append(t1 - t0)
                    out.queued_on.append(q1 - q0)
                    out.gc_on.append(g1 - g0)
                    out.wait.append(t2 - t1)
                    out.logging.append(t1 - t0 - report.seconds)
                    out.main_cpu_on.append(m1 - m0)
                    out.other_cpu_on.append((p2 - p0) - (m2 - m0) - (scraper.cpu_s - client))
            samples += cfg.batch_size
            out.mismatches += scores["on"] != scores["off"]
            pairs += record
        out.rounds.append(pairs)
        out.scrapes += scraper.count


def measure(config, rounds: int) -> Paired:
    """``rounds`` rounds of paired, ABBA-interleaved steps (seed + round; the side built and run first
    alternating)."""
    out = Paired()
    for r in range(rounds):
        _round(config, config.seed + r, r % 2 == 0, out)
    return out


def configs(quick: bool, big: bool, steps: int | None, rounds: int) -> list[tuple[str, object, int]]:
    """(name, config, rounds) of each configuration measured."""
    from rl_otel.demo.ppo import DemoConfig

    steps = steps or (3 * BLOCK if quick else 16 * BLOCK)
    steps = -(-steps // BLOCK) * BLOCK  # whole blocks (the last step of a run evaluates too: it ends one)
    out: list[tuple[str, object, int]] = [("demo step (B=128, hidden 256)",
                                           DemoConfig(steps=steps, eval_every=EVAL_EVERY), rounds)]
    if big:  # a ~3 s step, ~30x the default's: a quarter of the steps, a third of the rounds (~1 s of effect each)
        out.append(("demo step (B=512, hidden 1024)",
                    DemoConfig(steps=max(WARMUP + 2 * BLOCK, steps // 4 // BLOCK * BLOCK), eval_every=EVAL_EVERY,
                               batch_size=512, minibatch_size=256, hidden=1024), max(1, rounds // 3)))
    return out


def rows(quick: bool = False, big: bool = False, steps: int | None = None, rounds: int | None = None,
         details: list[str] | None = None) -> list[Row]:
    """The table rows; ``details`` collects each configuration's :meth:`Paired.summary`."""
    rounds = rounds or (1 if quick else 6)
    out = []
    for name, config, n in configs(quick, big, steps, rounds):
        p = measure(config, n)
        if details is not None:
            details.append(p.summary(name))
        on, off = statistics.fmean(p.on), statistics.fmean(p.off)
        o, o_se = p.overhead()
        ub, ub_se = p.overhead(upper=True)
        out.append(Row(f"{name}, rl_otel fully on, training thread (overhead +- {o_se:.2%})", on * 1e3,
                       off * 1e3, "ms", f"overhead < {TARGET:.0%}", o < TARGET, "the same step, telemetry off"))
        out.append(Row(f"{name}: + wait for background work, upper bound (+- {ub_se:.2%})",
                       (on + statistics.fmean(p.wait)) * 1e3, off * 1e3, "ms", "-", None,
                       "the same step, telemetry off"))
        out.append(Row(f"{name}: ppo_stats + rollout/eval aggregation + log() in it",
                       statistics.fmean(p.logging) * 1e3, off * 1e3, "ms", "-", None, "the step, telemetry off"))
        out.append(Row(f"{name}: other threads' CPU per step", statistics.fmean(p.other_cpu_on) * 1e3, off * 1e3,
                       "ms", "-", None, "the step, telemetry off"))
    return out


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16 * BLOCK,
                        help=f"steps per round, rounded up to a multiple of {BLOCK} (the first {WARMUP}: warm-up)")
    parser.add_argument("--rounds", type=int, default=6, help="the standard error falls as 1/sqrt(rounds)")
    parser.add_argument("--big", action="store_true", help="also a heavier configuration (batch 512, hidden 1024)")
    args = parser.parse_args()
    if args.steps <= WARMUP + BLOCK:
        parser.error(f"--steps must be more than {WARMUP + BLOCK}")
    details: list[str] = []
    result = rows(big=args.big, steps=args.steps, rounds=args.rounds, details=details)
    print(table(result))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
