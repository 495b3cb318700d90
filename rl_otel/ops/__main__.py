"""``python3 -m rl_otel.ops [--root DIR] [--check] [--grafana-url URL | --runbook-base URL]``: (re)generate the
operations files.

The files live in a checkout of the rl_otel repository (``prometheus/``, ``grafana/``, ``deploy/kubernetes/``). The
root is ``--root``, else the current directory when it is a checkout, else the checkout this ``rl_otel`` package
was imported from (``pip install -e .``); an installed wheel has none, and the command says so instead of writing
the files somewhere unexpected.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_otel.ops.generate import find_root, is_checkout, render_all, stale, write_all
from rl_otel.ops.rules import RunbookLinks
from rl_otel.ops.runbook import GRAFANA_URL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rl_otel.ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None,
                        help="the repository checkout (default: the current directory if it is one, else the "
                             "checkout rl_otel is imported from)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--grafana-url", default=GRAFANA_URL,
                        help="the Grafana your on-call engineers open: each alert's runbook_url opens its panel of "
                             "the generated runbook dashboard there (default %(default)s, docker-compose's)")
    parser.add_argument("--runbook-base", default=None, metavar="URL",
                        help="instead: the URL of docs/runbook.md as your users open it (your fork's page): "
                             "runbook_url is URL#<alert in lower case>")
    args = parser.parse_args(argv)
    prog = "python3 -m rl_otel.ops"
    if args.root is not None and not is_checkout(args.root):
        print(f"{prog}: {args.root} is not a checkout of the rl_otel repository (no prometheus/ and "
              f"rl_otel/ops/ there)", file=sys.stderr)
        return 2
    root = args.root if args.root is not None else find_root(Path.cwd())
    if root is None:
        print(f"{prog}: run it from a checkout of the rl_otel repository (git clone, then pip install -e .), or "
              f"pass --root DIR; the current directory is not one and rl_otel is not imported from one",
              file=sys.stderr)
        return 2
    files = render_all(links=RunbookLinks(grafana_url=args.grafana_url, runbook_base=args.runbook_base))
    if args.check:
        bad = stale(root, files)
        for rel in bad:
            print(f"stale: {rel}", file=sys.stderr)
        if bad:
            print(f"{prog}: {len(bad)} of {len(files)} generated files in {root} are stale; run {prog} to "
                  f"regenerate them", file=sys.stderr)
            return 1
        print(f"{prog}: all {len(files)} generated files in {root} are up to date")
        return 0
    written = write_all(root, files)
    for rel in written:
        print(f"wrote {rel}")
    print(f"{prog}: {len(written)} of {len(files)} generated files in {root} written, "
          f"{len(files) - len(written)} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
