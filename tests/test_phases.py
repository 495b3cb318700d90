"""Telemetry.phase(): spans, ROLL's tracker keys and units, Prometheus series, error policy."""

from __future__ import annotations

import logging
import random
import re
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import rl_otel
from rl_otel._internal.runtime.phase import GPU_ATTRIBUTES
from rl_otel._internal.tracing.steps import step_ids
from tests.gpu_fakes import GIB, FakeCuda, fake_torch, legacy_snapshot, real_cuda, settle
from tests.promtools import promtool_check, samples, scrape

INFIX = "actor_train/train_step"
# ROLL's state_offload_manager keys ("Trackers and Metrics"), {metric_infix} = actor_train/train_step, device 0.
ROLL_KEYS = {
    *(f"time/{INFIX}/{part}" for part in ("total", "execute", "onload", "offload")),
    *(f"memory/{INFIX}/{stage}/{kind}/0" for stage in ("start/offload", "start/onload", "end/onload", "end/offload")
      for kind in ("allocated", "reserved", "max_allocated", "max_reserved")),
    f"memory/{INFIX}/end/onload/max_allocated_frac/0",
    f"memory/{INFIX}/end/onload/max_reserved_frac/0",
    *(f"memory/cpu/{INFIX}/{stage}/{kind}" for stage in ("start", "end") for kind in ("rss", "vms")),
}


@pytest.fixture(params=[False])
def tel(request):
    """A Telemetry; tests that scrape ask for ``@pytest.mark.parametrize("tel", [True], indirect=True)``."""
    t = rl_otel.init(run="phases", rank=3, prometheus={"host": "127.0.0.1", "port": 0} if request.param else False)
    yield t
    t.close()


served = pytest.mark.parametrize("tel", [True], indirect=True)


class Spans:
    """The spans ``tel`` finished. Where the process uses CUDA a phase's root span ends once its GPU times are
    known (on the GPU timer's thread): every read waits for that first, so the tests mean the same on a GPU
    machine as on a CPU one."""

    def __init__(self, tel) -> None:
        self.tel, self.exporter = tel, InMemorySpanExporter()
        tel.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def get_finished_spans(self):
        assert settle(self.tel)
        # a phase that started before any step was logged is held for its step (tracing/pending.py): a flush
        # sends it as it is
        self.tel.tracer_provider.force_flush()
        return self.exporter.get_finished_spans()

    def clear(self) -> None:
        assert settle(self.tel)
        self.exporter.clear()


@pytest.fixture
def spans(tel):
    return Spans(tel)


def gpu_timed(tel) -> bool:
    """Whether ``tel``'s phases are GPU-timed in this process (a CUDA device, real or fake, is visible to torch)."""
    return tel._components.phase_runtime().gpu.cuda() is not None


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(fake))
    return fake


def by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


def test_spans_names_nesting_attributes_durations(tel, spans):
    with tel.phase("actor_train", "train_step", onload=lambda: None, offload=lambda: None, step=7) as ph:
        pass
    got = by_name(spans)
    assert set(got) == {INFIX, "onload", "execute", "offload"}
    root = got[INFIX]
    assert root.parent.span_id == step_ids("phases", 7)[1] and root.parent.is_remote  # under its step's span
    for child in ("onload", "execute", "offload"):
        assert got[child].parent.span_id == root.context.span_id
        assert got[child].context.trace_id == root.context.trace_id
        assert root.start_time <= got[child].start_time <= got[child].end_time <= root.end_time
    assert got["onload"].end_time <= got["execute"].start_time and got["execute"].end_time <= got["offload"].start_time
    attrs = {"cluster": "actor_train", "phase": "train_step", "rank": 3, "step": 7}
    for name, s in got.items():
        gpu = {k: v for k, v in s.attributes.items() if k.startswith("rl.gpu_time.")}
        assert {k: v for k, v in s.attributes.items() if k not in gpu} == attrs
        # the root carries the GPU seconds per part where the process uses CUDA (tests/test_gpu_time.py)
        assert set(gpu) == (set(GPU_ATTRIBUTES.values()) if name == INFIX and gpu_timed(tel) else set())
    children = sum(got[c].end_time - got[c].start_time for c in ("onload", "execute", "offload"))
    assert children <= root.end_time - root.start_time
    m = ph.metrics
    parts = sum(m[f"time/{INFIX}/{p}"] for p in ("onload", "execute", "offload"))
    assert 0 < parts <= m[f"time/{INFIX}/total"]


