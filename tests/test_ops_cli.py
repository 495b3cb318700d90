"""``python3 -m rl_otel.ops``: says what it did, finds the checkout from anywhere, refuses a directory that is not
one (instead of calling every file stale)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rl_otel.ops import __main__ as ops_main
from rl_otel.ops import generate

ROOT = Path(__file__).resolve().parent.parent


def _fake_checkout(root: Path) -> Path:
    (root / "rl_otel" / "ops").mkdir(parents=True)
    (root / "rl_otel" / "ops" / "generate.py").write_text("")
    (root / "prometheus").mkdir()
    (root / "grafana").mkdir()
    return root


def test_outside_the_repository_it_checks_the_checkout_it_is_imported_from(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rl_otel.ops", "--check"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    n = len(generate.render_all())
    assert proc.stdout.strip() == f"python3 -m rl_otel.ops: all {n} generated files in {ROOT} are up to date"
    assert list(tmp_path.iterdir()) == []


def test_writing_says_what_it_wrote(tmp_path, capsys):
    root = _fake_checkout(tmp_path / "checkout")
    n = len(generate.render_all())
    assert ops_main.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(out[:-1]) == sorted(f"wrote {rel}" for rel in generate.render_all())
    assert out[-1] == f"python3 -m rl_otel.ops: {n} of {n} generated files in {root} written, 0 already up to date"
    assert ops_main.main(["--root", str(root)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"0 of {n} generated files in {root} written, "
                                                     f"{n} already up to date")
    (root / "grafana/dashboards/rl-otel-fleet.json").write_text("{}")
    assert ops_main.main(["--root", str(root), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: grafana/dashboards/rl-otel-fleet.json" in err and f"1 of {n} generated files" in err


def test_a_directory_that_is_no_checkout_is_refused(tmp_path, capsys, monkeypatch):
    assert ops_main.main(["--root", str(tmp_path), "--check"]) == 2
    assert "is not a checkout of the rl_otel repository" in capsys.readouterr().err
    # installed from a wheel (no checkout beside the package) and run elsewhere: it says where to run it
    monkeypatch.setattr(generate, "__file__", str(tmp_path / "site-packages/rl_otel/ops/generate.py"))
    monkeypatch.chdir(tmp_path)
    assert ops_main.main(["--check"]) == 2
    assert "run it from a checkout of the rl_otel repository" in capsys.readouterr().err


def test_runbook_links_that_open_only_here_are_warned_about_and_bad_ones_refused(tmp_path, capsys):
    root = _fake_checkout(tmp_path / "checkout")
    assert ops_main.main(["--root", str(root), "--grafana-url", "http://localhost:3000"]) == 0
    err = capsys.readouterr().err
    assert "warning: the alerts' runbook_url start with http://localhost:3000" in err
    assert "localhost is a reserved name" in err and "--runbook-base URL" in err
    alerts = (root / "prometheus/rules/rl_otel_alerts.yml").read_text()
    assert "runbook_url: http://localhost:3000/d/rl-otel-runbook/rl-otel-runbook?viewPanel=1" in alerts
    # a base anyone can open: no warning, and the Kubernetes manifest carries the same links
    assert ops_main.main(["--root", str(root), "--runbook-base", "https://git.corp.example.com/ml/rl_otel/runbook"]) \
        == 0
    assert "warning" not in capsys.readouterr().err
    k8s = (root / "deploy/kubernetes/prometheusrule.yaml").read_text()
    assert "runbook_url: https://git.corp.example.com/ml/rl_otel/runbook#rltrainerstalled" in k8s
    # no base given: the shipped Grafanas' links, local by design (compose's Grafana), no warning, no dead name
    assert ops_main.main(["--root", str(root)]) == 0
    assert "warning" not in capsys.readouterr().err
    alerts = (root / "prometheus/rules/rl_otel_alerts.yml").read_text()
    assert "runbook_url: http://localhost:3000/d/rl-otel-runbook/rl-otel-runbook?viewPanel=1" in alerts
    assert "example.invalid" not in alerts + (root / "deploy/kubernetes/prometheusrule.yaml").read_text()
    assert ops_main.main(["--root", str(root), "--runbook-base", "runbook.md"]) == 2
    assert "--runbook-base must be an absolute http(s) URL" in capsys.readouterr().err
