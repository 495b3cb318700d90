"""Broad ``except`` clauses only at real boundaries (issue 40).

A broad clause (``except Exception``, ``except BaseException``, a bare ``except:``, or a tuple holding one of them)
turns any error into a counter or a silence, a bug in rl_otel's own code included. It belongs where rl_otel calls
code it does not own (the user's code and values, a tracker sink or another library, torch/CUDA/NVML, the OS,
sockets and signals), at a thread's top-level loop, in an interpreter hook, and on the training thread where no
guard above it exists: nowhere else. Every such place is listed below with the reason in a few words, and the
clause itself says why in a comment (on the ``except`` line, or the first line of its body). The scan is of the
source (the AST), keyed by module path and enclosing qualified function name, with the count per function: a new
broad clause anywhere else, one more in a listed function, or a listed place that no longer has one fails here,
naming ``file:line``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rl_otel"
BROAD = frozenset({"Exception", "BaseException"})

Places = dict[tuple[str, str], tuple[int, str]]

# (module path, enclosing qualified function name) -> (broad clauses in it, the boundary in a few words)
ALLOWLIST: Places = {
    ("rl_otel/_internal/atomic.py", "atomic_write"): (1, "OS and caller's body: temp file removed, re-raised"),
    ("rl_otel/_internal/exporters/cputime.py", "_on_collection"): (1, "a gc callback (interpreter hook)"),
    ("rl_otel/_internal/exporters/engines.py", "EngineFamilies.collect"): (2, "an engine's metrics registry/objects"),
    ("rl_otel/_internal/exporters/otlp.py", "counted_span_exporter.CountedSpanExporter.export"):
        (1, "the OTel SDK's span exporter"),
    ("rl_otel/_internal/exporters/otlp_push.py", "StoreExporter.export"):
        (2, "the OTel SDK's export thread and exporter"),
    ("rl_otel/_internal/exporters/prometheus.py", "ScrapeRegistry._registered"):
        (1, "registered prometheus_client collectors"),
    ("rl_otel/_internal/pipeline/goodput.py", "Goodput.enter"): (1, "training thread, no guard above"),
    ("rl_otel/_internal/pipeline/goodput.py", "Goodput.switch"): (1, "training thread, no guard above"),
    ("rl_otel/_internal/pipeline/goodput.py", "Goodput.leave"): (1, "training thread, no guard above"),
    ("rl_otel/_internal/pipeline/values.py", "flatten"): (1, "a user key's __str__"),
    ("rl_otel/_internal/pipeline/values.py", "to_host"): (2, "user tensors, torch/CUDA copies"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer.begin"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer.mark"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer.finish"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer._resolve"): (1, "torch.cuda event queries"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer._deliver"): (1, "the on_resolved callback (OTel SDK spans)"),
    ("rl_otel/_internal/probes/gpu_time.py", "GpuTimer.wait"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch._run"): (1, "the watchdog thread's loop"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch.check"): (1, "stack dumps: files, py-spy, callbacks"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch.http_text"): (1, "an HTTP request for a dump"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch._http_dump"): (1, "a dump thread, handed to the request"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch._header"): (1, "the describe callback"),
    ("rl_otel/_internal/probes/hangs.py", "HangWatch._give_back_signal"): (1, "faulthandler, signals"),
    ("rl_otel/_internal/probes/live.py", "process_start_time"): (2, "psutil, /proc"),
    ("rl_otel/_internal/probes/live.py", "load_nvml"): (1, "importing pynvml"),
    ("rl_otel/_internal/probes/live.py", "NvmlPoller.close"): (1, "NVML"),
    ("rl_otel/_internal/probes/live.py", "NvmlPoller._run"): (2, "NVML, the poller thread's loop"),
    ("rl_otel/_internal/probes/live.py", "NvmlPoller._poll"): (1, "NVML"),
    ("rl_otel/_internal/probes/live.py", "_safe.collect"): (1, "psutil/the OS, torch's allocator"),
    ("rl_otel/_internal/probes/memory.py", "torch_cuda"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/memory.py", "GpuProbe.live"): (1, "torch.cuda"),
    ("rl_otel/_internal/probes/torch_collectives.py", "_group_names"): (1, "torch.distributed internals"),
    ("rl_otel/_internal/probes/torch_collectives.py", "CollectiveProbe._groups"): (1, "torch.distributed internals"),
    ("rl_otel/_internal/runtime/ranks.py", "_store_token"): (1, "sockets, torch.distributed's TCPStore"),
    ("rl_otel/_internal/runtime/serving.py", "Served.__init__"): (1, "publishing targets: endpoint closed, re-raised"),
    ("rl_otel/_internal/tracing/pending.py", "PendingSteps._flush_loop"): (1, "the OTel SDK's span processors"),
    ("rl_otel/_internal/tracing/pending.py", "PendingSteps._send"): (1, "the on_root callback"),
    ("rl_otel/_internal/tracing/steps.py", "StepSpans.logged"): (1, "the OTel SDK and its span processors"),
    ("rl_otel/_internal/trackers/bridge.py", "Bridge._worker.write"): (1, "a tracker sink"),
    ("rl_otel/_internal/trackers/bridge.py", "Bridge._worker.guarded.run"): (1, "a tracker sink"),
    ("rl_otel/_internal/trackers/bridge.py", "build_bridge"): (3, "tracker constructors and close"),
    ("rl_otel/_internal/trackers/bridge.py", "_start.construct"): (2, "a tracker's constructor and close"),
    ("rl_otel/integrations/__init__.py", "config_get"): (1, "a framework's config object"),
    ("rl_otel/integrations/accelerate.py", "RLOtelTracker.log"): (1, "starting Telemetry inside accelerate"),
    ("rl_otel/integrations/nemo_rl.py", "RLOtelLogger.log_metrics"): (1, "NeMo-RL's values and step"),
    ("rl_otel/integrations/nemo_rl.py", "attach"): (2, "importing NeMo-RL, its ABC registration"),
    ("rl_otel/integrations/ray.py", "TargetsEndpoint.__init__.Handler.do_GET"): (1, "Ray"),
    ("rl_otel/integrations/ray.py", "TargetsEndpoint.close"): (1, "Ray"),
    ("rl_otel/integrations/ray.py", "Registration.close"): (1, "Ray"),
    ("rl_otel/integrations/ray.py", "register"): (1, "Ray"),
    ("rl_otel/integrations/roll_phases.py", "install_here"): (2, "importing ROLL, other modules' objects"),
    ("rl_otel/integrations/roll_phases.py", "uninstall"): (1, "other modules' objects"),
    ("rl_otel/integrations/roll_phases.py", "_PhaseSpans.__enter__"): (1, "ROLL's context manager, re-raised"),
    ("rl_otel/integrations/roll_phases.py", "_PhaseSpans.__exit__"): (1, "ROLL's context manager, re-raised"),
    ("rl_otel/integrations/roll_phases.py", "_PhaseSpans._guard"): (1, "the OTel SDK inside ROLL's phase"),
    ("rl_otel/integrations/roll_phases.py", "patch_cluster"): (1, "importing ROLL"),
    ("rl_otel/integrations/roll_phases.py", "patch_cluster.__init__"): (1, "ROLL's Cluster call"),
    ("rl_otel/integrations/roll_phases.py", "worker_class"): (1, "ROLL's class import"),
    ("rl_otel/integrations/roll_phases.py", "_worker_init"): (1, "a ROLL worker's start"),
    ("rl_otel/integrations/slime.py", "check_slime"): (1, "importing and inspecting slime"),
    ("rl_otel/integrations/slime.py", "log_rollout_data"): (1, "slime's functions and samples"),
    ("rl_otel/integrations/slime.py", "log_eval_rollout_data"): (1, "slime's functions and results"),
    ("rl_otel/integrations/slime.py", "_telemetry"): (1, "starting Telemetry inside slime"),
    ("rl_otel/integrations/transformers.py", "RLOtelCallback._try_start"): (1, "starting Telemetry inside a Trainer"),
    ("rl_otel/integrations/trinity.py", "RLOtelMonitor.__del__"): (1, "a finalizer"),
    ("rl_otel/integrations/verl.py", "install_from_plugin"): (1, "verl's plugin loader"),
    ("rl_otel/phases.py", "engine_headers"): (1, "the OTel propagators"),
    ("rl_otel/sinks/tensorboard.py", "TensorBoardSink.log"): (2, "the OS: the event file"),
    ("rl_otel/sinks/tensorboard.py", "TensorBoardSink._drop_writer"): (1, "the OS: the event file"),
    ("rl_otel/sinks/tfevents.py", "EventFileWriter.__init__"): (1, "the OS: file closed, re-raised"),
    ("rl_otel/sinks/tfevents.py", "EventFileWriter.add_event"): (1, "the OS: writer broken, re-raised"),
    ("rl_otel/watch/state.py", "load"): (1, "a state file of any content"),
    ("rl_otel/watch/watcher.py", "Watcher.poll"): (1, "the watch loop's pass"),
    ("rl_otel/watch/watcher.py", "Watcher._points"): (1, "protobuf decoding records of any content"),
    ("rl_otel/_internal/forks.py", "_after_fork_in_child"): (1, "the fork hook: a child always starts"),
    ("rl_otel/_internal/pipeline/ingest.py", "Ingest._route_safely"): (1, "a user value (a raising __float__)"),
    ("rl_otel/_internal/pipeline/ingest.py", "Ingest.route"): (2, "the user's mapping; torch copies"),
    ("rl_otel/_internal/pipeline/recorder.py", "Recorder.collect"): (2, "a broken store; a collector (torch, OS)"),
    ("rl_otel/_internal/pipeline/steplog.py", "StepLog._record_queued"): (1, "the metrics worker's job"),
    ("rl_otel/_internal/pipeline/steplog.py", "StepLog._run_submitted"): (1, "the user's submitted function"),
    ("rl_otel/_internal/pipeline/steps.py", "Steps._valid"): (1, "the user's step object's __int__"),
    ("rl_otel/_internal/pipeline/steps.py", "_safe_repr"): (1, "the user's object's __repr__"),
    ("rl_otel/_internal/pipeline/worker.py", "Worker._loop"): (1, "the worker thread's loop"),
    ("rl_otel/_internal/pipeline/worker.py", "Worker._report"): (1, "the owner's error callback"),
    ("rl_otel/_internal/pipeline/worker.py", "Worker._run"): (1, "the owner's close hook (a sink's close)"),
    ("rl_otel/_internal/runtime/components.py", "Components._shutdown_providers.shut"): (1, "the OTel SDK's shutdown"),
    ("rl_otel/_internal/runtime/components.py", "Components.close"): (1, "the OS's signal calls"),
    ("rl_otel/_internal/runtime/components.py", "_closing.guarded"): (1, "a part's close (sinks, SDK, files)"),
    ("rl_otel/_internal/runtime/components.py", "_flush_spans"): (1, "the OTel SDK's exporters"),
    ("rl_otel/_internal/runtime/components.py", "final_scrape"): (1, "the endpoint's server at close"),
    ("rl_otel/_internal/runtime/phase.py", "Phase.__enter__"): (4, "training thread: registry, OTel SDK, torch.cuda"),
    ("rl_otel/_internal/runtime/phase.py", "Phase.__exit__"): (2, "torch.cuda; the training thread's one record guard"),
    ("rl_otel/_internal/runtime/phase.py", "Phase._call_user"): (1, "the user's onload/offload (re-raised)"),
    ("rl_otel/_internal/runtime/phase.py", "Phase._guard"): (1, "the OTel SDK's span and context calls"),
    ("rl_otel/_internal/runtime/phase.py", "Phase._leave"): (1, "training thread, no guard above"),
    ("rl_otel/_internal/runtime/phase.py", "Phase._snapshots"): (2, "torch.cuda, psutil"),
    ("rl_otel/_internal/runtime/phase.py", "Phase.carrier"): (1, "the OTel propagators"),
    ("rl_otel/telemetry.py", "Telemetry.log"): (1, "the training step must go on"),
    ("rl_otel/telemetry.py", "Telemetry.submit"): (1, "the training step must go on"),
    ("rl_otel/watch/backfill.py", "_points"): (1, "a record of the user's files (protobuf)"),
    ("rl_otel/watch/served.py", "RunTarget._log"): (1, "a watcher never stops for one run"),
    ("rl_otel/watch/served.py", "RunTarget._serve"): (1, "binding a socket, writing the targets file"),
    ("rl_otel/_internal/exporters/exposition.py", "Renderer._prepare"): (1, "a family as written: the others served"),
    ("rl_otel/_internal/exporters/exposition.py", "Renderer._finish"): (1, "a family as written: the others served"),
    ("rl_otel/_internal/exporters/exposition.py", "Renderer._compile_family"): (1, "a rollback, re-raised"),
    ("rl_otel/_internal/exporters/exposition.py", "Renderer.fill"): (1, "a stored value that is not a number"),
    ("rl_otel/_internal/exporters/exposition.py", "Renderer._fill_by_family"): (1, "a family's stored values"),
    ("rl_otel/_internal/exporters/server.py", "Server._run"): (1, "the event loop's thread"),
    ("rl_otel/_internal/exporters/server.py", "_listen"): (1, "a rollback of the OS's socket calls, re-raised"),
    ("rl_otel/_internal/exporters/appworker.py", "AppWorker._work"): (1, "the application: render, collectors"),
}

@dataclass(frozen=True)
class Clause:
    """One broad ``except`` clause: where it is, and whether a comment says why."""

    path: str  # relative to the repository, with "/"
    function: str  # the enclosing qualified name ("Class.method", "<module>" at module level)
    line: int
    commented: bool


def _is_broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)) in BROAD for n in names)


def clauses(source: str, path: str) -> list[Clause]:
    """The broad clauses of one module's ``source``; a comment on the ``except`` line, on a line between it and
    the first statement of its body, or on that statement's line, is the reason."""
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    found: list[Clause] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = (*scope, node.name)
        if isinstance(node, ast.ExceptHandler) and _is_broad(node):
            lines = range(node.lineno, node.body[0].lineno + 1)
            found.append(Clause(path, ".".join(scope) or "<module>", node.lineno,
                                any(line in comments for line in lines)))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source), ())
    return found


