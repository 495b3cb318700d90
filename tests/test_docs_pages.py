"""The documentation a new user reads: the README's set-up short, task pages readable in five minutes, reference
pages marked as references, and docs/panels.md ("which key fills which panel") true to the catalog and dashboards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rl_otel.catalog import FRAMEWORKS, default_catalog
from rl_otel.catalog.concepts import concept
from rl_otel.ops import dashboards, panels
from rl_otel.ops.promql import metric_names

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TASK_PAGES = ("docs/install.md", "docs/deploy.md", "docs/demo.md", "docs/without-docker.md")
REFERENCES = ("docs/metrics.md", "docs/failure-behaviour.md", "docs/runbook.md", "docs/options.md", "docs/panels.md")
FIVE_MINUTES = 1200  # words, at ~240 a minute


def _words(markdown: str) -> int:
    return len(re.sub(r"```.*?```", " ", markdown, flags=re.S).split())


def test_the_set_up_section_says_under_150_words_before_its_first_command():
    section = README.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    assert len(section.split("```", 1)[0].split()) < 150
    assert len(README) <= 25_000


@pytest.mark.parametrize("page", TASK_PAGES)
def test_a_task_page_reads_in_five_minutes(page):
    assert _words((ROOT / page).read_text()) <= FIVE_MINUTES, page


def test_wiring_it_in_reads_in_five_minutes():
    section = README.split("## Wire it into your loop", 1)[1].split("\n## ", 1)[0]
    assert _words(section) <= FIVE_MINUTES


@pytest.mark.parametrize("page", REFERENCES)
def test_a_reference_says_so_at_its_top(page):
    top = (ROOT / page).read_text().split("\n\n", 3)[:3]
    assert any(part.startswith("**Reference**") for part in top), page


def test_the_panels_table_names_each_frameworks_keys_that_the_panels_read():
    """Every key docs/panels.md lists for a framework is that framework's catalog entry, and its Prometheus name is
    one the panel's concept reads; verl's policy loss panel is filled by actor/pg_loss, ROLL's by its own loss."""
    assert (ROOT / "docs/panels.md").read_text() == panels.markdown()
    by_title = {p.title: p for board in dashboards.dashboards() for p in board.panels}
    for framework in FRAMEWORKS:
        specs = {s.key: s for s in default_catalog(framework)}
        rows = panels.panel_keys(framework)
        assert rows, framework
        for _board, title, keys in rows:
            names = {n for src in concept(by_title[title].concept).sources for n in metric_names(src.selector)}
            for key in keys:
                assert specs[key].name in names, (framework, title, key)
    verl = {title: keys for _, title, keys in panels.panel_keys("verl")}
    assert "actor/pg_loss" in verl["Policy loss"]
    roll = {title: keys for _, title, keys in panels.panel_keys("roll")}
    assert any(k.endswith("/loss") or "loss" in k for k in roll["Policy loss"])
