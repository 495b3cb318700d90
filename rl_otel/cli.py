"""The ``rl-otel`` command.

``rl-otel catalog [--format table|json|markdown] [--framework NAME]``, ``rl-otel catalog [--framework NAME] resolve
KEY...``,
``rl-otel trackers [--config exp.yaml] [--track-with NAME] [--tracker-kwargs JSON] [--tracker NAME=JSON]``
(prints the tracker configuration init() would use, secrets redacted), ``rl-otel demo [--steps N] [--port P]
...`` (a real small PPO run on CPU, see :mod:`rl_otel.demo`), ``rl-otel watch PATH...`` and
``rl-otel backfill PATH... -o out.om`` (TensorBoard event files and JSONL metric files, see :mod:`rl_otel.watch`).
:func:`add_tracker_arguments` and :func:`tracker_options` give any command the same tracker options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def add_tracker_arguments(parser: argparse.ArgumentParser) -> None:
    """The tracker options, as in ROLL's YAML: ``--track-with``/``--tracker-kwargs`` or ``--tracker`` per sink."""
    group = parser.add_argument_group("trackers")
    group.add_argument("--config", metavar="FILE", help="YAML file with init() options (ROLL's track_with, ...)")
    group.add_argument("--track-with", metavar="NAME", help="tracker name(s), comma-separated (ROLL's track_with)")
    group.add_argument("--tracker-kwargs", metavar="JSON", type=_json_object,
                       help="JSON kwargs: flat for one tracker, keyed by tracker name for several")
    group.add_argument("--tracker", metavar="NAME[=JSON]", action="append", default=None,
                       help="a tracker and its JSON kwargs, e.g. --tracker tensorboard='{\"log_dir\": \"tb\"}' "
                            "(repeatable; instead of --track-with)")
    group.add_argument("--tracker-ranks", metavar="RANKS",
                       help="ranks that mirror to trackers: 'all' or comma-separated ranks (default 0)")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def tracker_options(args: argparse.Namespace) -> dict[str, Any]:
    """init() keyword arguments from the options of :func:`add_tracker_arguments` (only those given)."""
    options: dict[str, Any] = {}
    if args.config:
        options["config"] = args.config
    if args.track_with:
        options["track_with"] = args.track_with
    if args.tracker_kwargs is not None:
        options["tracker_kwargs"] = args.tracker_kwargs
    if args.tracker:
        trackers: dict[str, Any] = {}
        for item in args.tracker:
            name, _, kwargs = item.partition("=")
            trackers[name.strip()] = _json_object(kwargs) if kwargs else {}
        options["trackers"] = trackers
    if args.tracker_ranks:
        options["tracker_ranks"] = ("all" if args.tracker_ranks == "all"
                                    else [int(r) for r in args.tracker_ranks.split(",")])
    return options


def _parser() -> argparse.ArgumentParser:
    from rl_otel.demo.cli import add_arguments as demo_arguments  # light: torch loads when the demo runs

    parser = argparse.ArgumentParser(prog="rl-otel", description="OpenTelemetry/Prometheus for RL training.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    cat = sub.add_parser("catalog", help="print the metric catalog, or resolve keys against it")
    cat.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                     help="a table to read, JSON for a program, or the markdown of docs/metrics.md (default table)")
    cat.add_argument("--framework", default=None, metavar="NAME",
                     help="the catalog a run of this framework resolves its keys in (default: every framework's "
                          "entries; for resolve, the catalog of a run that names no framework)")
    cat_sub = cat.add_subparsers(dest="catalog_command")
    resolve = cat_sub.add_parser("resolve", help="print one JSON object per key: what the key becomes")
    resolve.add_argument("keys", nargs="+", metavar="KEY",
                         help="keys as your training logs them (critic/score/mean, actor/approxkl, ...): the "
                              "Prometheus name, labels and catalog entry each becomes")
    trk = sub.add_parser("trackers", help="print the tracker configuration init() would use (secrets redacted)")
    trk.add_argument("--list", action="store_true", help="list the registered tracker sinks")
    add_tracker_arguments(trk)
    from rl_otel.ops.budget import add_arguments as budget_arguments

    budget_arguments(sub.add_parser("budget", help="active series of a job per rank, node and job (8, 64, 1024 GPUs)"))
    demo = sub.add_parser("demo", help="train a small PPO run on CPU, serving /metrics and mirroring to trackers "
                                       "(needs pip install -e '.[demo]' in the checkout)")
    demo_arguments(demo)
    add_tracker_arguments(demo)
    from rl_otel.watch.command import add_backfill_arguments, add_watch_arguments  # light: argparse only

    add_watch_arguments(sub.add_parser("watch", help="serve the TensorBoard event files and JSONL metric files a "
                                                     "training writes, as they grow (one endpoint for every run; "
                                                     "--port-per-run: one per run and rank)"))
    add_backfill_arguments(sub.add_parser("backfill", help="write finished runs' files as OpenMetrics with their "
                                                           "timestamps, for promtool tsdb create-blocks-from"))
    return parser


