"""ROLL's own ``state_offload_manger`` as rl_otel phase spans (``rl_otel.integrations.roll_phases``), against a
stand-in ROLL built here (signature-faithful, none of ROLL's code): ``roll.utils.context_managers`` (the
``@contextmanager``), ``roll.pipeline.base_worker`` (imports it by name at import, as ROLL's workers do) and
``roll.distributed.executor.cluster.Cluster`` (takes the worker class or its dotted name and ships it to a worker
process with cloudpickle, as Ray does, with ``RANK`` in the worker's environment).

In a driver process ``install()`` runs; the worker class travels to a separate worker process, which sets up an
OTel SDK TracerProvider with an InMemorySpanExporter (as ROLL's ``init_telemetry`` sets its own) and runs a phase
inside a ``worker.train_step`` > ``exec`` span (as ROLL's ``register`` decorator makes them). Checked there: the
spans' names, nesting, attributes and status; ``load_states`` running inside ``onload`` and ``offload_states``
inside ``offload``; ``metrics`` holding exactly what the unpatched context manager writes; the body's exception
propagating as the same object; the patch reaching the worker only through the class; a changed ROLL signature
left unpatched with one warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rl_otel._internal.tracing.steps import step_ids

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

pytest.importorskip("cloudpickle")
pytest.importorskip("opentelemetry.sdk.trace")

REPO = Path(__file__).resolve().parents[1]

CONTEXT_MANAGERS = '''
from contextlib import contextmanager
from time import perf_counter


@contextmanager
def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True, load_kwargs={}):
    t0 = perf_counter()
    strategy.load_states(**load_kwargs)
    metrics[f"memory/{metric_infix}/start/onload/allocated/0"] = 1.5
    t1 = perf_counter()
    yield
    t2 = perf_counter()
    metrics[f"memory/{metric_infix}/end/onload/allocated/0"] = 2.5
    if is_offload_states:
        strategy.offload_states()
    metrics[f"time/{metric_infix}/total"] = perf_counter() - t0
    metrics[f"time/{metric_infix}/onload"] = t1 - t0
    metrics[f"time/{metric_infix}/execute"] = t2 - t1
'''

# a ROLL whose function changed: the contract refuses it
CHANGED_CONTEXT_MANAGERS = '''
from contextlib import contextmanager


@contextmanager
def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True):
    yield
'''

BASE_WORKER = '''
from opentelemetry import trace

from roll.utils.context_managers import state_offload_manger


def current():
    span = trace.get_current_span()
    return getattr(span, "name", None)


class Strategy:
    def __init__(self):
        self.calls = []

    def load_states(self, **kwargs):
        self.calls.append(("load_states", current(), kwargs))

    def offload_states(self, **kwargs):
        self.calls.append(("offload_states", current(), kwargs))


class Worker:
    def __init__(self, worker_config):
        self.worker_config = worker_config
        self.cluster_name = worker_config["cluster"]
        self.strategy = Strategy()


class ActorWorker(Worker):
    """ROLL's workers call it by the name they imported."""

    def train_step(self, fail=False):
        metrics = {}
        with state_offload_manger(strategy=self.strategy, metrics=metrics,
                                  metric_infix=f"{self.cluster_name}/train_step",
                                  load_kwargs={"include": ["model_params"]}) as entered:
            inside = current()
            with trace.get_tracer("user").start_as_current_span("user_span"):
                pass
            if fail:
                raise ValueError("the step failed")
        return {"metrics": metrics, "entered": entered, "inside": inside, "calls": self.strategy.calls}
'''

IMPORT_UTILS = '''
import importlib


