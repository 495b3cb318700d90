"""The scrape path writes prometheus_client's text without importing it: family headers, content negotiation and
the answers to other methods are prometheus_client 0.26's, byte for byte, on hostile descriptions and units, for
every kind, in both formats - so an upgrade that changes any of them fails here, loudly."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import _mapping as exporter_names
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder, make_wsgi_app
from prometheus_client.exposition import gzip_accepted as stock_gzip_accepted

from rl_otel._internal.exporters import prometheus as prom
from rl_otel._internal.exporters.exposition import Renderer
from rl_otel._internal.exporters.prometheus import encode, families
from rl_otel._internal.exporters.promnames import sanitize_full_name
from rl_otel._internal.exporters.textformat import OPENMETRICS, TEXT, header
from rl_otel._internal.pipeline.records import Family as FamilyView
from rl_otel.catalog import Kind, MetricSpec
from rl_otel.catalog.naming import check_name

DESCRIPTIONS = ["", "plain words", 'a "quoted" word', "back\\slash", "trailing backslash \\", "new\nline",
                "\\n written out", "100% of {it} %s", "naïve – ünïcödé ✓ 🚀", "tab\tand\rreturn", " ", "#"]
UNITS = ["", "1", "s", "ms", "By", "GiBy", "%", "Cel", "{token}", "{token}/s", "By/s", "m/s", "1/s", "foo-bar",
         "x/mo"]
BUCKETS = [(-1.0, 0.0, 2.5), (0.5, 1.0, 1e6)]
BASE = (("run", 'r"1\\'), ("rank", "0"))


def specs():
    """A spec of every kind for every hostile description and unit (names made valid for their unit)."""
    for (i, doc), unit in itertools.product(enumerate(DESCRIPTIONS), UNITS):
        suffix = {"s": "_seconds", "By": "_bytes"}.get(unit, "_per_second" * unit.endswith("/s"))
        name = f"rl_hostile_{i}_value" + suffix
        yield MetricSpec(key=f"x/{i}", name=name, kind=Kind.GAUGE, unit=unit, description=doc, source="t")
        yield MetricSpec(key=f"x/{i}", name=name, kind=Kind.COUNTER, unit=unit, description=doc, source="t")
        for buckets in BUCKETS:
            yield MetricSpec(key=f"x/{i}", name=name, kind=Kind.HISTOGRAM, unit=unit, description=doc, source="t",
                             buckets=buckets)
    for (i, doc), name in itertools.product(enumerate(DESCRIPTIONS), ("target_info", "rl_build_info")):
        yield MetricSpec(key=f"x/{i}", name=name, kind=Kind.INFO, unit="", description=doc, source="t")


def stock_family(spec: MetricSpec, labels: list[str] | None = None):
    """The family opentelemetry-exporter-prometheus builds for ``spec`` (its own name and unit mapping)."""
    if spec.kind is Kind.INFO:
        return InfoMetricFamily(spec.name[:-len("_info")], spec.description, labels=labels or [])
    cls = {Kind.GAUGE: GaugeMetricFamily, Kind.COUNTER: CounterMetricFamily, Kind.HISTOGRAM: HistogramMetricFamily}
    return cls[spec.kind](exporter_names.sanitize_full_name(spec.name), spec.description, labels=labels or [],
                          unit=exporter_names.map_unit(spec.unit))


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
def test_headers_are_prometheus_clients_on_hostile_descriptions_and_units(fmt):
    checked = 0
    for spec in specs():
        assert header(spec, fmt) == encode(families(stock_family(spec)), fmt), (spec, fmt)
        checked += 1
    assert checked == len(DESCRIPTIONS) * (len(UNITS) * 4 + 2)


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
@pytest.mark.parametrize("own_labels", [(), (("stat", "m\nean"),)])
def test_rendered_families_are_prometheus_clients(fmt, own_labels):
    """A whole family of one series through the renderer (the single pass for the plain ones, a _State for the
    others) against prometheus_client's encoding of the same family and sample."""
    renderer = Renderer()  # one for all: every family is new to it
    for spec in specs():
        if spec.kind is Kind.HISTOGRAM:
            continue  # their lines: tests/test_scrape_render.py, through the stock exporter
        info = spec.kind is Kind.INFO
        base, labels = ((), (("a", "b"), *own_labels)) if info else (BASE, own_labels)
        pairs = sorted(base + labels)
        family = stock_family(spec, [k for k, _ in pairs])
        if info:
            family.add_metric([v for _, v in pairs], {})
        else:
            family.add_metric([v for _, v in pairs], 1234567.5)
        view = FamilyView(spec, base, 0, [(labels, 1.0 if info else 1234567.5)])
        assert renderer.render([view], fmt, set()).text == encode(families(family), fmt), (spec, fmt)


