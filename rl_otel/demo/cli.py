"""``rl-otel demo``: the command around :func:`rl_otel.demo.run` - options, telemetry set-up, progress bar.

What a person sees fits one screen: a header with where to look (the metrics URL, the TensorBoard command, with
the path of the ``tensorboard`` installed beside this Python), a progress bar redrawn in place, a summary line of
the stdout tracker every tenth of the run, and a closing line. In an interactive terminal the endpoint then stays up
until Ctrl-C (a newcomer has time to look); in a pipe or a container it closes unless ``--linger`` says otherwise.
It serves on loopback unless ``--host`` asks for more.

The demo writes nothing into the current directory: each run's TensorBoard files go in a directory of its own,
``<run>-<time>``. Without ``--log-dir``, every invocation gets a new parent under the user's cache directory
(``$XDG_CACHE_HOME/rl_otel/demo/<time>``, else ``~/.cache/...``), the only ones its TensorBoard command shows, and
only the newest :data:`KEPT_INVOCATIONS` of this user's are kept (nothing else there is deleted); with
``--log-dir DIR`` the runs go in ``DIR`` and nothing is deleted.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

KEPT_INVOCATIONS = 5  # demo invocations kept in the cache directory; older ones are deleted when a new one starts
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def default_log_dir() -> Path:
    """The parent of every demo invocation's directory when no ``--log-dir`` is given: the user's cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "rl_otel" / "demo"


def _unique(base: Path) -> Path:
    path, n = base, 1
    while path.exists():  # started twice within one second
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run_dir(log_dir: str | os.PathLike, run: str) -> Path:
    """One run's directory under ``log_dir``: its name and start time, so no run writes into another's history
    (``--repeat``, or the same ``--run`` twice) and TensorBoard names the run after it, never ``.``."""
    return _unique(Path(log_dir) / f"{run}-{time.strftime('%Y%m%d-%H%M%S')}")


def invocation_dir(log_dir: str | os.PathLike | None) -> Path:
    """The directory this invocation's runs go in, and the one its TensorBoard command shows.

    ``--log-dir DIR``: ``DIR`` itself (the user's directory: nothing in it is deleted). Otherwise a new
    ``<cache>/rl_otel/demo/<time>``, so TensorBoard shows this invocation's runs and not every earlier demo's; the
    older invocations beyond the newest :data:`KEPT_INVOCATIONS` are deleted first (the cache stays small)."""
    if log_dir is not None:
        return Path(log_dir)
    parent = default_log_dir()
    prune_invocations(parent, keep=KEPT_INVOCATIONS - 1)  # room for the one made now
    return _unique(parent / time.strftime("%Y%m%d-%H%M%S"))


_INVOCATION = re.compile(r"\d{8}-\d{6}(-\d+)?")  # the names invocation_dir() gives


def prune_invocations(parent: Path, keep: int) -> list[Path]:
    """Delete the demo's own invocations in ``parent`` but the ``keep`` newest; return them. Its own: a directory
    named as :func:`invocation_dir` names them and owned by this user - a cache directory shared by several users
    (``XDG_CACHE_HOME`` on a common disk) keeps everyone else's runs, and anything else put there stays."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        dirs = [p for p in parent.iterdir() if p.is_dir() and not p.is_symlink() and _INVOCATION.fullmatch(p.name)
                and (uid is None or p.stat().st_uid == uid)]
    except OSError:  # no cache directory yet
        return []
    dirs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    gone = dirs[max(keep, 0):]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def tensorboard_command(logdir: str | os.PathLike) -> str:
    """The command that shows ``logdir``, runnable as printed: ``tensorboard`` when the shell finds the one installed
    beside this Python, else that one's path (a venv that is not activated: ``.venv/bin/tensorboard``), else
    ``python -m tensorboard.main``."""
    beside = Path(sys.executable).parent / "tensorboard"
    found = shutil.which("tensorboard")
    if beside.is_file() and found is not None and Path(found).resolve() == beside.resolve():
        program = "tensorboard"
    elif beside.is_file():
        program = _shortest(beside)
    else:
        program = f"{_shortest(Path(sys.executable))} -m tensorboard.main"
    return f"{program} --logdir {logdir}"


def _shortest(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it (``.venv/bin/tensorboard``), else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return os.path.join(".", os.fspath(absolute.relative_to(Path.cwd())))
    except ValueError:
        return os.fspath(absolute)


def interactive() -> bool:
    """A person at a terminal: stdin and stderr are both terminals (not a pipe, a container's log, CI)."""
    return sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty()


def linger_after(args: argparse.Namespace, run_index: int) -> float:
    """Seconds to keep serving after run ``run_index`` (0-based): ``--linger`` after every run; by default, in an
    interactive terminal, after the last run until Ctrl-C (``inf``), else not at all."""
    if args.linger is not None:
        return float(args.linger)
    last = args.repeat != 0 and run_index == args.repeat - 1
    return math.inf if last and interactive() else 0.0


def run_name(args: argparse.Namespace) -> str:
    """``--run``, else ``$RL_OTEL_RUN`` (set by docker-compose and the Kubernetes example), else ``demo-<seed>``."""
    return args.run or os.environ.get("RL_OTEL_RUN") or f"demo-{args.seed}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (the tracker options come from :func:`rl_otel.cli.add_tracker_arguments`)."""
    from rl_otel._internal.runtime.options import DEFAULT_PORT
    from rl_otel.demo import DEFAULT_STEPS

    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="PPO steps (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="scrape endpoint port; 0 picks a free port "
                                                               "(default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve /metrics on (default %(default)s, this machine only; 0.0.0.0: every "
                             "interface, e.g. in a container)")
    parser.add_argument("--log-dir", default=None,
                        help="where the default TensorBoard tracker writes, a directory <run>-<time> per run "
                             "(default: a new ~/.cache/rl_otel/demo/<time> per invocation, the last "
                             f"{KEPT_INVOCATIONS} kept)")
    parser.add_argument("--run", default=None,
                        help="the run's name, a label on every series (default: $RL_OTEL_RUN, else demo-<seed>)")
    parser.add_argument("--linger", type=_seconds, default=None, metavar="SECONDS",
                        help="keep serving /metrics this long after each run ('inf': until Ctrl-C; default: until "
                             "Ctrl-C after the last run in an interactive terminal, else 0)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="train N runs back to back, named <run>-1, <run>-2, ... with seeds seed, seed+1, ...; "
                             "0: forever (docker-compose: a live run to look at, never a stalled one; default 1)")
    parser.add_argument("--no-trackers", action="store_true",
                        help="Prometheus only: no stdout/TensorBoard mirror")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--linger must be 0 or more seconds ('inf': until Ctrl-C), got {text!r}")
    return value


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


