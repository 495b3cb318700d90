"""``python3 -m rl_otel.ops [--root DIR] [--check] [--runbook-base URL | --grafana-url URL] [--threshold NAME=VALUE
...]``: (re)generate the operations files.

``--threshold`` lowers (or raises) an alert's threshold for a test or a short job (``--threshold
phase_stuck_min_seconds=60 --threshold progress_stall_min_seconds=60``; the names are rl_otel/ops/thresholds.py's).
The alert tests (``prometheus/tests``) are laid out for thresholds within some bounds: with thresholds outside them
that file is left as it is and the command says which bound they break.

Each alert's ``runbook_url`` opens its panel of the runbook dashboard in the Grafana shipped beside the rule file (the
compose file's on http://localhost:3000; for the Kubernetes PrometheusRule, the Grafana of the Prometheus' external
label ``grafana_url``) unless ``--runbook-base`` (your page of docs/runbook.md) or ``--grafana-url`` (the runbook
dashboard in your Grafana) says otherwise; a base given that opens only on this machine is warned about.

The files live in a checkout of the rl_otel repository (``prometheus/``, ``grafana/``, ``deploy/kubernetes/``). The
root is ``--root``, else the current directory when it is a checkout, else the checkout this ``rl_otel`` package
was imported from (``pip install -e .``); an installed wheel has none, and the command says so instead of writing
the files somewhere unexpected.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_otel.ops import runbook
from rl_otel.ops.generate import TESTS_FILE, find_root, is_checkout, render_all, stale, write_all
from rl_otel.ops.promtests import ThresholdsOutsideTests
from rl_otel.ops.rules import RunbookLinks
from rl_otel.ops.thresholds import DEFAULT, Thresholds


def _thresholds(pairs: list[str]) -> Thresholds:
    overrides: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"--threshold takes NAME=VALUE (e.g. phase_stuck_min_seconds=60), got {pair!r}")
        overrides[name.strip()] = value.strip()
    return DEFAULT.replaced(overrides) if overrides else DEFAULT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rl_otel.ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None,
                        help="the repository checkout (default: the current directory if it is one, else the "
                             "checkout rl_otel is imported from)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--runbook-base", default=None, metavar="URL",
                       help="the URL of docs/runbook.md as your on-call engineers open it (your fork, your wiki): "
                            "runbook_url is URL#<alert in lower case> (default: the runbook dashboard of the Grafana "
                            "shipped with the rules: http://localhost:3000 for compose, the external label "
                            "grafana_url of the Kubernetes Prometheus)")
    where.add_argument("--grafana-url", default=None, metavar="URL",
                       help="instead: your team's Grafana (provisioned with grafana/dashboards/): runbook_url opens "
                            "the alert's panel of the generated runbook dashboard there")
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                        help="an alert threshold of rl_otel/ops/thresholds.py for this generation (repeatable), "
                             "e.g. phase_stuck_min_seconds=60 or progress_stall_for=1m")
    args = parser.parse_args(argv)
    prog = "python3 -m rl_otel.ops"
    try:
        thresholds = _thresholds(args.threshold)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
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
    try:
        links = RunbookLinks(grafana_url=args.grafana_url, runbook_base=args.runbook_base)
        base = links.base
    except (ValueError, RuntimeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    why = runbook.unreachable(base) if links.chosen else None  # the shipped Grafana's is local by design
    if why is not None:
        print(f"{prog}: warning: the alerts' runbook_url start with {base}, which opens for nobody paged off this "
              f"machine ({why}); pass --runbook-base URL or --grafana-url URL that your on-call "
              f"engineers open", file=sys.stderr)
    try:
        files = render_all(thresholds, links=links)
    except ThresholdsOutsideTests as exc:  # the rules and dashboards still follow the thresholds given
        files = render_all(thresholds, links=links, tests=False)
        print(f"{prog}: warning: {exc}; {TESTS_FILE} is left as it is", file=sys.stderr)
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
