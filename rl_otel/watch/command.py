"""The ``rl-otel watch`` and ``rl-otel backfill`` subcommands (their arguments and their mains).

Light to import (the CLI builds its parser with it): Telemetry, protobuf and the catalog load when a command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rl_otel._internal.runtime.options import BY_NAME, DEFAULT_HOST, DEFAULT_PORT

_FRAMEWORK_HELP = ("the framework whose keys the files hold: auto (inferred from the keys), roll, verl, trl, trinity, "
                   "openrlhf, slime, areal, nemo_rl, skyrl, prime_rl; its catalog resolves the keys, and it is shown "
                   "as rl.framework in target_info")


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    """``rl-otel watch PATH... [--host H] [--port P] [--file-sd DIR] [--state FILE] [--framework F] ...``"""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="TensorBoard log directories, event files or JSONL metric files to follow")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address the endpoint binds (default {DEFAULT_HOST}, every interface: what Prometheus "
                             "scrapes binds every interface, as rl_otel.init() does; only the demo, a toy on your own "
                             "machine, binds 127.0.0.1. Pass 127.0.0.1 to keep it to this machine)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the port every run is served on (default {DEFAULT_PORT}; 0: any free port; with "
                             "--port-per-run the first port, each run and rank taking the next free one)")
    parser.add_argument("--port-search", type=int, default=100, help="ports tried after --port (default 100)")
    parser.add_argument("--port-per-run", action="store_true",
                        help="an endpoint (and a file_sd target) per run and rank instead of one for all")
    parser.add_argument("--file-sd", metavar="DIR", help="publish the target(s) for Prometheus file_sd_configs")
    parser.add_argument("--advertise-host", metavar="HOST", help="the host written in the file_sd targets")
    parser.add_argument("--state", metavar="FILE", type=Path,
                        help="state file (offsets, last values); default: <user cache>/rl_otel/watch-<hash>.json")
    parser.add_argument("--no-state", action="store_true", help="keep no state: read every file from its start")
    parser.add_argument("--framework", default="auto", help=_FRAMEWORK_HELP)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls of the files (0.5)")
    parser.add_argument("--expire-after", type=float, default=None, metavar="SECONDS",
                        help="close a run whose files have not grown for this long, as a finished training closes "
                             "(default: serve every run until the watcher stops; a hung training stops writing "
                             "too, so with expiry RLTrainerStalled cannot page for it)")
    parser.add_argument("--checkpoint-interval", type=float, default=1.0,
                        help="seconds between saves of the state file, when something moved (1.0)")
    parser.add_argument("--step-key", action="append", metavar="KEY",
                        help="JSONL field holding the step (repeatable; default: step, _step, global_step, ...)")
    parser.add_argument("--max-unknown-keys", type=int, default=BY_NAME["max_unknown_keys"].default,
                        help="keys without a catalog entry served per run (init's max_unknown_keys)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each file and run as it is found")


def add_backfill_arguments(parser: argparse.ArgumentParser) -> None:
    """``rl-otel backfill PATH... -o out.om``"""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="finished TensorBoard directories or JSONL files")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the OpenMetrics file to write")
    parser.add_argument("--step-key", action="append", metavar="KEY", help="JSONL field holding the step")
    parser.add_argument("--max-unknown-keys", type=int, default=BY_NAME["max_unknown_keys"].default,
                        help="keys without a catalog entry written per run (as init's max_unknown_keys)")
    parser.add_argument("--framework", default="auto", help=_FRAMEWORK_HELP)


def watch_main(args: argparse.Namespace) -> int:
    """Run ``rl-otel watch`` until SIGTERM/SIGINT; 2 on a bad option."""
    from rl_otel.errors import ConfigurationError
    from rl_otel.watch import frameworks, jsonl
    from rl_otel.watch.served import ServeOptions
    from rl_otel.watch.state import default_path
    from rl_otel.watch.watcher import Watcher, WatchOptions, run_until_signalled

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("rl_otel.watch").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        framework = frameworks.normalize(args.framework)
    except ValueError as exc:
        print(f"rl-otel watch: {exc}", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print("rl-otel watch: --interval must be > 0", file=sys.stderr)
        return 2
    if args.expire_after is not None and args.expire_after <= 0:
        print("rl-otel watch: --expire-after must be > 0 seconds", file=sys.stderr)
        return 2
    serve = ServeOptions(host=args.host, port=args.port, port_search=args.port_search, file_sd=args.file_sd,
                         advertise_host=args.advertise_host, framework=framework,
                         max_unknown_keys=args.max_unknown_keys, port_per_run=args.port_per_run)
    options = WatchOptions(serve=serve, interval_s=args.interval, checkpoint_s=args.checkpoint_interval,
                           expire_s=args.expire_after, freeze_gc=True,
                           state_path=None if args.no_state else (args.state or default_path(args.paths)),
                           step_keys=tuple(args.step_key) if args.step_key else jsonl.STEP_KEYS)
    print(f"rl-otel watch: following {', '.join(args.paths)}; state "
          f"{options.state_path or 'off'}", file=sys.stderr, flush=True)
    try:
        watcher = Watcher(args.paths, options)
    except ConfigurationError as exc:
        print(f"rl-otel watch: {exc}", file=sys.stderr)
        return 2
    run_until_signalled(watcher)
    return 0


def backfill_main(args: argparse.Namespace) -> int:
    """Run ``rl-otel backfill``; prints a summary and the promtool command that loads the file."""
    from rl_otel.watch import frameworks, jsonl
    from rl_otel.watch.backfill import backfill

    try:
        framework = frameworks.normalize(args.framework)
    except ValueError as exc:
        print(f"rl-otel backfill: {exc}", file=sys.stderr)
        return 2
    summary = backfill(args.paths, args.output, max_unknown_keys=args.max_unknown_keys,
                       step_keys=tuple(args.step_key) if args.step_key else jsonl.STEP_KEYS, framework=framework)
    print(f"rl-otel backfill: {summary.runs} runs, {summary.series} series, {summary.samples} samples -> "
          f"{args.output} ({summary.corrupt} corrupt records, {summary.untimed} records without a time left out)",
          file=sys.stderr)
    for key, why in list(summary.refused.items())[:10]:
        print(f"  not written: {key}: {why}", file=sys.stderr)
    print(f"load it with: promtool tsdb create-blocks-from openmetrics {args.output} DATA_DIR", file=sys.stderr)
    return 0