def test_step_attribute_defaults_to_next_log_step(tel, spans):
    with tel.phase("rollout", "generate"):
        pass
    tel.log({"actor/pg_loss": 1.0}, step=41)
    with tel.phase("rollout", "generate"):
        pass
    steps = [s.attributes["step"] for s in spans.get_finished_spans() if s.name == "rollout/generate"]
    assert steps == [41, 42]  # the first phase is in the step its process logs next (tracing/pending.py)


def test_user_code_nests_under_execute(tel, spans):
    tracer = tel.tracer_provider.get_tracer("user")
    with tel.phase("actor_train", "train_step"):
        with tracer.start_as_current_span("forward"):
            pass
        with tel.phase("reference", "compute_log_probs"):
            pass
    got = by_name(spans)
    execute = next(s for s in spans.get_finished_spans() if s.name == "execute" and s.parent.span_id ==
                   got[INFIX].context.span_id)
    assert got["forward"].parent.span_id == execute.context.span_id
    assert got["reference/compute_log_probs"].parent.span_id == execute.context.span_id


def test_roll_keys_and_units_with_gpu(tel, cuda):
    cuda.alloc(10 * GIB)
    cuda.free(6 * GIB)  # peak 10 GiB before the phase: ROLL resets it at phase start

    def onload():
        cuda.alloc(20 * GIB)

    def offload():
        cuda.free(20 * GIB, release=True)

    with tel.phase("actor_train", "train_step", onload=onload, offload=offload) as ph:
        cuda.alloc(8 * GIB)
        cuda.free(8 * GIB)
    m = ph.metrics
    assert set(m) == ROLL_KEYS
    assert cuda.resets == 1
    assert m[f"memory/{INFIX}/start/offload/allocated/0"] == pytest.approx(4.0)
    assert m[f"memory/{INFIX}/start/offload/max_allocated/0"] == pytest.approx(4.0)  # peak was reset
    assert m[f"memory/{INFIX}/start/onload/allocated/0"] == pytest.approx(24.0)
    assert m[f"memory/{INFIX}/end/onload/max_allocated/0"] == pytest.approx(32.0)
    assert m[f"memory/{INFIX}/end/onload/max_allocated_frac/0"] == pytest.approx(32 / 80)
    assert m[f"memory/{INFIX}/end/onload/max_reserved_frac/0"] == pytest.approx(32 / 80)
    assert m[f"memory/{INFIX}/end/offload/allocated/0"] == pytest.approx(4.0)
    assert m[f"memory/{INFIX}/end/offload/reserved/0"] == pytest.approx(4.0)
    assert 0.001 < m[f"memory/cpu/{INFIX}/end/rss"] < 1024  # GiB, not bytes


