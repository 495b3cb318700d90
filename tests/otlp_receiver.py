"""Real OTLP receivers on loopback, built from the official protobuf definitions (opentelemetry-proto).

:class:`OtlpReceiver` answers as the OTLP/HTTP spec says a Collector does: ``POST /v1/metrics`` and
``/v1/traces`` with ``Content-Type: application/x-protobuf`` (gzip allowed), the body an
``Export{Metrics,Trace}ServiceRequest``; 200 with the serialized ``Export*ServiceResponse``; 415 for another
content type, 400 for a body that does not decode, 404 for another path. ``status``/``delay_s`` make it fail or
stall like a sick collector.

:class:`GrpcOtlpReceiver` is a gRPC server (grpcio) implementing the OTLP ``MetricsService`` and ``TraceService``
with the generated servicers of opentelemetry-proto, as the Collector's ``otlp`` receiver does on port 4317.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
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
    start: int = 0  # start_time_unix_nano
    time: int = 0  # time_unix_nano
    temporality: int = 0  # AggregationTemporality of a sum or histogram: 1 delta, 2 cumulative
    sum: float | None = None  # a histogram's
    min: float | None = None  # a histogram's, None when the point leaves it out
    max: float | None = None


class _Decoding:
    """What both receivers keep: the decoded requests, in arrival order, and the headers (metadata) of each."""

    def __init__(self) -> None:
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.traces: list[ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self._lock = threading.Lock()

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
                    temporality = getattr(data, "aggregation_temporality", 0)
                    for dp in data.data_points:
                        times = {"start": dp.start_time_unix_nano, "time": dp.time_unix_nano,
                                 "temporality": temporality}
                        if kind == "histogram":
                            out.append(Point(m.name, kind, attributes(dp.attributes), None, dp.count,
                                             tuple(dp.bucket_counts), resource, sum=dp.sum,
                                             min=dp.min if dp.HasField("min") else None,
                                             max=dp.max if dp.HasField("max") else None, **times))
                        else:
                            value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                            out.append(Point(m.name, kind, attributes(dp.attributes), value, resource=resource,
                                             **times))
        return out

    def all_points(self) -> list[Point]:
        """The points of every metrics request, in arrival order."""
        with self._lock:
            requests = list(self.metrics)
        return [p for request in requests for p in self.points(request)]

    def spans(self) -> list[tuple[str, dict, bytes, bytes, dict]]:
        """``(name, attributes, span_id, parent_span_id, resource)`` of every span received."""
        with self._lock:
            requests = list(self.traces)
        return [(span.name, attributes(span.attributes), span.span_id, span.parent_span_id,
                 attributes(rs.resource.attributes))
                for request in requests for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]


class OtlpReceiver(_Decoding):
    """An OTLP/HTTP collector; ``metrics`` and ``traces`` are the decoded requests, in arrival order."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        super().__init__()
        self.status, self.delay_s = status, delay_s
        self.rejected: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
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

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class GrpcOtlpReceiver(_Decoding):
    """An OTLP/gRPC collector on ``127.0.0.1`` (insecure, like a Collector's default ``otlp`` receiver):
    ``url`` is ``http://127.0.0.1:<port>``; ``metrics``, ``traces`` and ``headers`` (the call's metadata) as
    :class:`OtlpReceiver` keeps them."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        super().__init__()
        receiver = self

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                receiver._keep(receiver.metrics, request, context)
                return ExportMetricsServiceResponse()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver._keep(receiver.traces, request, context)
                return ExportTraceServiceResponse()

        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"http://127.0.0.1:{port}"

    def _keep(self, requests: list, request: object, context: object) -> None:
        headers = {k.lower(): v for k, v in context.invocation_metadata()}
        with self._lock:
            requests.append(request)
            self.headers.append(headers)

    def close(self) -> None:
        self._server.stop(grace=None).wait(5)
