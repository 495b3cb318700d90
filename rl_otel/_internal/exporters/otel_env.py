"""The standard ``OTEL_*`` environment variables, read once at ``init()`` with the OpenTelemetry spec's precedence:
an explicit argument, else the environment, else the default.

Exporter settings per signal (``signal`` is ``"metrics"`` or ``"traces"``), the signal-specific variable first:

- endpoint: ``OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT`` (the signal's URL, used as it is), else
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/{signal}`` is appended for http/protobuf), else
  ``http://localhost:4318`` (http/protobuf) or ``http://localhost:4317`` (grpc). ROLL points
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` at a traces-only collector when its own tracing is on: the signal-specific
  variable is how metrics go elsewhere.
- protocol: ``OTEL_EXPORTER_OTLP_{SIGNAL}_PROTOCOL``, ``OTEL_EXPORTER_OTLP_PROTOCOL``; ``http/protobuf`` or ``grpc``.
- headers: ``OTEL_EXPORTER_OTLP_{SIGNAL}_HEADERS``, ``OTEL_EXPORTER_OTLP_HEADERS`` (``k=v,k2=v2``, URL-encoded).
- timeout: ``OTEL_EXPORTER_OTLP_{SIGNAL}_TIMEOUT``, ``OTEL_EXPORTER_OTLP_TIMEOUT``, in seconds as
  opentelemetry-python reads them (the spec says milliseconds; the pinned exporters read seconds).

Which signals are pushed when ``init(otlp=...)`` is not given: ``OTEL_METRICS_EXPORTER`` / ``OTEL_TRACES_EXPORTER``
listing ``otlp``. Unset, they mean no push (the spec's SDK default is ``otlp``, but a library that starts pushing
to ``localhost`` because nothing was configured would surprise; rl_otel serves ``/metrics`` instead).

The exporter settings are plain parsing of a mapping (``os.environ`` by default); the resource is the SDK's own
``Resource.create`` (:func:`build_resource`), detectors and ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``
parsing included.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote

from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.util.types import Attributes

PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_ENDPOINT = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
DEFAULT_TIMEOUT_S = 10.0
TEMPORALITIES = ("cumulative", "delta", "lowmemory")


@dataclass(frozen=True)
class SignalConfig:
    """Where and how one signal's OTLP exporter sends: everything resolved, nothing left for the exporter to read
    from the environment except TLS files, ``*_INSECURE`` and ``*_COMPRESSION``, which it reads itself."""

    signal: str  # "metrics" or "traces"
    endpoint: str  # the exporter's endpoint: the full URL for http/protobuf, the server's URL for grpc
    protocol: str = "http/protobuf"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # API keys: never in a repr or a log line
    timeout_s: float = DEFAULT_TIMEOUT_S


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if value is not None and value.strip() else None


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """``(name, value)`` of the first variable set to something non-blank."""
    for name in names:
        value = _get(env, name)
        if value is not None:
            return name, value
    return None


def selected(env: Mapping[str, str], signal: str) -> bool | None:
    """``OTEL_{SIGNAL}_EXPORTER``: True if its comma-separated list names ``otlp``, False if it is set without
    it (``none``, ``console``...), None if unset."""
    value = _get(env, f"OTEL_{signal.upper()}_EXPORTER")
    if value is None:
        return None
    return "otlp" in {part.strip().lower() for part in value.split(",")}


def parse_headers(text: str, variable: str) -> tuple[tuple[str, str], ...]:
    """``key1=value1,key2=value2`` (the W3C-baggage-like format of ``OTEL_EXPORTER_OTLP_HEADERS``), URL-decoded.
    The error names the variable and the position, never a value: headers carry API keys."""
    out = []
    for index, part in enumerate(text.split(",")):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = unquote(key).strip()
        if not sep or not key:
            raise ConfigurationError(f"{variable}: entry {index + 1} is not 'key=value' (comma-separated, "
                                     "URL-encoded)")
        out.append((key, unquote(value).strip()))
    return tuple(out)


def check_headers(name: str, headers: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in headers.items()):
        raise ConfigurationError(f"{name} must be a dict of str to str, got a {type(headers).__name__}"
                                 f"{'' if isinstance(headers, Mapping) else f' {headers!r}'}")
    return tuple(headers.items())


def _protocol(name: str, value: object) -> str:
    if value not in PROTOCOLS:
        raise ConfigurationError(f"{name} must be 'http/protobuf' or 'grpc' (http/json is not supported by the "
                                 f"Python exporters), got {value!r}")
    return value


def _url(name: str, value: object, protocol: str, base: bool) -> str:
    """An endpoint URL: http(s)://host:port[/path]; for grpc also host:port (the exporter takes both)."""
    port = "4317" if protocol == "grpc" else "4318"
    like = f"base URL like 'http://collector:{port}'" if base or protocol == "grpc" else \
        "URL like 'http://collector:4318/v1/metrics'"
    if (not isinstance(value, str) or not value.strip()
            or (not value.strip().startswith(("http://", "https://")) and (protocol != "grpc" or "/" in value))):
        raise ConfigurationError(f"{name} must be the collector's OTLP {protocol} {like}, got {value!r}")
    return value.strip()