@served
def test_prometheus_scrape_has_phase_and_memory_series(tel, cuda):
    cuda.alloc(2 * GIB)
    with tel.phase("actor_train", "train_step", onload=lambda: cuda.alloc(GIB)):
        pass
    text = scrape(tel.metrics_url)
    assert promtool_check(text) == ""
    base = {("run", "phases"), ("role", "trainer"), ("rank", "3"), ("cluster", "actor_train"), ("phase", "train_step")}
    last = samples(text, "rl_phase_last_duration_seconds")
    assert {dict(k)["part"] for k in last} == {"total", "execute", "onload", "offload"}
    assert all(base <= k for k in last)
    counts = samples(text, "rl_phase_duration_seconds_count")
    assert counts[frozenset(base | {("part", "total")})] == 1.0
    buckets = samples(text, "rl_phase_duration_seconds_bucket")
    assert {dict(k)["le"] for k in buckets} >= {"0.001", "3600.0", "+Inf"}
    gpu = samples(text, "rl_gpu_memory_bytes")
    key = frozenset(base | {("stage", "start_onload"), ("kind", "allocated"), ("device_id", "0")})
    assert gpu[key] == 3 * GIB  # bytes on this side, GiB on the trackers' side
    assert len(gpu) == 16
    ratio = samples(text, "rl_gpu_memory_peak_ratio")
    assert ratio[frozenset(base | {("kind", "max_allocated"), ("device_id", "0")})] == pytest.approx(3 / 80)
    cpu = samples(text, "rl_cpu_memory_bytes")
    assert {(dict(k)["stage"], dict(k)["kind"]) for k in cpu} == {("start", "rss"), ("start", "vms"),
                                                                   ("end", "rss"), ("end", "vms")}
    assert all(v > 1e6 for v in cpu.values())  # bytes