def test_a_description_that_cannot_be_encoded_leaves_its_family_out_as_prometheus_client_would():
    spec = MetricSpec(key="x", name="rl_bad_value", kind=Kind.GAUGE, unit="", description="bad \udce9",
                      source="t")
    for fmt in (TEXT, OPENMETRICS):
        with pytest.raises(UnicodeEncodeError):
            encode(families(stock_family(spec)), fmt)
        with pytest.raises(UnicodeEncodeError):
            header(spec, fmt)
        good = MetricSpec(key="y", name="rl_good_value", kind=Kind.GAUGE, unit="", description="ok", source="t")
        errors: list[str] = []
        text = Renderer().render([FamilyView(spec, BASE, 0, [((), 1.0)]), FamilyView(good, BASE, 0, [((), 2.0)])],
                                 fmt, set(), errors.append).text
        assert "rl_bad_value" not in text and 'rl_good_value{rank="0",run="r\\"1\\\\"} 2.0\n' in text
        assert errors == ["render"]


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="rl_az09:-.A_é", min_size=1, max_size=16))
def test_every_name_a_metric_spec_takes_is_already_sanitized(name):
    """The renderer writes a gauge's or counter's name as it is: MetricSpec's own check must keep taking only names
    that the exporter's sanitizing leaves alone."""
    for candidate in (name, "rl_" + name):
        try:
            check_name(candidate)
        except ValueError:
            continue
        assert sanitize_full_name(candidate) == candidate == exporter_names.sanitize_full_name(candidate)


def test_the_name_check_still_refuses_what_would_need_sanitizing():
    refused = 0
    for name in ("rl_a__b", "rl_a-b", "rl_a.b", "rl_A", "rl_a:b", "rl_é", "9rl_a", "rl_a_"):
        with pytest.raises(ValueError):
            check_name(name)
        refused += 1
    assert refused == 8


ACCEPTS = [
    None, "", "*/*", "text/plain", "text/plain;version=0.0.4", "text/plain; version=1.0.0",
    "text/plain;version=1.0.0;escaping=allow-utf-8", "text/plain;version=1.0.0;escaping=bogus",
    "text/plain;version=0.0.1", "application/openmetrics-text", "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text;version=0.0.1", "application/openmetrics-text;version=0.0.1,text/plain;version=1.0.0",
    "application/openmetrics-text; version=2.0.0; escaping=dots", "application/openmetrics-text;escaping=values",
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4",
    # Prometheus 3's default
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
    "APPLICATION/OPENMETRICS-TEXT", " application/openmetrics-text ;version=1.0.0", "application/openmetrics-text;=",
    "application/openmetrics-text;version=1.a", "application/openmetrics-text;version=a.b",
    "text/plain;version=x", ",,,;;;", "text/html, application/xhtml+xml",
]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_content_negotiation_is_prometheus_clients(accept):
    """Where prometheus_client raises (a version comparing a word with a number; its app answers 500), the text
    format is served."""
    try:
        expected = choose_encoder(accept)[1]
    except TypeError:
        expected = None
    got = prom.content_type(accept)
    assert got == expected if expected is not None else got.startswith("text/plain; version=")


@pytest.mark.parametrize("accept", ["text/plain; version=x", "application/openmetrics-text; version=a.b",
                                    "application/openmetrics-text;version=1.a"])
