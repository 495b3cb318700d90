"""Spans as an OTLP receiver got them, and the checks of a step's trace (one trace, one root), for the tests of
``tracing/steps.py`` across processes; :func:`waterfall` draws one trace as text (``docs/tracing.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.otlp_receiver import attributes


@dataclass(frozen=True)
class Received:
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root
    name: str
    attributes: dict
    resource: dict
    start: int
    end: int
    links: tuple[tuple[int, int], ...] = ()


def received(receiver) -> list[Received]:
    """Every span the receiver decoded, in arrival order."""
    with receiver._lock:
        requests = list(receiver.traces)
    out = []
    for request in requests:
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(Received(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"),
                                        int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else 0,
                                        s.name, attributes(s.attributes), resource, s.start_time_unix_nano,
                                        s.end_time_unix_nano,
                                        tuple((int.from_bytes(link.trace_id, "big"),
                                               int.from_bytes(link.span_id, "big")) for link in s.links)))
    return out


def one_trace(spans: list[Received], trace_id: int) -> tuple[Received, list[Received]]:
    """The root and the other spans of ``trace_id``; asserts it is one tree: one root, every parent in the trace,
    no span twice."""
    mine = [s for s in spans if s.trace_id == trace_id]
    ids = [s.span_id for s in mine]
    assert len(ids) == len(set(ids)), "a span exported twice"
    roots = [s for s in mine if s.parent_id == 0]
    assert len(roots) == 1, f"{len(roots)} roots in trace {trace_id:032x}: {[r.name for r in roots]}"
    orphans = [s.name for s in mine if s.parent_id and s.parent_id not in set(ids)]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    return roots[0], [s for s in mine if s is not roots[0]]


def waterfall(spans: list[Received], trace_id: int, width: int = 48) -> str:
    """One trace as text, children under their parent, a bar per span on the trace's time axis."""
    root, rest = one_trace(spans, trace_id)
    t0, t1 = root.start, max(s.end for s in [root, *rest])
    scale = width / max(1, t1 - t0)
    children: dict[int, list[Received]] = {}
    for s in rest:
        children.setdefault(s.parent_id, []).append(s)
    lines = [f"trace {trace_id:032x}  ({(t1 - t0) / 1e6:.1f} ms)"]

    def draw(span: Received, depth: int) -> None:
        who = f"{span.resource.get('rl.role', '')}/{span.resource.get('rl.rank', '')}"
        a = int((span.start - t0) * scale)
        b = max(a + 1, int((span.end - t0) * scale))
        bar = " " * a + "█" * (b - a)
        label = ("  " * depth + span.name)[:40]
        lines.append(f"{label:<40} {who:<12} {(span.end - span.start) / 1e6:8.1f} ms |{bar:<{width}}|")
        for child in sorted(children.get(span.span_id, []), key=lambda s: (s.start, s.name)):
            draw(child, depth + 1)

    draw(root, 0)
    return "\n".join(lines)