@served
def test_no_gpu_cpu_metrics_only_and_one_info_line(tel, caplog, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    caplog.set_level(logging.INFO, logger="rl_otel")
    for _ in range(3):
        with tel.phase("actor_train", "train_step") as ph:
            pass
    m = ph.metrics
    assert not [k for k in m if k.startswith(f"memory/{INFIX}")]
    assert {k for k in m if k.startswith("memory/cpu/")} == {k for k in ROLL_KEYS if k.startswith("memory/cpu/")}
    assert len([r for r in caplog.records if "no CUDA device" in r.getMessage()]) == 1
    text = scrape(tel.metrics_url)
    assert "rl_gpu_memory_bytes{" not in text and "rl_gpu_memory_peak_ratio{" not in text
    assert "rl_cpu_memory_bytes{" in text


def test_cpu_build_of_torch_has_no_gpu_metrics(tel):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here: test_real_gpu_phase_has_the_memory_keys_of_torch runs instead")
    with tel.phase("actor_train", "train_step") as ph:
        pass
    assert not [k for k in ph.metrics if k.startswith(f"memory/{INFIX}")]


@pytest.mark.parametrize("user_code", [False, True], ids=["bare", "onload_offload"])
def test_real_gpu_phase_has_the_memory_keys_of_torch(tel, user_code):
    """On a GPU: every GPU memory key of a phase is what torch's public functions give at that point (the four
    stages, the fractions), with a model moved on and off the device by onload/offload."""
    torch = real_cuda()
    expected: dict[str, float] = {}
    held = []

    def onload() -> None:
        expected.update(legacy_snapshot(torch.cuda, INFIX, "start/offload"))
        held.append(torch.ones(32 << 20, dtype=torch.uint8, device="cuda"))  # 32 MiB onto the device

    def offload() -> None:
        expected.update(legacy_snapshot(torch.cuda, INFIX, "end/onload", with_frac=True))
        held.clear()
        torch.cuda.empty_cache()

    with tel.phase("actor_train", "train_step", onload=onload if user_code else None,
                   offload=offload if user_code else None) as ph:
        if not user_code:
            expected.update(legacy_snapshot(torch.cuda, INFIX, "start/offload"))
        expected.update(legacy_snapshot(torch.cuda, INFIX, "start/onload"))
        scratch = torch.ones(16 << 20, dtype=torch.uint8, device="cuda")  # a peak inside the body
        del scratch
        if not user_code:
            expected.update(legacy_snapshot(torch.cuda, INFIX, "end/onload", with_frac=True))
    expected.update(legacy_snapshot(torch.cuda, INFIX, "end/offload"))
    got = {k: v for k, v in ph.metrics.items() if k.startswith(f"memory/{INFIX}/")}
    assert set(got) == set(expected) and len(got) == 18
    assert got == expected
    stage = f"memory/{INFIX}/end/onload/max_allocated/{torch.cuda.current_device()}"
    assert got[stage] * GIB >= (16 << 20) + (32 << 20 if user_code else 0)


def test_onload_exception_propagates_and_spans_close(tel, spans):
    called = []
    with pytest.raises(KeyError), \
            tel.phase("actor_train", "train_step", onload=lambda: {}["boom"], offload=lambda: called.append(1)):
        called.append("body")
    assert called == []
    got = by_name(spans)
    assert got[INFIX].status.status_code is StatusCode.ERROR
    assert got["onload"].status.status_code is StatusCode.ERROR
    assert tel.value(f"time/{INFIX}/total") is None  # nothing recorded


def test_body_exception_skips_offload_as_roll_does(tel, spans):
    offloaded = []
    with pytest.raises(ZeroDivisionError), tel.phase("actor_train", "train_step", offload=lambda: offloaded.append(1)):
        _ = 1 / 0
    assert offloaded == []
    got = by_name(spans)
    assert got["execute"].status.status_code is StatusCode.ERROR
    assert got[INFIX].status.status_code is StatusCode.ERROR
    assert "offload" not in got
    # the context is restored: a later phase is a root again
    with tel.phase("actor_train", "train_step"):
        pass
    assert [s for s in spans.get_finished_spans() if s.name == INFIX][-1].parent is None


def test_offload_exception_propagates(tel, spans):
    def failing_offload():
        raise RuntimeError("offload failed")

    with pytest.raises(RuntimeError, match="offload failed"), \
            tel.phase("actor_train", "train_step", offload=failing_offload):
        pass
    assert by_name(spans)["offload"].status.status_code is StatusCode.ERROR


@served
def test_telemetry_failure_never_raises_and_is_counted(tel, monkeypatch):
    class Broken(FakeCuda):
        def memory_stats_as_nested_dict(self, d=None):
            raise RuntimeError("driver gone")

    monkeypatch.setitem(sys.modules, "torch", fake_torch(Broken()))
    ran = []
    with tel.phase("actor_train", "train_step", onload=lambda: ran.append("on"), offload=lambda: ran.append("off")):
        ran.append("body")
    assert ran == ["on", "body", "off"]
    assert tel.value(f"time/{INFIX}/total") is not None
    errors = samples(scrape(tel.metrics_url), "rl_telemetry_errors_total")
    key = frozenset({("run", "phases"), ("role", "trainer"), ("rank", "3"), ("sink", "phase"), ("reason", "internal")})
    assert errors[key] >= 1


def test_span_ids_stay_random_when_training_seeds_random(tel, spans):
    ids = []
    for _ in range(2):
        random.seed(1234)
        with tel.phase("actor_train", "train_step"):
            pass
        ids.append(by_name(spans)[INFIX].context)
        spans.clear()
    assert ids[0].trace_id != ids[1].trace_id
    assert ids[0].span_id != ids[1].span_id


def test_traceparent_crosses_processes(spans):
    driver = rl_otel.init(run="driver", prometheus=False)
    driver_spans = InMemorySpanExporter()
    driver.tracer_provider.add_span_processor(SimpleSpanProcessor(driver_spans))
    worker = rl_otel.init(run="worker", rank=1, prometheus=False)  # stands for a Ray worker process
    worker_spans = InMemorySpanExporter()
    worker.tracer_provider.add_span_processor(SimpleSpanProcessor(worker_spans))
    try:
        with driver.phase("pipeline", "step") as ph:
            carrier = ph.carrier()
        assert set(carrier) >= {"traceparent"}
        with worker.phase("actor_train", "train_step", parent=dict(carrier)):
            pass
    finally:
        driver.close()
        worker.close()
    execute = by_name(driver_spans)["execute"]
    root = by_name(worker_spans)[INFIX]
    assert root.context.trace_id == execute.context.trace_id
    assert root.parent.span_id == execute.context.span_id


def test_slash_in_names_is_one_segment(tel):
    with tel.phase("actor/train", "train_step"):
        pass
    assert tel.value("time/actor_train/train_step/total") is not None


def test_phase_after_close_still_runs_user_code():
    t = rl_otel.init(run="closed", prometheus=False)
    t.close()
    ran = []
    with t.phase("a", "b", onload=lambda: ran.append(1), offload=lambda: ran.append(2)):
        ran.append(3)
    assert ran == [1, 3, 2]


# -- no span processor: span contexts only (no SDK span is built), the same IDs, parents and carriers ----------

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-0[13]$")


@pytest.fixture
def sdk_spans(monkeypatch):
    """Every span the OTel SDK builds, from any tracer (names)."""
    built = []
    start_span = sdk_trace.Tracer.start_span

    def counting(self, name, *args, **kwargs):
        built.append(name)
        return start_span(self, name, *args, **kwargs)

    monkeypatch.setattr(sdk_trace.Tracer, "start_span", counting)
    return built


def test_no_processor_builds_no_sdk_span_and_the_carrier_continues_elsewhere(tel, sdk_spans):
    with tel.phase("pipeline", "step", onload=lambda: None, offload=lambda: None) as ph:
        current = trace.get_current_span()
        carrier = ph.carrier()
    assert sdk_spans == []
    assert not isinstance(current, sdk_trace.Span) and not current.is_recording()
    trace_id, span_id = TRACEPARENT.match(carrier["traceparent"]).groups()
    assert (int(trace_id, 16), int(span_id, 16)) == (current.get_span_context().trace_id,
                                                      current.get_span_context().span_id)
    assert tel.value("time/pipeline/step/total") is not None  # the rest of the phase is unchanged

    worker = rl_otel.init(run="worker", rank=1, prometheus=False)  # another process, recording its spans
    worker_spans = InMemorySpanExporter()
    worker.tracer_provider.add_span_processor(SimpleSpanProcessor(worker_spans))
    try:
        with worker.phase("actor_train", "train_step", parent=carrier):
            pass
    finally:
        worker.close()
    root = by_name(worker_spans)[INFIX]
    assert f"{root.context.trace_id:032x}" == trace_id
    assert f"{root.parent.span_id:016x}" == span_id


def test_no_processor_on_both_sides_still_continues_the_trace(tel):
    with tel.phase("pipeline", "step") as ph:
        carrier = ph.carrier()
    worker = rl_otel.init(run="worker", rank=1, prometheus=False)
    try:
        with worker.phase("actor_train", "train_step", parent=carrier) as child:
            inner = child.carrier()
    finally:
        worker.close()
    outer_trace, outer_span = TRACEPARENT.match(carrier["traceparent"]).groups()
    inner_trace, inner_span = TRACEPARENT.match(inner["traceparent"]).groups()
    assert inner_trace == outer_trace and inner_span != outer_span


def test_every_phase_gets_new_ids_without_a_processor(tel):
    carriers = []
    for _ in range(3):
        random.seed(7)  # training code seeds random: the IDs still come from os.urandom
        with tel.phase("actor_train", "train_step") as ph:
            carriers.append(TRACEPARENT.match(ph.carrier()["traceparent"]).groups())
    assert len({t for t, _ in carriers}) == 3 and len({s for _, s in carriers}) == 3


def test_processor_added_after_phases_records_the_next_phase(tel, sdk_spans):
    with tel.phase("actor_train", "train_step"):
        pass
    assert sdk_spans == []
    exporter = InMemorySpanExporter()
    tel.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tel.phase("actor_train", "train_step", step=5):
        pass
    assert settle(tel)  # where the process uses CUDA, the root ends once its GPU times are known
    got = by_name(exporter)
    assert sorted(sdk_spans) == sorted(got) == sorted([INFIX, "onload", "execute", "offload"])
    root = got[INFIX]
    assert root.parent.span_id == step_ids("phases", 5)[1] and root.attributes["step"] == 5
    for child in ("onload", "execute", "offload"):
        assert got[child].parent.span_id == root.context.span_id
        assert got[child].context.trace_id == root.context.trace_id


@pytest.mark.parametrize("recording", [False, True], ids=["no_processor", "processor"])
def test_user_spans_parent_under_execute_in_both_modes(tel, recording):
    if recording:
        tel.tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    user = InMemorySpanExporter()  # the user's own provider: its spans join ours through the context
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(user))
    with tel.phase("actor_train", "train_step") as ph:
        execute = TRACEPARENT.match(ph.carrier()["traceparent"]).groups()
        with provider.get_tracer("user").start_as_current_span("forward"):
            pass
        with tel.tracer_provider.get_tracer("user").start_as_current_span("backward") as backward:
            pass
    forward = by_name(user)["forward"]
    for span in (forward, backward):
        assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == execute
    assert trace.get_current_span() is trace.INVALID_SPAN  # the context is restored after the block


