"""One RL step, one trace, within one process: IDs from the run and the step, the ``step`` span and its adapter."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rl_otel
from rl_otel._internal.tracing.steps import emits_step_spans, step_ids
from rl_otel._internal.tracing.tracing import ChosenIdGenerator


def test_step_ids_are_the_runs_and_the_steps():
    assert step_ids("exp", 3) == step_ids("exp", 3)
    ids = {step_ids(run, step) for run in ("exp", "exp2") for step in (0, 1, 2**63 - 1)}
    assert len(ids) == 6
    assert all(0 < t < 2**128 and 0 < s < 2**64 for t, s in ids)


def test_one_process_per_run_writes_the_step_spans():
    assert emits_step_spans("trainer", 0)
    assert not emits_step_spans("trainer", 1) and not emits_step_spans("actor_train", 0)


def test_chosen_ids_reach_the_sdks_span():
    """The adapter's contract with the SDK: inside ``chosen()`` the next root span started on this thread gets
    the given IDs, the span after it random ones. Fails if an SDK release stops asking the provider's generator
    (or asks it more than once per span)."""
    ids = ChosenIdGenerator()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with ids.chosen(0xABC, 0xDEF):
        chosen = tracer.start_span("step")
        other = tracer.start_span("next")
    chosen.end()
    other.end()
    assert (chosen.get_span_context().trace_id, chosen.get_span_context().span_id) == (0xABC, 0xDEF)
    assert other.get_span_context().span_id != 0xDEF and other.get_span_context().trace_id != 0xABC
    provider.shutdown()


def _spans(exporter):
    return list(exporter.get_finished_spans())


def _run(exporter, run, steps, *, rank=0, role="trainer", log=True, first_step=None):
    tel = rl_otel.init(run=run, rank=rank, role=role, prometheus=False, tracing=exporter)
    for step in steps:
        given = step if step == first_step else None
        with tel.phase("actor_infer", "generate", step=given):
            pass
        with tel.phase("actor_train", "train_step", step=given):
            pass
        if log:
            tel.log({"actor/pg_loss": 0.1}, step=step)
    tel.close()


@pytest.mark.parametrize(("start", "told"), [(0, True), (7, True), (0, False), (7, False)])
def test_each_step_is_one_trace_under_its_step_span(start, told):
    """A run (or one resumed at step 7): each step's phases share the trace of ``step_ids(run, step)``, under the
    ``step`` span this process (rank 0, trainer) writes - also the first step's phases when nothing tells them
    their step (``told=False``: started in a provisional trace, held, moved at the first ``log()``)."""
    exporter = InMemorySpanExporter()
    _run(exporter, "exp", range(start, start + 3), first_step=start if told else None)
    spans = _spans(exporter)
    for step in range(start, start + 3):
        trace_id, step_span = step_ids("exp", step)
        mine = [s for s in spans if s.context.trace_id == trace_id]
        roots = [s for s in mine if s.parent is None]
        assert [r.name for r in roots] == ["step"] and roots[0].context.span_id == step_span
        assert roots[0].attributes["step"] == step
        phases = [s for s in mine if s.name in ("actor_infer/generate", "actor_train/train_step")]
        assert len(phases) == 2 and all(p.parent.span_id == step_span for p in phases)
        assert all(p.attributes["step"] == step for p in phases)
        assert len(mine) == 1 + 2 * 4  # the step and two phases of four spans
        assert roots[0].start_time <= min(p.start_time for p in phases)
        assert roots[0].end_time >= max(p.end_time for p in phases)
    assert len(spans) == 3 * 9


def test_two_runs_at_once_have_their_own_traces():
    exporters = {run: InMemorySpanExporter() for run in ("run_a", "run_b")}
    tels = {run: rl_otel.init(run=run, prometheus=False, tracing=exporters[run]) for run in exporters}
    for step in range(2):
        for tel in tels.values():  # interleaved: both open at once
            with tel.phase("actor_train", "train_step", step=step):
                pass
            tel.log({"x": 1.0}, step=step)
    for tel in tels.values():
        tel.close()
    for run, exporter in exporters.items():
        spans = _spans(exporter)
        assert len(spans) == 2 * 5
        assert {s.context.trace_id for s in spans} == {step_ids(run, step)[0] for step in range(2)}


def test_another_rank_joins_the_trace_without_writing_the_step_span():
    exporter = InMemorySpanExporter()
    _run(exporter, "exp", range(2), rank=1, first_step=0)
    spans = _spans(exporter)
    assert "step" not in {s.name for s in spans}
    for step in range(2):
        trace_id, step_span = step_ids("exp", step)
        roots = [s for s in spans if s.context.trace_id == trace_id and s.name.startswith("actor_")]
        assert len(roots) == 2 and all(r.parent.span_id == step_span and r.parent.is_remote for r in roots)


def test_a_process_that_knows_no_step_still_exports_its_spans_with_the_runs_attributes():
    exporter = InMemorySpanExporter()
    _run(exporter, "exp", range(2), role="rollout", log=False)
    spans = _spans(exporter)
    assert len(spans) == 2 * 2 * 4
    step_traces = {step_ids("exp", step)[0] for step in range(3)}
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 4 and not {s.context.trace_id for s in spans} & step_traces
    assert all("step" not in r.attributes for r in roots)
    assert {(r.resource.attributes["rl.run"], r.resource.attributes["rl.role"]) for r in roots} == {
        ("exp", "rollout")}


def test_a_phase_inside_a_span_stays_its_child():
    """A carrier or an enclosing span is a phase's parent, as before; only a phase with none goes under its step."""
    exporter = InMemorySpanExporter()
    tel = rl_otel.init(run="exp", prometheus=False, tracing=exporter)
    tel.log({"x": 1.0}, step=0)
    with tel.phase("actor_train", "train_step") as outer, tel.phase("actor_train", "inner"):
        carrier = outer.carrier()
    with tel.phase("reference", "compute_log_probs", parent=carrier):
        pass
    tel.log({"x": 1.0}, step=1)
    tel.close()
    spans = {s.name: s for s in _spans(exporter) if "/" in s.name}
    trace_id, step_span = step_ids("exp", 1)
    assert {s.context.trace_id for s in spans.values()} == {trace_id}
    assert spans["actor_train/train_step"].parent.span_id == step_span
    assert spans["actor_train/inner"].parent.span_id != step_span
    assert spans["reference/compute_log_probs"].parent.span_id != step_span


