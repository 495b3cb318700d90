"""Scrape helpers shared by the end-to-end tests: an HTTP GET of the endpoint and ``promtool check metrics``."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def promtool_problems(text: str) -> str:
    """promtool's complaints about an exposition ("" when clean: no error, no lint warning)."""
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    return (proc.stdout + proc.stderr).strip() if proc.returncode or proc.stdout or proc.stderr else ""


def samples(text: str, name: str) -> dict[frozenset, float]:
    """``{frozenset(labels.items()): value}`` for every sample named exactly ``name``."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
            out[frozenset(labels.items())] = float(m.group(2))
    return out