def test_recording_is_decided_without_sdk_internals(tel, sdk_spans, monkeypatch):
    with tel.phase("actor_train", "warmup"):  # the first phase gets the SDK's tracer (built on first use)
        pass
    sdk_spans.clear()
    monkeypatch.delattr(tel.tracer_provider, "_active_span_processor")  # whatever the SDK keeps inside
    with tel.phase("actor_train", "train_step"):
        pass
    assert sdk_spans == []  # rl_otel's provider knows it got no processor: it asks nothing of the SDK


def test_deferred_context_is_made_from_the_parent_current_at_entry(tel):
    """Without a processor the span contexts are made when first read; they must still descend from the span
    that was current when the phase began, not from whatever is current when they are read."""
    provider = sdk_trace.TracerProvider()
    tracer = provider.get_tracer("user")
    with tracer.start_as_current_span("epoch") as epoch, tel.phase("actor_train", "train_step") as ph:
        execute = trace.get_current_span()  # not read yet: only a handle
    with tracer.start_as_current_span("unrelated"):  # read later, under another span
        made = execute.get_span_context()
        carrier = ph.carrier()
    assert made.trace_id == epoch.get_span_context().trace_id
    assert TRACEPARENT.match(carrier["traceparent"]).groups() == (f"{made.trace_id:032x}", f"{made.span_id:016x}")