def _seconds(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def signal_config(signal: str, env: Mapping[str, str] | None = None, *, base: str | None = None,
                  url: str | None = None, protocol: str | None = None,
                  headers: tuple[tuple[str, str], ...] | None = None, timeout_s: float | None = None,
                  what: str = "otlp") -> SignalConfig:
    """One signal's exporter settings: each explicit argument (``base``: a base URL, ``/v1/{signal}`` appended
    for http/protobuf; ``url``: the signal's URL as it is) wins, else the environment, else the default.
    ``what`` names the option in error messages."""
    env = os.environ if env is None else env
    sig = signal.upper()
    if protocol is not None:
        protocol = _protocol(f"{what} protocol", protocol)
    else:
        found = _first(env, f"OTEL_EXPORTER_OTLP_{sig}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        protocol = "http/protobuf" if found is None else _protocol(found[0], found[1].lower())
    http = protocol == "http/protobuf"
    if url is not None:
        endpoint = _url(f"{what} endpoint", url, protocol, base=False)
    elif base is not None:
        endpoint = _url(f"{what} endpoint", base, protocol, base=True)
        endpoint = f"{endpoint.rstrip('/')}/v1/{signal}" if http else endpoint
    else:
        found = _first(env, f"OTEL_EXPORTER_OTLP_{sig}_ENDPOINT")
        if found is not None:
            endpoint = _url(found[0], found[1], protocol, base=False)
        else:
            found = _first(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint = DEFAULT_ENDPOINT[protocol] if found is None else _url(found[0], found[1], protocol, base=True)
            endpoint = f"{endpoint.rstrip('/')}/v1/{signal}" if http else endpoint
    if headers is None:
        found = _first(env, f"OTEL_EXPORTER_OTLP_{sig}_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
        headers = () if found is None else parse_headers(found[1], found[0])
    if not http:  # gRPC metadata keys must be lower case; HTTP header names are case-insensitive
        headers = tuple((k.lower(), v) for k, v in headers)
    if timeout_s is None:
        found = _first(env, f"OTEL_EXPORTER_OTLP_{sig}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        timeout_s = DEFAULT_TIMEOUT_S if found is None else _seconds(found[0], found[1])
    return SignalConfig(signal=signal, endpoint=endpoint, protocol=protocol, headers=headers, timeout_s=timeout_s)


def export_interval_s(env: Mapping[str, str], default: float) -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds, as the spec and the SDK read it) in seconds, else ``default``."""
    value = _get(env, "OTEL_METRIC_EXPORT_INTERVAL")
    return default if value is None else _seconds("OTEL_METRIC_EXPORT_INTERVAL", value) / 1000.0


def temporality(env: Mapping[str, str], explicit: object = None) -> str:
    """``cumulative``, ``delta`` or ``lowmemory``: ``explicit``, else
    ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``, else ``cumulative``."""
    name, value = "otlp temporality", explicit
    if value is None:
        name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
        value = _get(env, name)
        if value is None:
            return "cumulative"
        value = value.lower()
    if value not in TEMPORALITIES:
        raise ConfigurationError(f"{name} must be one of {list(TEMPORALITIES)}, got {value!r}")
    return value


def resource_attributes(name: str, value: object) -> tuple[tuple[str, object], ...]:
    """Check ``init(resource=...)``: a dict of OTel resource attributes (str keys; str, bool, int or float
    values)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, (str, bool, int, float)) for k, v in value.items()):
        raise ConfigurationError(f"{name} must be a dict of OTel resource attributes like "
                                 f"{{'service.name': 'grpo-7b'}} (str keys; str, bool, int or float values), "
                                 f"got {value!r}")
    return tuple(value.items())


def _sdk_resource(attributes: Mapping[str, object]) -> Resource:
    """``Resource.create``: the SDK's own resolution, detectors included."""
    from opentelemetry.sdk.resources import Resource

    # OTel attribute values by construction: init()'s own (str, int), checked ones (resource_attributes), the SDK's
    return Resource.create(cast("Attributes", attributes))


def build_resource(defaults: Mapping[str, object], own: Mapping[str, object],
                   explicit: Mapping[str, object]) -> Resource:
    """The OTel ``Resource`` of a Telemetry, through the SDK (``Resource.create`` and its detectors), lowest
    precedence first: the SDK's ``telemetry.sdk.*``; rl_otel's ``defaults`` (``service.name=rl_otel``,
    ``host.name``...); ``OTEL_RESOURCE_ATTRIBUTES``; ``OTEL_SERVICE_NAME``; ``own`` (the ``rl.*`` attributes
    init()'s own arguments decide: run, rank, role); ``explicit`` (``init(resource=...)``)."""
    from opentelemetry.sdk.resources import OTELResourceDetector

    from_env = OTELResourceDetector().detect().attributes  # OTEL_SERVICE_NAME wins over OTEL_RESOURCE_ATTRIBUTES
    return _sdk_resource({**defaults, **from_env, **own, **explicit})


class ResolvedResource:
    """A Telemetry's OTel resource, resolved at ``init()`` by the SDK's ``Resource.create`` (its detectors, the
    ``OTEL_*`` variables' precedence and parsing): ``target_info`` serves ``attributes``, the OTLP push and the
    providers use :meth:`sdk`, so the two always agree."""

    def __init__(self, resource: Resource) -> None:
        self._resource = resource
        self.attributes: Mapping[str, object] = dict(resource.attributes)

    def sdk(self) -> Resource:
        """The SDK ``Resource``."""
        return self._resource


def resolve_resource(defaults: Mapping[str, object], own: Mapping[str, object],
                     explicit: Mapping[str, object]) -> ResolvedResource:
    """The Telemetry's resource, through the SDK (:func:`build_resource`)."""
    return ResolvedResource(build_resource(defaults, own, explicit))
