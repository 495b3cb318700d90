"""Real Prometheus parts for tests: scrapes, promtool, and a prometheus server on loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def require_binary(name: str) -> str:
    """The path of ``name``; in CI a missing binary fails the test (never skips), elsewhere it skips."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs the Debian 'prometheus' package")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return path


def scrape(url: str, accept: str | None = None) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def promtool_check(text: str) -> str:
    """``promtool check metrics`` output (errors and lint warnings) for an exposition; '' when clean."""
    proc = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    return (proc.stdout + proc.stderr).strip() + ("" if proc.returncode == 0 else f"\n(exit {proc.returncode})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free on loopback (now)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def key_samples(url: str, key: str, run: str) -> dict[frozenset, float]:
    """Samples of logged ``key``'s Prometheus series for ``run`` on the endpoint ``url``, labels without run/rank."""
    from rl_otel.catalog import default_catalog

    resolved = default_catalog().resolve(key).to_dict()
    found = samples(scrape(url), resolved["prometheus_name"])
    return {frozenset(kv for kv in k if kv[0] not in ("run", "role", "rank")): v for k, v in found.items()
            if ("run", run) in k}


class PrometheusServer:
    """A real ``prometheus`` on 127.0.0.1 with its own temp dir, scraping ``targets`` every second.

    ``scrape_configs`` (dicts, as in prometheus.yml) replace the static ``targets`` job - file_sd, TLS, basic
    auth; ``rule_files`` are loaded as the config's ``rule_files`` (recording and alerting rules); ``flags`` are
    more command-line flags (``--enable-feature=exemplar-storage``).
    """

    def __init__(self, tmp: Path, targets: list[str] | None = None, scrape_interval: str = "1s", *,
                 scrape_configs: list[dict] | None = None, rule_files: list[Path] | None = None,
                 flags: tuple[str, ...] = ()) -> None:
        import yaml

        binary = require_binary("prometheus")
        self.port = free_port()
        config = tmp / "prometheus.yml"
        if scrape_configs is None:
            scrape_configs = [{"job_name": "rl_otel", "static_configs": [{"targets": list(targets or [])}]}]
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "scrape_configs": scrape_configs,
            **({"rule_files": [str(p) for p in rule_files]} if rule_files else {}),
        }, sort_keys=False))
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (Prometheus' output, open while it runs)
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).read()
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def api(self, path: str, params: dict[str, str] | list[tuple[str, str]] | None = None) -> object:
        """``data`` of a successful ``GET /api/v1/<path>``."""
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", {"query": promql})["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` lists."""
        return self.api(f"label/{label}/values", [("match[]", match)])

    def wait_for_scrapes(self, n: int = 2, timeout: float = 30.0) -> None:
        """Wait until every target has been scraped successfully at least ``n`` times."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query("count_over_time(up[1m])")
            ups = self.query("up")
            if result and all(float(r["value"][1]) >= n for r in result) and all(u["value"][1] == "1" for u in ups):
                return
            time.sleep(0.5)
        raise TimeoutError(f"targets not scraped {n} times; up={self.query('up')}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def samples(text: str, name: str) -> dict[frozenset, float]:
    """``{frozenset(labels.items()): value}`` for every sample named exactly ``name`` in an exposition."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
            out[frozenset(labels.items())] = float(m.group(2))
    return out