def test_a_malformed_accept_is_served_the_text_format_without_a_traceback(tel, accept, caplog):
    """Before: 500 and a 15-line traceback in the training process's stderr for every such request."""
    import urllib.request

    tel.log({"actor/pg_loss": 1.0}, step=1)
    request = urllib.request.Request(str(tel.metrics_url), headers={"Accept": accept})
    for _ in range(3):
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == prom.CONTENT_TYPE_PLAIN_0_0_4
            assert b"rl_actor_pg_loss{" in response.read()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not tel.value("rl_telemetry_errors_total", sink="prometheus", reason="internal")


@pytest.mark.parametrize("encoding", [None, "", "gzip", "GZIP", "br, gzip;q=0.5", "gzip;q=0", "identity",
                                      "x-gzip", " gzip ", "deflate,gzip", "gzipx"])
def test_gzip_negotiation_is_prometheus_clients(encoding):
    assert prom.gzip_accepted(encoding) == stock_gzip_accepted(encoding)


@pytest.mark.parametrize(("method", "path"), [("OPTIONS", "/metrics"), ("POST", "/metrics"), ("HEAD", "/metrics"),
                                              ("PUT", "/"), ("GET", "/favicon.ico"), ("DELETE", "/favicon.ico")])
def test_other_methods_are_answered_as_prometheus_clients_app_answers(method, path):
    def call(app) -> tuple[str, list, bytes]:
        got: dict = {}
        body = app({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": ""},
                   lambda status, headers: got.update(status=status, headers=headers))
        return got["status"], got["headers"], b"".join(body)

    ours = call(prom.scrape_app(prom.ScrapeRegistry(on_duplicate=lambda name: None)))
    assert ours == call(make_wsgi_app(CollectorRegistry()))


def test_the_scrape_path_does_not_import_prometheus_client():
    """init(), log() and scrapes in every format (gzip, name filters) leave prometheus_client unimported (~25 ms of
    init); a user's meter provider, which registers an SDK reader on the endpoint, imports it and is served."""
    code = """if True:
        import gzip, sys, urllib.request
        import rl_otel
        tel = rl_otel.init(run="imp", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
        tel.log({"actor/lr": 0.5, "custom/x": 1.0, "env/reward_dist": [0.5, 2.0]}, step=1)
        for accept in ("text/plain", "application/openmetrics-text"):
            for extra in ("", "?name[]=rl_step"):
                req = urllib.request.Request(tel.metrics_url + extra, headers={"Accept": accept,
                                                                              "Accept-Encoding": "gzip"})
                body = gzip.decompress(urllib.request.urlopen(req).read()).decode()
                assert "rl_step{" in body, body
        print("before", "prometheus_client" in sys.modules)
        tel.meter_provider.get_meter("mine").create_counter("my_restarts", unit="1").add(2)
        body = urllib.request.urlopen(tel.metrics_url).read().decode()
        print("after", "prometheus_client" in sys.modules, 'my_restarts_total 2.0' in body)
        tel.close()
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["before", "False", "after", "True", "True"]


def _header_writers(package) -> list[str]:
    """``path:line`` of every string of rl_otel's code (docstrings aside) that writes a ``# HELP``, ``# TYPE`` or
    ``# UNIT`` line."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and any(tag in node.value for tag in ("# HELP ", "# TYPE ", "# UNIT "))):
                found.append(f"{Path(path).relative_to(Path(package).parent).as_posix()}:{node.lineno}")
    return found


def test_one_function_writes_the_header_lines():
    """textformat.header_lines is the one writer of HELP/TYPE/UNIT lines (family_header and the renderer's single
    pass both call it): a second copy of the format anywhere in rl_otel fails here, naming where it is."""
    import inspect
    from pathlib import Path

    import rl_otel
    from rl_otel._internal.exporters import textformat

    writers = _header_writers(Path(rl_otel.__file__).parent)
    assert writers and {w.rsplit(":", 1)[0] for w in writers} == {"rl_otel/_internal/exporters/textformat.py"}, writers
    source, first = inspect.getsourcelines(textformat.header_lines)
    inside = range(first, first + len(source))
    assert all(int(w.rsplit(":", 1)[1]) in inside for w in writers), (writers, inside)