def test_deferred_context_is_one_context_for_every_reader(tel):
    """Threads reading a phase's context at once all get the same IDs (one is drawn, never two)."""
    import threading

    with tel.phase("actor_train", "train_step"):
        execute = trace.get_current_span()
    barrier, got = threading.Barrier(8), []

    def read() -> None:
        barrier.wait()
        got.append(execute.get_span_context())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({(c.trace_id, c.span_id) for c in got}) == 1 and got[0].is_valid
    assert repr(execute) == f"NonRecordingSpan({got[0]!r})"


def test_phases_without_tracing_build_no_tracer_provider():
    """Without ``tracing=`` nothing can receive a phase's spans, so phases do not load the SDK's trace package:
    the first read of a span context builds the provider, and the carrier it gives continues the trace. (The
    resource, with the SDK's detectors, is built by ``init()`` itself: docs/architecture.md.)"""
    import json
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = """
import json, sys
import rl_otel
sdk = ("opentelemetry.sdk.trace",)
tel = rl_otel.init("lazy", prometheus=False, handle_sigterm=False)
for _ in range(3):
    with tel.phase("actor_train", "train_step") as ph:
        pass
before = sorted(m for m in sdk if m in sys.modules)
with tel.phase("actor_train", "train_step") as ph:
    carrier = ph.carrier()
print(json.dumps({"before": before, "after": sorted(m for m in sdk if m in sys.modules), "carrier": carrier,
                  "keys": len(ph.metrics)}))
tel.close()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # the checkout first, then whatever path the suite runs with (on the GPU machine the OTel packages come from
    # a PYTHONPATH entry: replacing it made the child exit 1 there, unable to import opentelemetry)
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=repo,
                         env={**env, "PYTHONPATH": path})
    assert run.returncode == 0, run.stderr[-4000:]
    out = run.stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["before"] == [] and "opentelemetry.sdk.trace" in got["after"]
    assert TRACEPARENT.match(got["carrier"]["traceparent"]) and got["keys"] >= 8
