"""``rl-otel demo``: the command around :func:`rl_otel.demo.run` - options, telemetry set-up, progress bar."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO, Any

DEFAULT_LOG_DIR = "rl_otel_demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (the tracker options come from :func:`rl_otel.cli.add_tracker_arguments`)."""
    from rl_otel.demo import DEFAULT_STEPS

    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="PPO steps (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default %(default)s)")
    parser.add_argument("--port", type=int, default=9464, help="scrape endpoint port; 0 picks a free port "
                                                               "(default %(default)s)")
    parser.add_argument("--host", default="0.0.0.0", help="address to serve /metrics on (default %(default)s)")
    parser.add_argument("--log-dir", default=DEFAULT_LOG_DIR,
                        help="where the default TensorBoard tracker writes (<log-dir>/tensorboard)")
    parser.add_argument("--run", default=None, help="the run's name, a label on every series (default demo-<seed>)")
    parser.add_argument("--linger", type=float, default=0.0, metavar="SECONDS",
                        help="keep serving /metrics this long after training ends (default %(default)s)")
    parser.add_argument("--no-trackers", action="store_true",
                        help="Prometheus only: no stdout/TensorBoard mirror")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def tracker_choice(args: argparse.Namespace, tracker_options: dict[str, Any]) -> dict[str, Any]:
    """init() tracker options: the ones given, else stdout + TensorBoard under ``--log-dir``."""
    if args.no_trackers:
        return {"trackers": {}}
    if any(k in tracker_options for k in ("track_with", "trackers", "config")):
        return tracker_options
    return {**tracker_options, "trackers": {"stdout": {},
                                            "tensorboard": {"log_dir": os.path.join(args.log_dir, "tensorboard")}}}


class ProgressBar:
    """One line on ``stream``, redrawn in place on a terminal; a line every 10% otherwise (logs stay short).

    ``redraw=False`` forces the line mode: the stdout tracker writing to the same terminal would break a line
    being redrawn.
    """

    def __init__(self, total: int, stream: IO[str], redraw: bool = True) -> None:
        self.total, self.stream = total, stream
        self.tty = redraw and stream.isatty()
        self.t0 = time.perf_counter()
        self.last_eval: float | None = None
        self._printed = -1

    def __call__(self, report: Any) -> None:
        if report.eval_score is not None:
            self.last_eval = report.eval_score
        done = report.step + 1
        width = 24
        filled = width * done // self.total
        evals = f"  eval {self.last_eval:.3f}" if self.last_eval is not None else ""
        line = (f"[{'#' * filled}{'.' * (width - filled)}] step {done}/{self.total}  reward {report.score:.3f}"
                f"{evals}  {time.perf_counter() - self.t0:.0f}s")
        if self.tty:
            self.stream.write(f"\r\033[K{line}" + ("\n" if done == self.total else ""))
        elif done * 10 // self.total != self._printed or done == self.total:
            self._printed = done * 10 // self.total
            self.stream.write(line + "\n")
        self.stream.flush()


def main(args: argparse.Namespace, tracker_options: dict[str, Any]) -> int:
    """Run the demo as the command line asked; prints where to look, then trains, then lingers."""
    import rl_otel
    from rl_otel.demo.ppo import DemoConfig, run

    try:
        config = DemoConfig(steps=args.steps, seed=args.seed)
    except ValueError as exc:
        print(f"rl-otel demo: {exc}", file=sys.stderr)
        return 2
    options = tracker_choice(args, tracker_options)
    try:
        tel = rl_otel.init(run=args.run or f"demo-{args.seed}", prometheus={"host": args.host, "port": args.port},
                           **options)
    except rl_otel.ConfigurationError as exc:
        print(f"rl-otel demo: {exc}", file=sys.stderr)
        return 2
    err = sys.stderr
    with tel:
        print(f"rl-otel demo: PPO on a counting task, {args.steps} steps, seed {args.seed}", file=err)
        print(f"  metrics:     {tel.metrics_url}", file=err)
        tb = next((t.kwargs.get("log_dir") or t.kwargs.get("logdir") or os.path.join("runs", tel.config.run)
                   for t in tel.config.trackers if t.name == "tensorboard"), None)
        if tb is not None and "tensorboard" in tel.trackers:
            print(f"  tensorboard: tensorboard --logdir {tb}", file=err)
        print(f"  trackers:    {', '.join(tel.trackers) or 'none'} (rank {tel.config.rank})", file=err)
        err.flush()
        stdout_on_tty = "stdout" in tel.trackers and sys.stdout.isatty()
        bar = None if args.no_progress else ProgressBar(args.steps, err, redraw=not stdout_on_tty)
        started = time.perf_counter()
        result = run(config, telemetry=tel, on_step=bar)
        tel.flush(timeout_s=10.0)
        first, last = _window_mean(result.scores, 10, head=True), _window_mean(result.scores, 10, head=False)
        print(f"rl-otel demo: done in {time.perf_counter() - started:.1f}s; mean reward {first:.3f} (first 10 steps)"
              f" -> {last:.3f} (last 10)", file=err)
        if args.linger > 0:
            print(f"rl-otel demo: serving {tel.metrics_url} for {args.linger:g}s more (Ctrl-C stops)", file=err)
            err.flush()
            try:
                time.sleep(args.linger)
            except KeyboardInterrupt:
                pass
    return 0


def _window_mean(values: list[float], n: int, *, head: bool) -> float:
    window = values[:n] if head else values[-n:]
    return sum(window) / len(window) if window else float("nan")
