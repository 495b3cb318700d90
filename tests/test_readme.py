"""Every documentation snippet runs as written, and every link lands.

The pages are README.md and docs/*.md. Each ```python block (unless marked ``<!-- illustrative: why -->`` on the
line before it: a framework's code needing ROLL, TRL, ...) runs in a fresh interpreter, in an empty directory, with
no RL_OTEL_*/RANK variables; every ```yaml block parses; every local link names a file and every anchor a heading
of that page; the README stays short and its set-up section holds exactly the two commands.

The snippets serve Prometheus on port 0 (a free port) on loopback and reach no server outside this machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README = (ROOT / "README.md").read_text()
_FENCE = re.compile(r"^(?P<marker><!-- illustrative:[^>]*-->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(lang: str) -> list[tuple[str, int, str, bool]]:
    """``(page, line, code, illustrative)`` of the pages' fenced blocks in ``lang``."""
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [(_name(page), text.count("\n", 0, m.start("body")) + 1, m.group("body"), bool(m.group("marker")))
                  for m in _FENCE.finditer(text) if m.group("lang") == lang]
    return found


RUNNABLE = [(page, line, code) for page, line, code, illustrative in _blocks("python") if not illustrative]


def test_the_snippets_are_found():
    assert len([r for r in RUNNABLE if r[0] == "README.md"]) >= 2
    assert len(RUNNABLE) >= 4
    # an illustrative block says why it does not run
    for page in PAGES:
        for m in re.finditer(r"<!-- illustrative:([^>]*)-->", page.read_text()):
            assert m.group(1).strip(), f"{_name(page)}: say why the block is illustrative"


@pytest.mark.parametrize("page, line, code", RUNNABLE, ids=[f"{p}:{line}" for p, line, _ in RUNNABLE])
def test_python_snippet_runs_as_written(page, line, code, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RL_OTEL_", "OTEL_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{page} line {line}:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    # no port was taken from the machine's well-known ones, and the snippet said something
    assert ":9464/" not in proc.stdout, proc.stdout
    assert proc.stdout.strip(), f"{page} line {line} printed nothing"


def test_the_quick_start_shows_a_served_series():
    """The quick start scrapes its own endpoint before closing it: the reader sees a series, not a dead URL."""
    code = next(code for page, _, code in RUNNABLE if page == "README.md")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    from tests.promtools import samples

    served = samples(proc.stdout, "rl_critic_score")
    labels = frozenset({("run", "exp1"), ("role", "trainer"), ("rank", "0"), ("stat", "mean")})
    assert served == {labels: 0.41}, proc.stdout + proc.stderr
    # the line the README quotes as the output is the line printed, character for character
    quoted = re.search(r"It prints `(rl_critic_score[^`]*)`", README)
    assert quoted is not None and quoted.group(1) in proc.stdout.splitlines(), (quoted, proc.stdout)


def test_yaml_snippets_parse():
    blocks = _blocks("yaml")
    assert len(blocks) >= 6
    for page, line, code, _ in blocks:
        # an indented scrape job is a list item of scrape_configs: parse it as one
        text = code if not code.startswith("  - ") else "scrape_configs:\n" + code
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AssertionError(f"{page} line {line}: {exc}") from None


def test_the_set_up_section_holds_exactly_the_two_commands():
    section = README.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    commands = [code.strip() for _, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S)]
    assert commands == ["python3 -m venv .venv && .venv/bin/pip install $(python3 scripts/torch_index.py) "
                        "-c requirements-test.txt -e '.[demo]' && .venv/bin/rl-otel demo",
                        "bash scripts/test.sh"]
    assert (ROOT / "scripts/test.sh").is_file() and (ROOT / "scripts/torch_index.py").is_file()
    # what a machine without a GPU gets is said before the first command, not after it
    assert " ".join(section.split()).index("without one**, adds PyTorch's CPU index") < \
        " ".join(section.split()).index("```")
    # what the reader needs once the demo runs: it waits for Ctrl-C, and how to change that
    words = " ".join(section.split())
    assert "keeps serving until you press Ctrl-C" in words and "`--linger SECONDS`" in words


def test_the_readme_speaks_of_the_readers_machine_only():
    """No sentence about the machines the project was built on: a reader elsewhere cannot act on it."""
    for page in (README, (ROOT / "scripts/test.sh").read_text(), (ROOT / "docs/install.md").read_text()):
        for phrase in ("project machines", "these machines", "on these machines", "keep one on disk"):
            assert phrase not in page, phrase


def test_the_stdout_trackers_lines_stay_out_of_the_loops_own_output():
    """"Wire it into your loop": the stdout tracker writes from its own thread. Its summary lines go to stderr, so
    the program's stdout holds its own two lines only; and on a terminal (both streams on one screen, line by line)
    they come after the first line and before the last, never after it."""
    code = next(code for page, _, code in RUNNABLE if page == "README.md" and 'run="ppo-exp1"' in code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    apart = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert apart.returncode == 0, apart.stderr
    own = apart.stdout.splitlines()
    assert [line.split()[0] for line in own] == ["Prometheus", "last"], apart.stdout
    assert [int(line.split()[1]) for line in apart.stderr.splitlines() if line.startswith("step ")] == [0, 10, 20]
    together = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONUNBUFFERED": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = [line.split()[0] for line in together.stdout.splitlines()]
    assert lines == ["Prometheus", "step", "step", "step", "last"], together.stdout


def test_the_readme_reads_in_minutes():
    assert len(README) <= 25_000, f"README.md is {len(README):,} characters; move a section to docs/"


def _slug(title: str) -> str:  # GitHub's: lowercase, punctuation dropped, spaces to dashes
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title.strip().lower()))


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)  # a '# comment' in code is no heading
    return {_slug(t) for t in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_local_link_lands(page):
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{_name(page)}: {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{_name(page)}: {target}#{anchor}"