def safe_import_class(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
'''

CLUSTER = '''
import cloudpickle

from roll.utils.import_utils import safe_import_class


class Cluster:
    """Takes the worker class or its dotted name; ships it to worker processes by cloudpickle, as Ray does."""

    def __init__(self, name, worker_cls, resource_manager, worker_config):
        self.cluster_name = name
        if isinstance(worker_cls, str):
            worker_cls = safe_import_class(worker_cls)
        self.payload = cloudpickle.dumps(worker_cls)
        self.worker_config = worker_config
'''

# the worker process: ROLL's init_telemetry (a global SDK provider), the actor built from the shipped class, a
# method run inside ROLL's decorator spans
WORKER_MAIN = '''
import json, pickle, sys, warnings
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

request = pickle.loads(sys.stdin.buffer.read())
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
if request.get("global_provider", True):
    trace.set_tracer_provider(provider)
worker_cls = pickle.loads(request["payload"])
import roll.pipeline.base_worker as base_worker
patched_before = hasattr(base_worker.state_offload_manger, "__rl_otel_original__")
worker = worker_cls(request["worker_config"])
patched_after = hasattr(base_worker.state_offload_manger, "__rl_otel_original__")
tracer = trace.get_tracer("roll")
error = None
with tracer.start_as_current_span("worker.train_step"), tracer.start_as_current_span("exec"):
    try:
        result = worker.train_step(fail=request["fail"])
    except ValueError as exc:
        error = {"type": type(exc).__name__, "message": str(exc), "same": exc is getattr(worker, "raised", exc)}
        result = None
spans = [{"name": s.name, "id": s.context.span_id, "parent": s.parent.span_id if s.parent else None,
          "attributes": dict(s.attributes), "status": s.status.status_code.name,
          "events": [e.name for e in s.events]} for s in exporter.get_finished_spans()]
print(json.dumps({"patched_before": patched_before, "patched_after": patched_after, "result": result,
                  "error": error, "spans": spans, "class_name": type(worker).__name__,
                  "is_actor_worker": isinstance(worker, base_worker.ActorWorker)}))
'''

DRIVER = '''
import json, pickle, subprocess, sys
install = {install!r}
if install:
    from rl_otel.integrations import roll_phases
    print(json.dumps({{"installed": roll_phases.install()}}), file=sys.stderr)
from roll.distributed.executor.cluster import Cluster
cluster = Cluster("actor_train", "roll.pipeline.base_worker.ActorWorker", None, {{"cluster": "actor_train"}})
request = pickle.dumps({{"payload": cluster.payload, "worker_config": cluster.worker_config, "fail": {fail!r}}})
env = dict(__import__("os").environ, RANK="3", WORLD_SIZE="4", CLUSTER_NAME="actor_train")
out = subprocess.run([sys.executable, {worker_main!r}], input=request, capture_output=True, env=env, timeout=120)
sys.stderr.write(out.stderr.decode())
print(out.stdout.decode())
'''


# A driver whose tracker configures tracing (tracker_kwargs: {tracing: {exporter: jsonl, path: ...}}) and nothing
# else: a user phase (tel.phase), a ROLL phase run in the driver, and a Cluster whose worker runs a ROLL phase in
# another process and directory, with no global TracerProvider anywhere (the setup).
TRACED_DRIVER = '''
import json, os, pickle, subprocess, sys
import roll.utils.context_managers as cm
from roll.pipeline.base_worker import Strategy
from roll.utils.tracking import tracker_registry
from rl_otel.integrations.roll import register
register()
tracker = tracker_registry["rl_otel"]({{"exp_name": "roll-traced"}}, prometheus={{"host": "127.0.0.1", "port": 0}},
                                      tracing={{"exporter": "jsonl", "path": "spans.jsonl"}})
with tracker.telemetry.phase("actor_train", "compute_log_probs", step=1):
    pass
with cm.state_offload_manger(Strategy(), {{}}, "reference/compute_log_probs"):
    pass
from roll.distributed.executor.cluster import Cluster
cluster = Cluster("actor_train", "roll.pipeline.base_worker.ActorWorker", None, {{"cluster": "actor_train"}})
request = pickle.dumps({{"payload": cluster.payload, "worker_config": cluster.worker_config, "fail": False,
                        "global_provider": False}})
env = dict(os.environ, RANK="3", WORLD_SIZE="4", CLUSTER_NAME="actor_train")
out = subprocess.run([sys.executable, {worker_main!r}], input=request, capture_output=True, env=env, timeout=120,
                     cwd={worker_cwd!r})
sys.stderr.write(out.stderr.decode())
tracker.finish()
print(out.stdout.decode())
'''


def stand_in_roll(root: Path, context_managers: str = CONTEXT_MANAGERS) -> Path:
    files = {"roll/__init__.py": "", "roll/utils/__init__.py": "", "roll/pipeline/__init__.py": "",
             "roll/distributed/__init__.py": "", "roll/distributed/executor/__init__.py": "",
             "roll/utils/context_managers.py": context_managers, "roll/utils/import_utils.py": IMPORT_UTILS,
             "roll/pipeline/base_worker.py": BASE_WORKER, "roll/distributed/executor/cluster.py": CLUSTER,
             "roll/utils/tracking.py": "tracker_registry = {}\n", "worker_main.py": WORKER_MAIN}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run_driver(root: Path, *, install: bool, fail: bool = False) -> tuple[dict, str]:
    code = DRIVER.format(install=install, fail=fail, worker_main=str(root / "worker_main.py"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, proc.stderr
    return json.loads(lines[-1]), proc.stderr


def by_name(spans: list[dict]) -> dict[str, dict]:
    return {s["name"]: s for s in spans}


def deterministic(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def roll_root(tmp_path_factory) -> Path:
    return stand_in_roll(tmp_path_factory.mktemp("roll"))


def test_roll_phase_spans_in_the_worker_process(roll_root):
    baseline, _ = run_driver(roll_root, install=False)
    patched, stderr = run_driver(roll_root, install=True)
    assert '"installed": true' in stderr
    # the patch reached the worker through the class alone, before the worker's own __init__ ran
    assert baseline["patched_after"] is False
    assert patched["patched_before"] is False and patched["patched_after"] is True
    assert patched["class_name"] == "ActorWorker" and patched["is_actor_worker"]
    # ROLL's behaviour kept: the same keys and values written into metrics, the same value of the with
    keys = set(baseline["result"]["metrics"])
    assert set(patched["result"]["metrics"]) == keys == {
        "memory/actor_train/train_step/start/onload/allocated/0",
        "memory/actor_train/train_step/end/onload/allocated/0",
        "time/actor_train/train_step/total", "time/actor_train/train_step/onload",
        "time/actor_train/train_step/execute"}
    assert deterministic(patched["result"]["metrics"]) == deterministic(baseline["result"]["metrics"])
    assert patched["result"]["entered"] is None and baseline["result"]["entered"] is None
    # the spans: worker.train_step > exec > actor_train/train_step > onload | execute (> user_span) | offload
    assert {s["name"] for s in baseline["spans"]} == {"worker.train_step", "exec", "user_span"}
    spans = by_name(patched["spans"])
    assert set(spans) == {"worker.train_step", "exec", "actor_train/train_step", "onload", "execute", "offload",
                          "user_span"}
    root = spans["actor_train/train_step"]
    assert root["parent"] == spans["exec"]["id"]
    for child in ("onload", "execute", "offload"):
        assert spans[child]["parent"] == root["id"], child
        assert spans[child]["attributes"] == root["attributes"]
    assert root["attributes"] == {"cluster": "actor_train", "phase": "train_step", "rank": 3}
    assert spans["user_span"]["parent"] == spans["execute"]["id"]
    assert all(s["status"] == "UNSET" for s in patched["spans"])
    # ROLL's load_states ran inside onload, offload_states inside offload, the body inside execute
    assert patched["result"]["calls"] == [["load_states", "onload", {"include": ["model_params"]}],
                                          ["offload_states", "offload", {}]]
    assert patched["result"]["inside"] == "execute"


def test_an_exception_in_the_phase_propagates_unchanged(roll_root):
    baseline, _ = run_driver(roll_root, install=False, fail=True)
    patched, _ = run_driver(roll_root, install=True, fail=True)
    assert patched["error"] == baseline["error"] == {"type": "ValueError", "message": "the step failed",
                                                     "same": True}
    spans = by_name(patched["spans"])
    # ROLL stops at its yield: no offload; execute and the root end with the error
    assert "offload" not in spans
    assert spans["execute"]["status"] == "ERROR" and spans["actor_train/train_step"]["status"] == "ERROR"
    assert "exception" in spans["actor_train/train_step"]["events"]
    assert spans["onload"]["status"] == "UNSET"


def test_a_changed_roll_is_left_unpatched_with_one_warning(tmp_path):
    root = stand_in_roll(tmp_path, CHANGED_CONTEXT_MANAGERS)
    code = textwrap.dedent('''
        import roll.utils.context_managers as cm, roll.pipeline.base_worker as bw
        from rl_otel.integrations import roll_phases
        original = cm.state_offload_manger
        print(roll_phases.install_here(), roll_phases.install_here(), cm.state_offload_manger is original,
              bw.state_offload_manger is original)
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "True", "True"]
    assert proc.stderr.count("ROLL's phases make no spans") == 1
    assert "load_kwargs" in proc.stderr


