"""Every README snippet runs as written: each ```python block (unless marked ``<!-- illustrative: why -->`` on the
line before it: a framework's code needing ROLL, TRL, ...) runs in a fresh interpreter, in an empty directory, with
no RL_OTEL_*/RANK variables; every ```yaml block parses; the set-up section holds exactly the two commands.

The snippets serve Prometheus on port 0 (a free port) on loopback and reach no server outside this machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
_FENCE = re.compile(r"^(?P<marker><!-- illustrative:[^>]*-->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)


def _blocks(lang: str) -> list[tuple[int, str, bool]]:
    """``(line, code, illustrative)`` of the README's fenced blocks in ``lang``."""
    return [(README.count("\n", 0, m.start("body")) + 1, m.group("body"), bool(m.group("marker")))
            for m in _FENCE.finditer(README) if m.group("lang") == lang]


RUNNABLE = [(line, code) for line, code, illustrative in _blocks("python") if not illustrative]


def test_the_snippets_are_found():
    assert len(RUNNABLE) >= 4
    # an illustrative block says why it does not run
    for m in re.finditer(r"<!-- illustrative:([^>]*)-->", README):
        assert m.group(1).strip(), "say why the block is illustrative"


@pytest.mark.parametrize("line, code", RUNNABLE, ids=[f"README.md:{line}" for line, _ in RUNNABLE])
def test_python_snippet_runs_as_written(line, code, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RL_OTEL_", "OTEL_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"README.md line {line}:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    # no port was taken from the machine's well-known ones, and the snippet said something
    assert ":9464/" not in proc.stdout, proc.stdout
    assert proc.stdout.strip(), f"README.md line {line} printed nothing"


def test_yaml_snippets_parse():
    blocks = _blocks("yaml")
    assert len(blocks) >= 6
    for line, code, _ in blocks:
        # an indented scrape job is a list item of scrape_configs: parse it as one
        text = code if not code.startswith("  - ") else "scrape_configs:\n" + code
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AssertionError(f"README.md line {line}: {exc}") from None


def test_the_set_up_section_holds_exactly_the_two_commands():
    section = README.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    commands = [code.strip() for _, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S)]
    assert commands == ["python3 -m pip install -c requirements-test.txt -e '.[demo]' && rl-otel demo",
                        "bash scripts/test.sh"]
    assert (ROOT / "scripts/test.sh").is_file()


def test_every_local_link_points_at_a_file():
    for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", README):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), target


def test_every_anchor_names_a_section():
    def slug(title: str) -> str:  # GitHub's: lowercase, punctuation dropped, spaces to dashes
        return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title.strip().lower()))

    anchors = {slug(t) for t in re.findall(r"^#+ (.*)$", README, re.M)}
    for anchor in re.findall(r"\]\(#([^)]+)\)", README):
        assert anchor in anchors, anchor
