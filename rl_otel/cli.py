"""The ``rl-otel`` command: ``rl-otel catalog [--format table|json|markdown]``, ``rl-otel catalog resolve KEY...``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-otel", description="OpenTelemetry/Prometheus for RL training.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    cat = sub.add_parser("catalog", help="print the metric catalog, or resolve keys against it")
    cat.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    cat_sub = cat.add_subparsers(dest="catalog_command")
    resolve = cat_sub.add_parser("resolve", help="print one JSON object per key: what the key becomes")
    resolve.add_argument("keys", nargs="+", metavar="KEY")
    return parser


def _catalog(args: argparse.Namespace) -> int:
    from rl_otel.catalog import default_catalog

    catalog = default_catalog()
    if args.catalog_command == "resolve":
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
    args = _parser().parse_args(argv)
    if args.version:
        from rl_otel import __version__

        print(__version__)
        return 0
    if args.command == "catalog":
        return _catalog(args)
    _parser().print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
