"""Where an alert's ``runbook_url`` opens, and the runbook as a Grafana dashboard.

An alert's ``runbook_url`` must open for the person paged. The project has no public home to link to, so by
default each shipped rule file links to the alert's panel of the generated runbook dashboard (``grafana/dashboards/
rl-otel-runbook.json``: one Markdown text panel per alert, in the order of the alert rules) in the Grafana that
ships beside it: docker-compose.yml's on ``http://localhost:3000``; for the Kubernetes PrometheusRule, the Grafana
named by the Prometheus' external label ``grafana_url`` (a Go template Prometheus expands; localhost:3000, a
port-forward, without it) - see :data:`rl_otel.ops.rules.KUBERNETES_GRAFANA`. Two options of
``python3 -m rl_otel.ops`` point the links elsewhere:

- ``--runbook-base URL``: ``URL#<anchor>``, the page of ``docs/runbook.md`` as your team opens it (your fork, your
  wiki, an internal mirror); the anchor is the one a Markdown renderer gives the ``## <AlertName>`` heading;
- ``--grafana-url URL``: the alert's panel of the runbook dashboard in your team's Grafana,
  ``URL/d/rl-otel-runbook/rl-otel-runbook?viewPanel=<n>``.

A link to a loopback address or to a name that never resolves (``.invalid``, ``.example``, ``.test``,
``.localhost``) opens for nobody but, at best, the machine it was generated on: :func:`unreachable` says why, and
the command warns.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import urllib.parse
from pathlib import Path

UID = "rl-otel-runbook"
TITLE = "RL alert runbook"
ROOT = Path(__file__).resolve().parents[2]  # the checkout the generator runs in (rl_otel/ops/runbook.py -> .)
RUNBOOK_MD = ROOT / "docs" / "runbook.md"
PYPROJECT = ROOT / "pyproject.toml"
RUNBOOK_PATH = "blob/main/docs/runbook.md"  # the file in the repository's default branch, as the forges link it
# top-level names reserved never to resolve publicly (RFC 2606, RFC 6761)
_RESERVED_TLDS = frozenset({"invalid", "example", "test", "localhost", "local"})


def sections(text: str | None = None) -> dict[str, str]:
    """``{alert name: its section's Markdown}`` from docs/runbook.md (the text after each ``## Name`` heading)."""
    text = RUNBOOK_MD.read_text(encoding="utf-8") if text is None else text
    parts = re.split(r"^## (\S+)[ \t]*$", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation dropped, spaces
    to hyphens): ``RLTrainerStalled`` -> ``rltrainerstalled``."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def anchors(text: str | None = None) -> set[str]:
    """The anchors of every heading of docs/runbook.md."""
    text = RUNBOOK_MD.read_text(encoding="utf-8") if text is None else text
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # a "# comment" in a code block is no heading
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+?)[ \t]*#*$", text, flags=re.M)}


@functools.lru_cache(maxsize=1)
def source_url(pyproject: Path = PYPROJECT) -> str:
    """The project's source repository: ``Source`` of ``[project.urls]`` in ``pyproject.toml``."""
    try:
        import tomllib
    except ModuleNotFoundError as exc:  # Python 3.10: the generator is a maintainer's tool, run on 3.11+
        raise RuntimeError("python3 -m rl_otel.ops needs Python 3.11 or later (tomllib reads pyproject.toml)") \
            from exc
    try:
        urls = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["urls"]
        return str(urls["Source"]).rstrip("/")
    except (OSError, KeyError) as exc:
        raise RuntimeError(f"{pyproject} has no [project.urls] Source: the default runbook links need the "
                           "project's source repository; pass --runbook-base or --grafana-url") from exc


def default_base() -> str:
    """``docs/runbook.md`` in the project's source repository: the default base of every ``runbook_url``."""
    return f"{source_url()}/{RUNBOOK_PATH}"


def check_url(url: str, option: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host and no fragment; else ``ValueError`` naming it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(f"{option} must be an absolute http(s) URL without a #fragment (the alert's anchor is "
                         f"added), got {url!r}")
    return url


def unreachable(url: str) -> str | None:
    """Why a link to ``url`` would not open off the machine it was made on, or ``None``."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and (address.is_loopback or address.is_unspecified):
        return f"{host} is this machine's own address"
    tld = host.rsplit(".", 1)[-1]
    if host == "localhost" or tld in _RESERVED_TLDS:
        return f"{host} is a reserved name (RFC 2606, RFC 6761): no one else's resolver finds it"
    return None


def panel_url(alert_names: list[str], name: str, grafana_url: str) -> str:
    """The URL that opens ``name``'s panel of the runbook dashboard in the Grafana at ``grafana_url``."""
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
            "description": "What to do when an rl_otel alert fires, a panel per alert (generated from "
                           "docs/runbook.md by python3 -m rl_otel.ops; with --grafana-url, each alert's "
                           "runbook_url opens its panel here).",
            "tags": ["rl_otel"], "timezone": "browser", "editable": True, "schemaVersion": 39, "version": 1,
            "links": [{"title": "RL dashboards", "type": "dashboards", "tags": ["rl_otel"], "asDropdown": True,
                       "includeVars": False, "keepTime": True}],
            "annotations": {"list": []}, "templating": {"list": []}, "panels": panels}


def render(alert_names: list[str]) -> str:
    return json.dumps(dashboard(alert_names), indent=2, ensure_ascii=False) + "\n"