class CtrlC:
    """Ctrl-C remembered: Python runs a signal handler wherever the main thread is, and a ``KeyboardInterrupt``
    raised inside a finalizer (a ``__del__``, a weakref callback, a garbage collection) is printed as "Exception
    ignored" and lost, so training went on to its end (seen once on a loaded machine: step 120 of 200 41 s after
    the Ctrl-C). The demo raises a Ctrl-C it saw again at the next step and in its linger."""

    def __init__(self) -> None:
        self.seen = False
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the Ctrl-C seen (and possibly lost) since the demo started."""
        if self.seen:
            raise KeyboardInterrupt


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
    parent = invocation_dir(args.log_dir)
    runs = itertools.count() if args.repeat == 0 else range(args.repeat)
    try:
        with CtrlC() as ctrl_c:
            return _runs(args, tracker_options, base, parent, runs, ctrl_c)
    except KeyboardInterrupt:  # Ctrl-C while training: the Telemetry has closed its trackers; no traceback
        print("\nrl-otel demo: stopped (Ctrl-C)", file=sys.stderr)
        return 130


def _runs(args: argparse.Namespace, tracker_options: dict[str, Any], base: str, parent: Path, runs: Any,
          ctrl_c: CtrlC) -> int:
    for i in runs:
        # one run: a fresh Telemetry (its series leave the endpoint when it closes, so a finished run never
        # looks stalled), the next seed, the run name numbered when runs repeat
        label = base if args.repeat == 1 else f"{base}-{i + 1}"
        code = _one_run(args, tracker_options, label, args.seed + i, parent, linger_after(args, i), ctrl_c)
        if code is not None:
            return code
    return 0


def _one_run(args: argparse.Namespace, tracker_options: dict[str, Any], label: str, seed: int, parent: Path,
             linger: float, ctrl_c: CtrlC) -> int | None:
    """Train and linger once; an exit code to stop with (an error, or Ctrl-C while lingering), else None."""
    import rl_otel
    from rl_otel.demo.ppo import DemoConfig, run

    config = DemoConfig(steps=args.steps, seed=seed)
    options = tracker_choice(args, tracker_options, run_dir(parent, label))
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
        bound = "" if args.host in LOOPBACK else f"  (listening on {args.host})"
        print(f"  metrics:     {tel.metrics_url}{bound}", file=err)
        tb = next((t.kwargs.get("log_dir") or t.kwargs.get("logdir") or os.path.join("runs", tel.config.run)
                   for t in tel.config.trackers if t.name == "tensorboard"), None)
        if tb is not None and "tensorboard" in tel.trackers:  # the parent: TensorBoard names the run by its folder
            print(f"  tensorboard: {tensorboard_command(os.path.dirname(os.path.abspath(tb)))}", file=err)
        print(f"  trackers:    {', '.join(tel.trackers) or 'none'} (rank {tel.config.rank})", file=err)
        err.flush()
        bar = None if args.no_progress else ProgressBar(args.steps, err)

        def on_step(report: Any) -> None:
            ctrl_c.check()
            if bar is not None:
                bar(report)

        started = time.perf_counter()
        result = run(config, telemetry=tel, on_step=on_step)
        tel.flush(timeout_s=10.0)
        first, last = _window_mean(result.scores, 10, head=True), _window_mean(result.scores, 10, head=False)
        print(f"rl-otel demo: done in {time.perf_counter() - started:.1f}s; mean reward {first:.3f} (first 10 steps)"
              f" -> {last:.3f} (last 10)", file=err)
        if linger > 0:
            try:  # a Ctrl-C from the moment the line is out is the stop it asks for (a loaded machine may pause us
                # between the line and the sleep)
                if math.isinf(linger):
                    print(f"rl-otel demo: still serving {tel.metrics_url} - press Ctrl-C to stop", file=err)
                else:
                    print(f"rl-otel demo: serving {tel.metrics_url} for {linger:g}s more (Ctrl-C stops)", file=err)
                err.flush()
                _sleep(linger, ctrl_c)
            except KeyboardInterrupt:
                return 0
    return None


def _sleep(seconds: float, ctrl_c: CtrlC) -> None:
    """``time.sleep`` that also takes ``inf`` (which ``time.sleep`` refuses), ended by a Ctrl-C."""
    while seconds > 0:
        ctrl_c.check()
        chunk = min(seconds, 1.0)
        time.sleep(chunk)
        seconds -= chunk


def _window_mean(values: list[float], n: int, *, head: bool) -> float:
    window = values[:n] if head else values[-n:]
    return sum(window) / len(window) if window else float("nan")
