"""A real OTLP/HTTP receiver on loopback, built from the official protobuf definitions (opentelemetry-proto).

It answers as the OTLP/HTTP spec says a Collector does: ``POST /v1/metrics`` and ``/v1/traces`` with
``Content-Type: application/x-protobuf`` (gzip allowed), the body an ``Export{Metrics,Trace}ServiceRequest``;
200 with the serialized ``Export*ServiceResponse``; 415 for another content type, 400 for a body that does not
decode, 404 for another path. ``status``/``delay_s`` make it fail or stall like a sick collector.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                           ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_SIGNALS = {"/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
            "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse)}


def value_of(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def attributes(kvs) -> dict[str, object]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass(frozen=True)
class Point:
    metric: str
    kind: str  # gauge, sum, histogram
    attributes: dict
    value: float | None  # gauge/sum value; None for a histogram
    count: int | None = None
    bucket_counts: tuple[int, ...] = ()
    resource: dict | None = None


class OtlpReceiver:
    """Collects what arrives; ``metrics`` and ``traces`` are the decoded requests, in arrival order."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        self.status, self.delay_s = status, delay_s
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.traces: list[ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self.rejected: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                code, payload = receiver._handle(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the exporter gave up on a slow answer
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if self.delay_s:
            time.sleep(self.delay_s)
        if path not in _SIGNALS:
            return 404, b""
        if headers.get("content-type", "").split(";")[0].strip() != "application/x-protobuf":
            return 415, b""
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request_type, response_type = _SIGNALS[path]
        request = request_type()
        try:
            request.ParseFromString(body)
        except DecodeError:
            return 400, b""
        if self.status != 200:
            with self._lock:
                self.rejected.append(self.status)
            return self.status, b""
        with self._lock:
            (self.metrics if path == "/v1/metrics" else self.traces).append(request)
            self.headers.append(headers)
        return 200, response_type().SerializeToString()

    def points(self, request: ExportMetricsServiceRequest | None = None) -> list[Point]:
        """Every data point of ``request`` (default: the last metrics request received)."""
        with self._lock:
            request = request or self.metrics[-1]
        out = []
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    for dp in data.data_points:
                        if kind == "histogram":
                            out.append(Point(m.name, kind, attributes(dp.attributes), None, dp.count,
                                             tuple(dp.bucket_counts), resource))
                        else:
                            value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                            out.append(Point(m.name, kind, attributes(dp.attributes), value, resource=resource))
        return out

    def spans(self) -> list[tuple[str, dict, bytes, bytes, dict]]:
        """``(name, attributes, span_id, parent_span_id, resource)`` of every span received."""
        with self._lock:
            requests = list(self.traces)
        return [(span.name, attributes(span.attributes), span.span_id, span.parent_span_id,
                 attributes(rs.resource.attributes))
                for request in requests for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
