"""An engine server as a Prometheus scrape target (``tel.engine(url, name=...)``): the target group a file_sd
targets file holds for it.

A vLLM or SGLang server that a framework starts (prime-rl, SkyRL, AReaL, slime's routers) serves its own
``/metrics``; Prometheus scrapes it there, nothing is served again. The group carries the run's labels (``run``,
``role``, ``rank`` of the process that published it), ``replica`` (the engine's name) and ``rl_target="engine"``
(what tells an engine's ``up`` from a training process's in the rules), and the URL's scheme and path as
Prometheus' ``__scheme__`` and ``__metrics_path__``. The rl_otel scrape job's ``honor_labels: true`` keeps an
engine's own labels where they clash (none of vLLM's or SGLang's does).
"""

from __future__ import annotations

import urllib.parse

TARGET_LABEL = "rl_target"
ENGINE = "engine"


def parse_engine_url(url: object) -> tuple[str, dict[str, str]]:
    """``(host:port, {"__scheme__": ..., "__metrics_path__": ...})`` of an engine's metrics URL (the path defaults
    to ``/metrics``); ``ValueError`` naming the URL when it is not an absolute http(s) URL with a host and port."""
    if not isinstance(url, str):
        raise ValueError(f"tel.engine(url) must be a string such as 'http://10.0.0.5:8000', got {url!r}")
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.query or parts.fragment:
        raise ValueError(f"tel.engine(url) must be an http(s) URL with a host and a port such as "
                         f"'http://10.0.0.5:8000/metrics', got {url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", {"__scheme__": parts.scheme, "__metrics_path__": parts.path or "/metrics"}


def engine_labels(name: str) -> dict[str, str]:
    """The labels telling an engine target apart: its ``replica`` and ``rl_target``."""
    return {"replica": name, TARGET_LABEL: ENGINE}
