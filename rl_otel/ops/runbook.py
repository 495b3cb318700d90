"""The alert runbook where an on-call engineer can open it: a Grafana dashboard of docs/runbook.md.

An alert's ``runbook_url`` must open something. The repository's own docs/runbook.md has no address that works
everywhere (a fork, an air-gapped cluster), while the Grafana that docker-compose and the Kubernetes example run is
there wherever the alerts are. So the runbook is generated into ``grafana/dashboards/rl-otel-runbook.json``: one
Markdown text panel per alert, in the order of the alert rules, and an alert's default ``runbook_url`` opens its
panel (``?viewPanel=<id>``). ``python3 -m rl_otel.ops --grafana-url URL`` points the links at another Grafana;
``--runbook-base URL`` at a page of docs/runbook.md instead (``URL#<alert in lower case>``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

UID = "rl-otel-runbook"
TITLE = "RL alert runbook"
GRAFANA_URL = "http://localhost:3000"  # docker-compose's Grafana (the Kubernetes example port-forwards to it)
RUNBOOK_MD = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"


def sections(text: str | None = None) -> dict[str, str]:
    """``{alert name: its section's Markdown}`` from docs/runbook.md (the text after each ``## Name`` heading)."""
    text = RUNBOOK_MD.read_text(encoding="utf-8") if text is None else text
    parts = re.split(r"^## (\S+)[ \t]*$", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def panel_url(alert_names: list[str], name: str, grafana_url: str = GRAFANA_URL) -> str:
    """The URL that opens ``name``'s panel of the runbook dashboard."""
    return f"{grafana_url.rstrip('/')}/d/{UID}/{UID}?viewPanel={alert_names.index(name) + 1}"


def dashboard(alert_names: list[str]) -> dict[str, object]:
    """The runbook dashboard: panel ``i + 1`` is ``alert_names[i]``'s section, full width."""
    found = sections()
    missing = [name for name in alert_names if name not in found]
    if missing:
        raise ValueError(f"docs/runbook.md has no section for {', '.join(missing)}")
    panels: list[dict[str, object]] = []
    y = 0
    for i, name in enumerate(alert_names):
        body = found[name]
        height = max(6, min(20, 2 + len(body) // 110 + body.count("\n")))
        panels.append({"id": i + 1, "type": "text", "title": name, "gridPos": {"h": height, "w": 24, "x": 0, "y": y},
                       "options": {"mode": "markdown", "content": body}})
        y += height
    return {"uid": UID, "title": TITLE,
            "description": "What to do when an rl_otel alert fires: each alert's runbook_url opens its panel "
                           "(generated from docs/runbook.md by python3 -m rl_otel.ops).",
            "tags": ["rl_otel"], "timezone": "browser", "editable": True, "schemaVersion": 39, "version": 1,
            "links": [{"title": "RL dashboards", "type": "dashboards", "tags": ["rl_otel"], "asDropdown": True,
                       "includeVars": False, "keepTime": True}],
            "annotations": {"list": []}, "templating": {"list": []}, "panels": panels}


def render(alert_names: list[str]) -> str:
    return json.dumps(dashboard(alert_names), indent=2, ensure_ascii=False) + "\n"
