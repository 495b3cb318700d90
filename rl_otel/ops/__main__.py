"""``python3 -m rl_otel.ops [--root DIR] [--check] [--runbook-base URL]``: (re)generate the operations files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_otel.ops.generate import render_all, stale, write_all
from rl_otel.ops.rules import RUNBOOK_BASE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rl_otel.ops", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: current dir)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--runbook-base", default=RUNBOOK_BASE, help="URL of docs/runbook.md for runbook_url")
    args = parser.parse_args(argv)
    files = render_all(runbook_base=args.runbook_base)
    if args.check:
        bad = stale(args.root, files)
        for rel in bad:
            print(f"stale: {rel}", file=sys.stderr)
        return 1 if bad else 0
    for rel in write_all(args.root, files):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