def test_an_async_rollout_links_to_the_step_whose_policy_made_it():
    """A rollout generated with step 3's policy and trained on at step 5: in step 5's trace, linked to step 3's
    ``step`` span (Tempo shows the link), with the policy's step as an attribute."""
    exporter = InMemorySpanExporter()
    tel = rl_otel.init(run="async", prometheus=False, tracing=exporter)
    for step in range(6):
        with tel.phase("actor_infer", "generate", step=step, policy_step=max(0, step - 2)):
            pass
        tel.log({"x": 1.0}, step=step)
    tel.close()
    (rollout,) = [s for s in _spans(exporter) if s.name == "actor_infer/generate" and s.attributes["step"] == 5]
    assert rollout.context.trace_id == step_ids("async", 5)[0] and rollout.attributes["policy_step"] == 3
    (link,) = rollout.links
    assert (link.context.trace_id, link.context.span_id) == step_ids("async", 3)
    steps = {s.context.span_id for s in _spans(exporter) if s.name == "step"}
    assert link.context.span_id in steps  # the linked span exists: step 3's step span


def test_a_roll_phase_goes_under_the_step_roll_gives_its_worker():
    """ROLL's workers log no step; their methods read ``data.meta_info["global_step"]`` into ``global_step`` before
    ``state_offload_manger``: the phase's spans go in that step's trace (the shape ROLL's code has, pinned here)."""
    import contextlib

    from rl_otel.integrations import roll_phases

    @contextlib.contextmanager
    def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True, load_kwargs=None):
        yield

    class Meta:
        def __init__(self) -> None:
            self.meta_info = {"global_step": 7}

    def train_step(data):  # as ROLL's worker methods are written
        global_step = data.meta_info.get("global_step", 0)
        with wrapped(None, {}, "actor_train/train_step"):
            pass
        return global_step

    def no_step():
        with wrapped(None, {}, "actor_train/train_step"):
            pass

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    wrapped = roll_phases.wrap(state_offload_manger)
    roll_phases.use_tracing(provider, None, run="roll-exp")
    try:
        train_step(Meta())
        no_step()
    finally:
        roll_phases.use_tracing(None, None)
    with_step, without = [s for s in exporter.get_finished_spans() if s.name == "actor_train/train_step"]
    assert with_step.context.trace_id == step_ids("roll-exp", 7)[0]
    assert with_step.parent.span_id == step_ids("roll-exp", 7)[1] and with_step.attributes["step"] == 7
    assert without.parent is None and "step" not in without.attributes