def problems(found: list[Clause], allowed: Places, pending: Places) -> list[str]:
    """What is wrong with ``found`` against the lists: each a line naming ``file:line`` (or the listed place)."""
    out: list[str] = []
    by_place: dict[tuple[str, str], list[Clause]] = {}
    for clause in found:
        by_place.setdefault((clause.path, clause.function), []).append(clause)
    for place, here in sorted(by_place.items()):
        listed = allowed.get(place) or pending.get(place)
        where = ", ".join(f"{c.path}:{c.line}" for c in here)
        if listed is None:
            out.append(f"{where}: a broad except in {place[1]}, a place not in ALLOWLIST (catch the exceptions "
                       "that can occur, or list the boundary with its reason)")
        elif len(here) > listed[0]:
            out.append(f"{where}: {len(here)} broad excepts in {place[1]}, {listed[0]} listed")
        if place not in pending:
            out += [f"{c.path}:{c.line}: a broad except with no comment saying why" for c in here if not c.commented]
    for place, (count, _) in sorted({**pending, **allowed}.items()):
        have = len(by_place.get(place, ()))
        if have < count:
            out.append(f"{place[0]} {place[1]}: listed with {count} broad excepts, has {have} (update the list)")
    return out


def _package_clauses() -> list[Clause]:
    return [clause for path in sorted(PACKAGE.rglob("*.py"))
            for clause in clauses(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]


def test_broad_excepts_are_only_at_the_listed_boundaries_each_saying_why():
    found = _package_clauses()
    assert found, "the scan found no broad except at all: it looks in the wrong place"
    assert problems(found, ALLOWLIST, {}) == []


def test_every_entry_has_a_reason():
    for place, (count, reason) in ALLOWLIST.items():
        assert count >= 1 and reason.strip(), place


_SOURCE = '''
def listed():
    try:
        pass
    except Exception:  # boundary: the user's code
        pass


class Sink:
    def write(self):
        try:
            pass
        except (OSError, BaseException):
            pass
        try:
            pass
        except:
            # boundary: the OS
            pass
'''


def test_the_check_names_a_new_one_an_extra_one_an_uncommented_one_and_a_stale_entry():
    found = clauses(_SOURCE, "pkg/mod.py")
    assert [(c.function, c.line, c.commented) for c in found] == [
        ("listed", 5, True), ("Sink.write", 13, False), ("Sink.write", 17, True)]
    assert problems(found, {("pkg/mod.py", "listed"): (1, "r"), ("pkg/mod.py", "Sink.write"): (2, "r")}, {}) == [
        "pkg/mod.py:13: a broad except with no comment saying why"]
    unlisted = problems(found, {("pkg/mod.py", "listed"): (1, "r")}, {})
    assert unlisted[0].startswith("pkg/mod.py:13, pkg/mod.py:17: a broad except in Sink.write, a place not in")
    assert problems(found, {("pkg/mod.py", "listed"): (1, "r"), ("pkg/mod.py", "Sink.write"): (1, "r")}, {})[0] == (
        "pkg/mod.py:13, pkg/mod.py:17: 2 broad excepts in Sink.write, 1 listed")
    stale = {("pkg/mod.py", "listed"): (1, "r"), ("pkg/mod.py", "Sink.write"): (2, "r"),
             ("pkg/mod.py", "gone"): (1, "r")}
    assert problems(found, stale, {})[-1] == "pkg/mod.py gone: listed with 1 broad excepts, has 0 (update the list)"
    # a pending place is counted but not asked for a comment
    assert problems(found, {("pkg/mod.py", "listed"): (1, "r")}, {("pkg/mod.py", "Sink.write"): (2, "r")}) == []
