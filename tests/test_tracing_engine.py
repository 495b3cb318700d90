"""The engine's requests under the generation phase: the headers :func:`rl_otel.phases.engine_headers` gives, read
the way a tracing engine reads them (vLLM's ``extract_trace_context``: the OTel SDK's W3C propagator), parent the
engine's request span under the phase's ``execute`` span, in the step's trace."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import rl_otel
from rl_otel._internal.tracing.steps import step_ids
from rl_otel.phases import engine_headers


def _engine_request(headers: dict[str, str], engine: TracerProvider) -> None:
    """What a tracing engine does with a request's headers: extract the context, start its request span in it
    (another process's provider in a real run: nothing of rl_otel's is shared but the headers)."""
    context = TraceContextTextMapPropagator().extract(headers)
    span = engine.get_tracer("engine").start_span("llm_request", context=context, kind=SpanKind.SERVER)
    span.end()


def test_the_engines_request_span_is_a_child_of_the_generation_phase_in_its_steps_trace():
    phases, requests = InMemorySpanExporter(), InMemorySpanExporter()
    engine = TracerProvider()
    engine.add_span_processor(SimpleSpanProcessor(requests))
    tel = rl_otel.init(run="engine_run", role="actor_infer", prometheus=False, tracing=phases)
    try:
        with tel.phase("actor_infer", "generate", step=3) as ph:
            _engine_request(engine_headers(ph), engine)  # the phase given
            _engine_request(engine_headers(), engine)  # the span current in the block
        tel.flush(10)
    finally:
        tel.close()
    execute = next(s for s in phases.get_finished_spans() if s.name == "execute")
    root = next(s for s in phases.get_finished_spans() if s.name == "actor_infer/generate")
    trace_id, step_span = step_ids("engine_run", 3)
    assert root.parent is not None and (root.context.trace_id, root.parent.span_id) == (trace_id, step_span)
    assert execute.parent is not None and execute.parent.span_id == root.context.span_id
    made = requests.get_finished_spans()
    assert len(made) == 2
    for request in made:
        assert request.parent is not None and request.parent.is_remote
        assert (request.context.trace_id, request.parent.span_id) == (trace_id, execute.context.span_id)
    engine.shutdown()


def test_no_headers_outside_a_span():
    """No phase, no span: nothing to send (the engine starts a trace of its own)."""
    assert engine_headers() == {}


def test_inside_a_roll_phase_the_headers_are_its_execute_span_in_the_global_steps_trace():
    """ROLL's ``state_offload_manger`` made a phase by ``roll_phases`` (its ``execute`` span current in the block),
    the worker method's ``global_step`` read as ROLL's are: ``engine_headers()`` in the block, where ROLL's
    strategy calls vLLM, parents the engine's request under ``execute`` in the step's trace."""
    from contextlib import contextmanager

    from rl_otel.integrations import roll_phases

    @contextmanager
    def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True, load_kwargs={}):  # noqa: B006
        yield  # ROLL's shape (its parameters: check_state_offload_manager)

    phases, requests = InMemorySpanExporter(), InMemorySpanExporter()
    mine = TracerProvider()
    mine.add_span_processor(SimpleSpanProcessor(phases))
    engine = TracerProvider()
    engine.add_span_processor(SimpleSpanProcessor(requests))
    roll_phases.use_tracing(mine, run="roll_engine")
    try:
        def generate(global_step: int) -> None:  # a ROLL worker method: step from data.meta_info["global_step"]
            with roll_phases.wrap(state_offload_manger)(None, {}, "actor_infer/generate"):
                _engine_request(engine_headers(), engine)

        generate(7)
    finally:
        roll_phases.use_tracing(None)
    execute = next(s for s in phases.get_finished_spans() if s.name == "execute")
    (request,) = requests.get_finished_spans()
    assert request.parent is not None
    assert (request.context.trace_id, request.parent.span_id) == (step_ids("roll_engine", 7)[0],
                                                                 execute.context.span_id)
    engine.shutdown()
    mine.shutdown()