def _held_setup():
    from rl_otel._internal.tracing.pending import PendingSteps

    pending, exporter = PendingSteps(), InMemorySpanExporter()
    pending.add(SimpleSpanProcessor(exporter))
    provider = TracerProvider()
    provider.add_span_processor(pending)
    return pending, exporter, provider.get_tracer("t")


def test_held_spans_move_to_their_step_even_when_one_ends_after_the_step_is_known():
    """A phase's root may end after the step's log() (it waits for its GPU times): it follows its children."""
    from opentelemetry import trace

    pending, exporter, tracer = _held_setup()
    root = tracer.start_span("actor_train/train_step", attributes={"cluster": "actor_train", "phase": "train_step"})
    pending.hold(root.get_span_context().trace_id)
    tracer.start_span("execute", context=trace.set_span_in_context(root),
                      attributes={"cluster": "actor_train", "phase": "train_step"}).end()
    assert exporter.get_finished_spans() == ()  # held
    trace_id, step_span = step_ids("exp", 4)
    pending.resolve(4, trace_id, step_span)
    root.end()  # late
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {s.context.trace_id for s in spans.values()} == {trace_id}
    assert spans["actor_train/train_step"].parent.span_id == step_span
    assert spans["execute"].parent.span_id == spans["actor_train/train_step"].context.span_id
    assert spans["execute"].attributes["step"] == 4


def test_held_spans_are_sent_as_they_are_on_a_flush_or_after_the_hold_limit(monkeypatch):
    from rl_otel._internal.tracing import pending as pending_module

    pending, exporter, tracer = _held_setup()
    span = tracer.start_span("a/b", attributes={"cluster": "a", "phase": "b"})
    pending.hold(span.get_span_context().trace_id)
    span.end()
    assert exporter.get_finished_spans() == ()
    assert pending.force_flush(1000)
    assert [s.context.trace_id for s in exporter.get_finished_spans()] == [span.get_span_context().trace_id]

    monkeypatch.setattr(pending_module, "MAX_HELD", 3)  # a process that logs no step: sent once too many wait
    exporter.clear()
    for _ in range(3):
        span = tracer.start_span("a/b", attributes={"cluster": "a", "phase": "b"})
        pending.hold(span.get_span_context().trace_id)
        span.end()
    assert len(exporter.get_finished_spans()) == 3


def test_a_step_taken_by_submit_writes_its_step_span_too():
    exporter = InMemorySpanExporter()
    tel = rl_otel.init(run="submitted", prometheus=False, tracing=exporter)
    with tel.phase("actor_train", "train_step"):
        pass
    tel.submit(lambda: {"actor/pg_loss": 0.1}, step=3).result(timeout=30)
    tel.close()
    spans = _spans(exporter)
    trace_id, step_span = step_ids("submitted", 3)
    assert {s.context.trace_id for s in spans} == {trace_id}
    assert [s.context.span_id for s in spans if s.name == "step"] == [step_span]