def test_install_here_is_idempotent_and_keeps_the_signature(roll_root):
    code = textwrap.dedent('''
        import inspect
        import roll.utils.context_managers as cm, roll.pipeline.base_worker as bw
        from rl_otel.integrations import roll_phases
        original = cm.state_offload_manger
        assert roll_phases.install_here() and roll_phases.install_here()
        wrapped = cm.state_offload_manger
        assert wrapped is not original and bw.state_offload_manger is wrapped
        assert wrapped.__rl_otel_original__ is original
        assert inspect.signature(wrapped) == inspect.signature(original)
        assert wrapped.__name__ == "state_offload_manger"
        from roll.utils.context_managers import state_offload_manger   # a module imported later gets the wrapper
        assert state_offload_manger is wrapped
        roll_phases.uninstall()
        assert cm.state_offload_manger is original and bw.state_offload_manger is original
        print("ok")
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(roll_root), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_registering_the_tracker_turns_roll_phases_into_spans(roll_root):
    """The ROLL integration on (``register()``, ROLL's own registry) is all it takes: no second call."""
    code = textwrap.dedent('''
        import roll.utils.context_managers as cm
        from roll.distributed.executor.cluster import Cluster
        from roll.utils.tracking import tracker_registry
        from rl_otel.integrations.roll import RLOtelTracker, register
        original, init = cm.state_offload_manger, Cluster.__init__
        register()
        assert tracker_registry["rl_otel"] is RLOtelTracker
        assert cm.state_offload_manger.__rl_otel_original__ is original
        assert Cluster.__init__ is not init
        print("ok")
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(roll_root), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_tracing_in_the_tracker_exports_roll_phases_with_the_users_phases(roll_root, tmp_path):
    """A user configures tracing once, in tracker_kwargs: tel.phase()'s spans, a ROLL phase of the driver and a
    ROLL phase of a worker process (another directory, no global TracerProvider) land in the one jsonl file."""
    cwd, worker_cwd = tmp_path / "driver", tmp_path / "worker"
    cwd.mkdir()
    worker_cwd.mkdir()
    code = TRACED_DRIVER.format(worker_main=str(roll_root / "worker_main.py"), worker_cwd=str(worker_cwd))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(roll_root), str(REPO)])}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=240)
    assert proc.returncode == 0, proc.stderr
    worker = json.loads([line for line in proc.stdout.splitlines() if line.strip()][-1])
    assert worker["patched_after"] and not (worker_cwd / "spans.jsonl").exists()  # the path is the driver's
    spans = [json.loads(line) for line in (cwd / "spans.jsonl").read_text().splitlines()]
    roots = {(s["name"], s["resource"]["attributes"]["rl.role"]): s for s in spans if s["parent_id"] is None}
    assert set(roots) == {("reference/compute_log_probs", "trainer"), ("actor_train/train_step", "actor_train")}
    # tel.phase(step=1) is in step 1's trace, under its step span (docs/tracing.md)
    (stepped,) = [s for s in spans if s["name"] == "actor_train/compute_log_probs"]
    assert int(stepped["parent_id"], 16) == step_ids("roll-traced", 1)[1]
    roots[("actor_train/compute_log_probs", "trainer")] = stepped
    worker_root = roots[("actor_train/train_step", "actor_train")]
    assert worker_root["attributes"] == {"cluster": "actor_train", "phase": "train_step", "rank": 3}
    assert worker_root["resource"]["attributes"]["rl.run"] == "roll-traced"
    assert worker_root["resource"]["attributes"]["rl.rank"] == 3
    for root in roots.values():  # each phase's parts are its children, in the same file
        children = {s["name"] for s in spans if s["parent_id"] == root["context"]["span_id"]}
        assert {"onload", "execute"} <= children, (root["name"], children)
    assert worker["result"]["inside"] == "execute"  # current in the worker's block, as with ROLL's own provider