def _demo(args: argparse.Namespace) -> int:
    from rl_otel.demo.cli import main as demo_main

    try:
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"rl-otel demo needs torch and tensorboard: pip install -e '.[demo]' in the rl_otel checkout ({exc})",
              file=sys.stderr)
        return 2
    try:
        options = tracker_options(args)
    except ValueError as exc:
        print(f"rl-otel demo: {exc}", file=sys.stderr)
        return 2
    return demo_main(args, options)


def _trackers(args: argparse.Namespace) -> int:
    from rl_otel._internal.runtime.options import TRACKER_OPTIONS, load_config_file
    from rl_otel._internal.trackers.config import normalize_trackers
    from rl_otel.errors import ConfigurationError
    from rl_otel.sinks.base import registered_sinks

    if args.list:
        print("\n".join(registered_sinks()))
        return 0
    try:
        options = tracker_options(args)
        merged = load_config_file(options.pop("config")) if "config" in options else {}
        if any(k in options for k in TRACKER_OPTIONS):
            for k in TRACKER_OPTIONS:
                merged.pop(k, None)
        merged.update(options)
        specs = normalize_trackers(merged.get("track_with"), merged.get("tracker_kwargs"), merged.get("trackers"))
    except (ConfigurationError, ValueError) as exc:
        print(f"rl-otel: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"trackers": [s.to_dict() for s in specs],
                      "tracker_ranks": merged.get("tracker_ranks", 0)}, indent=2, default=str))
    return 0


def _catalog(args: argparse.Namespace) -> int:
    from rl_otel.catalog import default_catalog, every_entry

    try:
        catalog = every_entry() if args.framework is None else default_catalog(args.framework)
    except ValueError as exc:
        print(f"rl-otel catalog: {exc}", file=sys.stderr)
        return 2
    if args.catalog_command == "resolve":
        if args.framework is None:
            catalog = default_catalog()  # a run that names no framework resolves in the shared catalog
        for key in args.keys:
            print(json.dumps(catalog.resolve(key).to_dict(), sort_keys=True))
        return 0
    if args.format == "json":
        print(catalog.to_json())
    elif args.format == "markdown":
        print(catalog.to_markdown())
    else:
        width = min(60, max(len(s.key) for s in catalog))
        for spec in catalog:
            print(f"{spec.key:<{width}}  {spec.kind.value:<9}  {spec.prometheus_name}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`rl-otel catalog | head`): stop quietly, as other command-line tools do. Python
        # flushes stdout again at exit, so point it at devnull first (the recipe of Python's signal docs)
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        from rl_otel import __version__

        print(__version__)
        return 0
    if args.command == "catalog":
        return _catalog(args)
    if args.command == "trackers":
        return _trackers(args)
    if args.command == "budget":
        from rl_otel.ops.budget import main as budget_main

        return budget_main(args)
    if args.command == "demo":
        return _demo(args)
    if args.command in ("watch", "backfill"):
        from rl_otel.watch import command

        return command.watch_main(args) if args.command == "watch" else command.backfill_main(args)
    _parser().print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
