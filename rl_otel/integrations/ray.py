"""rl_otel inside Ray actors: every actor's endpoint found by Prometheus through ``http_sd_configs``, served by the
driver - no shared filesystem, no fixed ports, no ``RANK``/``LOCAL_RANK`` needed.

ROLL, veRL, Trinity-RFT and OpenRLHF place their workers as Ray actors on whatever node has room; an actor's
address is known only once it runs. Each actor serves its own scrape endpoint on a free port and registers it,
with its ``run``, ``role`` and ``rank``, in a named Ray actor (the registry) that the driver creates; the driver
serves the registry as a Prometheus HTTP service-discovery endpoint::

    # driver, right after ray.init()
    from rl_otel.integrations import ray as rl_ray
    targets = rl_ray.serve_targets(port=9465)      # http://<driver host>:9465/targets

    # each actor
    @ray.remote(max_restarts=3)
    class Worker:
        def __init__(self, rank):
            self.tel = rl_otel.init(run="exp", role="actor_train", rank=rank, prometheus={"port": 0})
            self.target = rl_ray.register(self.tel)   # found by Prometheus within its refresh interval

    # prometheus.yml
    scrape_configs:
      - job_name: rl_otel_ray
        honor_labels: true
        http_sd_configs: [{url: "http://driver:9465/targets", refresh_interval: 15s}]

Why this and not Ray's own discovery: Ray writes ``/tmp/ray/prom_metrics_service_discovery.json`` on the head
node, for its own metrics agents (one per node, needing ``ray[default]``), not for an application's endpoints, and
Prometheus would have to read that file where it was written. Ray's GCS (named actors) already reaches every actor
of the job, so the registry travels on it, and Prometheus' standard ``http_sd_configs`` reads the result over HTTP.

Lifecycle: a registration is replaced by the next one of the same ``(run, role, rank)``, so an actor that Ray
restarts (``max_restarts``) re-registers on its new port and the old address disappears from the targets. An actor
that dies for good stays listed until the driver removes it: its ``up`` turns 0 and RLScrapeTargetDown fires, as
for any dead rank. :meth:`Registration.close` (also at process exit) removes the actor's target.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rl_otel._internal.runtime.options import DEFAULT_HOST
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

_log = logging.getLogger("rl_otel")

REGISTRY_NAME = "rl_otel_targets"  # the named Ray actor holding the targets (one per job namespace)
DEFAULT_PORT = 9465  # next to the scrape endpoints' default 9464
_WILDCARD = ("", "0.0.0.0", "::")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("rl_otel.integrations.ray needs Ray: pip install ray") from exc
    return ray


def node_address() -> str:
    """The address Ray reaches this process's node at (its ``NodeManagerAddress``, what ``ray start
    --node-ip-address`` or ``ray.init(_node_ip_address=...)`` set), so Prometheus scrapes the actor where Ray
    itself talks to the node; ``ray.util.get_node_ip_address()`` guesses from the routing table instead."""
    ray = _ray()
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("NodeManagerAddress"):
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


@dataclass(frozen=True)
class Target:
    """One registered endpoint: its ``host:port``, the target labels Prometheus attaches, the scheme and path."""

    address: str
    labels: dict[str, str]
    scheme: str = "http"
    metrics_path: str = "/metrics"

    @property
    def key(self) -> tuple[str, str, str]:
        """The identity a restarted actor registers under again: ``(run, role, rank)``."""
        return self.labels["run"], self.labels["role"], self.labels["rank"]

    def group(self) -> dict[str, object]:
        """The ``http_sd_configs`` target group (``__scheme__``/``__metrics_path__`` are read by Prometheus)."""
        return {"targets": [self.address],
                "labels": {**self.labels, "__scheme__": self.scheme, "__metrics_path__": self.metrics_path}}


class _Registry:
    """The registry's state (run inside a Ray actor): targets by ``(run, role, rank)``. Ray runs one method at a
    time on a plain actor, so no lock is needed."""

    def __init__(self) -> None:
        self._targets: dict[tuple[str, str, str], Target] = {}

    def register(self, target: Target) -> None:
        self._targets[target.key] = target

    def unregister(self, target: Target) -> bool:
        """Remove ``target`` unless a newer registration (a restarted actor elsewhere) has replaced it."""
        if self._targets.get(target.key) == target:
            del self._targets[target.key]
            return True
        return False

    def targets(self) -> list[Target]:
        return sorted(self._targets.values(), key=lambda t: t.key)


def _registry_actor() -> Any:
    ray = _ray()
    # no CPU reserved: the registry does a dict update per actor start, it must never wait for a free CPU
    return ray.remote(num_cpus=0)(_Registry)


class TargetsEndpoint:
    """The driver's side: the registry actor and the HTTP endpoint Prometheus' ``http_sd_configs`` reads.

    ``GET /targets`` answers the registered targets as a JSON list of target groups (``Content-Type:
    application/json``), as the http_sd protocol says. Thread-safe; ``close()`` is idempotent and kills the
    registry; also a context manager.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, name: str = REGISTRY_NAME,
                 advertise_host: str | None = None, timeout_s: float = 10.0, start_timeout_s: float = 30.0) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise ConfigurationError("serve_targets() runs in the Ray driver after ray.init()")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"serve_targets port must be an int in 0..65535 (0 = a free port), got {port!r}")
        self._timeout_s = timeout_s
        try:
            self.registry = _registry_actor().options(name=name).remote()
        except ValueError as exc:  # Ray refuses a second actor of that name in the namespace
            raise ConfigurationError(f"serve_targets: a Ray actor named {name!r} exists already ({exc}); one "
                                     "registry per job, or pass another name to both sides") from exc
        try:
            ray.get(self.registry.targets.remote(), timeout=start_timeout_s)  # started and reachable by name
        except ray.exceptions.GetTimeoutError:
            # a busy node starts the actor late: the driver goes on, /targets answers 503 until it is up (Prometheus
            # keeps its last list) and the actors that look the registry up by name find it once it is
            _log.warning("rl_otel: the Ray targets registry %r did not start within %.0f s (a busy node?); serving "
                         "%s anyway, which answers 503 until it does", name, start_timeout_s, "/targets")
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if urllib.parse.urlsplit(self.path).path != "/targets":
                    self.send_error(404)
                    return
                try:
                    body = json.dumps([t.group() for t in endpoint.targets()]).encode()
                except Exception as exc:  # the registry unreachable: Prometheus keeps its last list
                    _log.warning("rl_otel: the Ray targets registry did not answer: %s", exc)
                    self.send_error(503)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            ray.kill(self.registry)
            raise ConfigurationError(f"serve_targets cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self._server.daemon_threads = True
        shown = advertise_host or (node_address() if host in _WILDCARD else host)
        self.url = f"http://{shown}:{self._server.server_port}/targets"
        self._thread = threading.Thread(target=self._server.serve_forever, name="rl_otel-ray-targets", daemon=True)
        self._thread.start()
        self._closed = False

    def targets(self) -> list[Target]:
        """What Prometheus gets now."""
        return _ray().get(self.registry.targets.remote(), timeout=self._timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        try:
            _ray().kill(self.registry)
        except Exception as exc:  # Ray already shut down: the registry is gone with it
            _log.debug("rl_otel: the Ray targets registry was not killed: %s", exc)

    def __enter__(self) -> TargetsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_targets(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, name: str = REGISTRY_NAME,
                  advertise_host: str | None = None, start_timeout_s: float = 30.0) -> TargetsEndpoint:
    """In the Ray driver, after ``ray.init()`` and before the actors start: create the registry (a named Ray actor
    ``name`` in the job's namespace) and serve it for Prometheus' ``http_sd_configs`` at ``.url``
    (``http://<host>:<port>/targets``; the node's IP when bound to all interfaces, or ``advertise_host``).
    Raises ConfigurationError outside a Ray driver or when the port is taken. ``start_timeout_s``: how long it waits
    for the registry actor to start; a warning, not an error, when it has not (a busy node): the endpoint answers 503
    until it has."""
    return TargetsEndpoint(host, port, name=name, advertise_host=advertise_host, start_timeout_s=start_timeout_s)


class Registration:
    """An actor's registered endpoint; ``close()`` (idempotent, also run at process exit) removes it."""

    def __init__(self, registry: Any, target: Target | None) -> None:
        self._registry = registry
        self.target = target
        self._closed = target is None
        if target is not None:
            atexit.register(self.close)

    @property
    def registered(self) -> bool:
        return not self._closed

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            _ray().get(self._registry.unregister.remote(self.target), timeout=timeout_s)
        except Exception as exc:  # the driver is gone: so is the registry, and the target with it
            _log.debug("rl_otel: target %s not unregistered: %s", self.target, exc)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def target_of(tel: Telemetry, labels: dict[str, str] | None = None, advertise_host: str | None = None) -> Target:
    """The :class:`Target` a Telemetry's endpoint is scraped at from another node: the bound host, or this Ray
    node's IP when bound to all interfaces (or ``advertise_host``), with ``run``, ``role``, ``rank`` and
    ``labels``. Raises ConfigurationError for a Telemetry without a scrape endpoint."""
    url = tel.metrics_url
    prom = tel.config.prometheus
    if url is None or prom is None:
        raise ConfigurationError("register() needs a Telemetry with a scrape endpoint (prometheus={'port': 0})")
    parts = urllib.parse.urlsplit(url)
    host = advertise_host or (node_address() if prom.host in _WILDCARD else prom.host)
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    extra = dict(labels or {})
    reserved = sorted({"run", "role", "rank"} & set(extra) | {k for k in extra if k.startswith("__")})
    if reserved:
        raise ConfigurationError(f"register() labels {reserved} are set by rl_otel (run, role, rank) or reserved")
    return Target(address=f"{host}:{parts.port}", scheme=parts.scheme, metrics_path=parts.path,
                  labels={"run": tel.config.run, "role": tel.config.role, "rank": str(tel.config.rank), **extra})


def register(tel: Telemetry, *, labels: dict[str, str] | None = None, name: str = REGISTRY_NAME,
             namespace: str | None = None, advertise_host: str | None = None, timeout_s: float = 30.0
             ) -> Registration:
    """In a Ray actor: register ``tel``'s scrape endpoint with the driver's registry (see :func:`serve_targets`),
    labelled ``run``, ``role`` and ``rank`` from ``tel.config`` plus ``labels``. Waits up to ``timeout_s`` for
    the registry to exist; if it never does, logs a warning and returns an inactive Registration (training goes
    on, unobserved by this discovery). A restarted actor's registration replaces the previous one."""
    ray = _ray()
    target = target_of(tel, labels, advertise_host)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            registry = ray.get_actor(name, namespace=namespace)
            ray.get(registry.register.remote(target), timeout=max(1.0, deadline - time.monotonic()))
            return Registration(registry, target)
        except ValueError:  # no actor of that name (yet)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        except Exception as exc:  # boundary: Ray (actor calls, timeouts, a shut-down cluster)
            _log.warning("rl_otel: registering %s with the Ray targets registry failed: %s", target.address, exc)
            return Registration(None, None)
    _log.warning("rl_otel: no Ray actor %r after %.0f s (call rl_otel.integrations.ray.serve_targets() in the "
                 "driver); %s is not discoverable", name, timeout_s, target.address)
    return Registration(None, None)
