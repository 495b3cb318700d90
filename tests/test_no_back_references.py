"""Issue 40: dependencies are handed down, never reached back up. Below the facade no rl_otel object holds a strong
reference, direct or through a closure, a bound method, a ``functools.partial``, a thread's target or a container,
to an object that (transitively) holds it: the graph of rl_otel's objects is acyclic.

The graph is walked from a working :class:`~rl_otel.telemetry.Telemetry` that used every part (an endpoint, a
tracker, OTLP-less tracing, phases, a submitted job, a scrape, a collective). A cycle is reported as the classes on
it and the attribute path that closes it, so the back-reference is named. An object's reference to itself through
its own thread or closure (a worker whose thread runs its loop) is not a back-reference. Weak references are not
followed: they keep nothing alive (the signal handlers reach ``Telemetry.close`` through one).
"""

from __future__ import annotations

import collections
import functools
import threading
import types
import urllib.request
import weakref

import pytest

import rl_otel

# foreign objects whose attributes are followed: the OTel SDK's providers and processors, threads and futures hold
# rl_otel's callbacks (a span processor, a thread's target); the rest (torch, sockets, modules) cannot hold them
_FOLLOWED_FOREIGN = ("opentelemetry.", "threading", "concurrent.", "queue")


def _is_ours(obj: object) -> bool:
    return type(obj).__module__.startswith("rl_otel.")


def _children(obj: object) -> list[tuple[str, object]]:
    """The strong references of ``obj``, each with the name it is reached by."""
    out: list[tuple[str, object]] = []
    if isinstance(obj, (type, types.ModuleType, weakref.ref, weakref.WeakSet, weakref.WeakValueDictionary,
                        weakref.WeakKeyDictionary)):
        return out
    if isinstance(obj, (weakref.WeakMethod,)):
        return out
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            out.append((f"[{key!r:.40}]", value))
            if not isinstance(key, (str, int, float, tuple)):
                out.append(("<key>", key))
        return out
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return [(f"[{i}]", v) for i, v in enumerate(list(obj))]
    if isinstance(obj, types.MethodType):
        return [("__self__", obj.__self__), ("__func__", obj.__func__)]
    if isinstance(obj, types.FunctionType):
        cells = obj.__closure__ or ()
        names = obj.__code__.co_freevars
        for name, cell in zip(names, cells, strict=False):
            try:
                out.append((f"<closure {name}>", cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        out += [(f"<default {i}>", d) for i, d in enumerate(obj.__defaults__ or ())]
        return out
    if isinstance(obj, functools.partial):
        return [("func", obj.func), *((f"arg{i}", a) for i, a in enumerate(obj.args)),
                *((k, v) for k, v in obj.keywords.items())]
    module = type(obj).__module__
    if not (_is_ours(obj) or module.startswith(_FOLLOWED_FOREIGN)):
        return out
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot) and slot != "__weakref__":
                out.append((f".{slot}", getattr(obj, slot)))
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        out += [(f".{k}", v) for k, v in vars(obj).items()]
    return out


def our_graph(root: object) -> dict[int, tuple[object, dict[int, str]]]:
    """rl_otel's objects reachable from ``root``: id -> (object, {id of an rl_otel object it reaches: path})."""
    nodes: dict[int, tuple[object, dict[int, str]]] = {}
    todo = [root]
    while todo:
        start = todo.pop()
        if id(start) in nodes:
            continue
        edges: dict[int, str] = {}
        nodes[id(start)] = (start, edges)
        seen = {id(start)}
        stack: list[tuple[str, object]] = list(_children(start))
        while stack:
            path, obj = stack.pop()
            if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
                continue
            seen.add(id(obj))
            if _is_ours(obj) and not isinstance(obj, (types.FunctionType, types.MethodType)):
                if obj is not start:
                    edges.setdefault(id(obj), path)
                    todo.append(obj)
                continue
            stack.extend((f"{path}{name}", child) for name, child in _children(obj))
    return nodes


def cycles(nodes: dict[int, tuple[object, dict[int, str]]]) -> list[list[int]]:
    """The strongly connected components of more than one object (Tarjan's algorithm, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    found: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(nodes[root][1]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in nodes:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(nodes[child][1])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def describe(nodes: dict[int, tuple[object, dict[int, str]]], component: list[int]) -> str:
    members = set(component)
    lines = []
    for member in component:
        obj, edges = nodes[member]
        for target, path in edges.items():
            if target in members:
                lines.append(f"  {type(obj).__qualname__}{path} -> {type(nodes[target][0]).__qualname__}")
    return "\n".join(sorted(lines))


@pytest.fixture
def busy_telemetry(tmp_path):
    tel = rl_otel.init(run="graph", prometheus={"host": "127.0.0.1", "port": 0}, trackers=["stdout"],
                       tracker_kwargs={"stdout": {"path": str(tmp_path / "out.txt")}},
                       tracing={"exporter": "jsonl", "path": str(tmp_path / "spans.jsonl")},
                       stack_dump_dir=str(tmp_path / "dumps"))
    try:
        with tel.phase("actor_train", "train_step"), tel.collective("allreduce"):
            pass
        tel.log({"actor/pg_loss": 0.5, "critic/score/mean": 1.0, "my/own_key": 2.0})
        tel.submit(lambda: {"actor/entropy": 0.1}).result(timeout=60)
        tel.flush(60)
        assert urllib.request.urlopen(tel.metrics_url, timeout=60).status == 200
        yield tel
    finally:
        tel.close()


def test_the_objects_below_the_facade_form_no_cycle(busy_telemetry):
    nodes = our_graph(busy_telemetry)
    assert len(nodes) > 20, f"the walk found only {len(nodes)} of rl_otel's objects: it no longer follows them"
    found = cycles(nodes)
    assert not found, "back-references (an object reaching what holds it):\n" + "\n\n".join(
        describe(nodes, c) for c in found)


def test_the_walk_finds_a_back_reference():
    """The check can fail: a child handed a callback of its parent's is a cycle."""

    class Parent:
        pass

    class Child:
        pass

    Parent.__module__ = Child.__module__ = "rl_otel.fake"
    parent, child = Parent(), Child()
    parent.child = child
    child.on_event = lambda: parent  # a closure over its builder
    nodes = our_graph(parent)
    found = cycles(nodes)
    assert len(found) == 1 and "Child.on_event<closure parent> -> " in describe(nodes, found[0])
    child.on_event = weakref.WeakMethod(threading.Thread().start)  # weak: not followed
    assert not cycles(our_graph(parent))
