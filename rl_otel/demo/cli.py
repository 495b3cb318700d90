"""``rl-otel demo``: the command around :func:`rl_otel.demo.run` - options, telemetry set-up, progress bar.

What a person sees fits one screen: a header with where to look (the metrics URL, the TensorBoard command), a
progress bar redrawn in place, a summary line of the stdout tracker every tenth of the run, and a closing line. The
demo writes nothing into the current directory: each run's TensorBoard files go in a directory of its own,
``<run>-<time>``, under the user's cache directory (``$XDG_CACHE_HOME/rl_otel/demo``, else ``~/.cache/...``) or
under ``--log-dir``; ``tensorboard --logdir`` that parent shows every run by its name.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import IO, Any


def default_log_dir() -> Path:
    """Where demo runs write when no ``--log-dir`` is given: the user's cache directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "rl_otel" / "demo"


def run_dir(log_dir: str | os.PathLike, run: str) -> Path:
    """One run's directory under ``log_dir``: its name and start time, so no run writes into another's history
    (``--repeat``, or the same ``--run`` twice) and TensorBoard names the run after it, never ``.``."""
    base = Path(log_dir) / f"{run}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():  # the same run name started twice within one second
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run_name(args: argparse.Namespace) -> str:
    """``--run``, else ``$RL_OTEL_RUN`` (set by docker-compose and the Kubernetes example), else ``demo-<seed>``."""
    return args.run or os.environ.get("RL_OTEL_RUN") or f"demo-{args.seed}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (the tracker options come from :func:`rl_otel.cli.add_tracker_arguments`)."""
    from rl_otel.demo import DEFAULT_STEPS

    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="PPO steps (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default %(default)s)")
    parser.add_argument("--port", type=int, default=9464, help="scrape endpoint port; 0 picks a free port "
                                                               "(default %(default)s)")
    parser.add_argument("--host", default="0.0.0.0", help="address to serve /metrics on (default %(default)s)")
    parser.add_argument("--log-dir", default=None,
                        help="where the default TensorBoard tracker writes, a directory <run>-<time> per run "
                             "(default: ~/.cache/rl_otel/demo)")
    parser.add_argument("--run", default=None,
                        help="the run's name, a label on every series (default: $RL_OTEL_RUN, else demo-<seed>)")
    parser.add_argument("--linger", type=float, default=0.0, metavar="SECONDS",
                        help="keep serving /metrics this long after training ends (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="train N runs back to back, named <run>-1, <run>-2, ... with seeds seed, seed+1, ...; "
                             "0: forever (docker-compose: a live run to look at, never a stalled one; default 1)")
    parser.add_argument("--no-trackers", action="store_true",
                        help="Prometheus only: no stdout/TensorBoard mirror")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def tracker_choice(args: argparse.Namespace, tracker_options: dict[str, Any], run_dir: str | os.PathLike
                   ) -> dict[str, Any]:
    """init() tracker options: the ones given, else a stdout summary line every tenth of the run and TensorBoard
    in ``run_dir``."""
    if args.no_trackers:
        return {"trackers": {}}
    if any(k in tracker_options for k in ("track_with", "trackers", "config")):
        return tracker_options
    return {**tracker_options, "trackers": {"stdout": {"every": max(1, args.steps // 10)},
                                            "tensorboard": {"log_dir": os.fspath(run_dir)}}}


class ProgressBar:
    """One line on ``stream``, redrawn in place on a terminal; a line every 10% otherwise (logs stay short).

    ``redraw=False`` forces the line mode. The stdout tracker may write to the same terminal: it clears the line
    first, and the bar comes back at the next step.
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
    """Run the demo as the command line asked: print where to look, train, linger; ``--repeat`` runs again."""
    from rl_otel.demo.ppo import DemoConfig

    try:
        DemoConfig(steps=args.steps, seed=args.seed)
    except ValueError as exc:
        print(f"rl-otel demo: {exc}", file=sys.stderr)
        return 2
    if args.repeat < 0:
        print(f"rl-otel demo: --repeat must be 0 (forever) or a number of runs, got {args.repeat}", file=sys.stderr)
        return 2
    base = run_name(args)
    runs = itertools.count() if args.repeat == 0 else range(args.repeat)
    for i in runs:
        # one run: a fresh Telemetry (its series leave the endpoint when it closes, so a finished run never looks
        # stalled), the next seed, the run name numbered when runs repeat
        label = base if args.repeat == 1 else f"{base}-{i + 1}"
        code = _one_run(args, tracker_options, label, args.seed + i)
        if code is not None:
            return code
    return 0


def _one_run(args: argparse.Namespace, tracker_options: dict[str, Any], label: str, seed: int) -> int | None:
    """Train and linger once; an exit code to stop with (an error, or Ctrl-C while lingering), else None."""
    import rl_otel
    from rl_otel.demo.ppo import DemoConfig, run

    config = DemoConfig(steps=args.steps, seed=seed)
    log_dir = args.log_dir if args.log_dir is not None else default_log_dir()
    options = tracker_choice(args, tracker_options, run_dir(log_dir, label))
    try:
        tel = rl_otel.init(run=label, prometheus={"host": args.host, "port": args.port}, **options)
    except rl_otel.PortInUseError:
        print(f"rl-otel demo: port {args.port} is already in use on {args.host} (another rl-otel demo?); "
              f"pass --port 0 for a free port, or --port N", file=sys.stderr)
        return 2
    except rl_otel.ConfigurationError as exc:
        print(f"rl-otel demo: {exc}", file=sys.stderr)
        return 2
    err = sys.stderr
    with tel:
        print(f"rl-otel demo: PPO on a counting task, run {tel.config.run!r}, {args.steps} steps, seed {seed}",
              file=err)
        print(f"  metrics:     {tel.metrics_url}", file=err)
        tb = next((t.kwargs.get("log_dir") or t.kwargs.get("logdir") or os.path.join("runs", tel.config.run)
                   for t in tel.config.trackers if t.name == "tensorboard"), None)
        if tb is not None and "tensorboard" in tel.trackers:  # the parent: TensorBoard names the run by its folder
            print(f"  tensorboard: tensorboard --logdir {os.path.dirname(os.path.abspath(tb))}", file=err)
        print(f"  trackers:    {', '.join(tel.trackers) or 'none'} (rank {tel.config.rank})", file=err)
        err.flush()
        bar = None if args.no_progress else ProgressBar(args.steps, err)
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
                return 0
    return None


def _window_mean(values: list[float], n: int, *, head: bool) -> float:
    window = values[:n] if head else values[-n:]
    return sum(window) / len(window) if window else float("nan")
