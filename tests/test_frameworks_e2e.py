"""Each framework's real key set, replayed into a real Prometheus that evaluates the shipped rules.

For every framework with a fixture (tests/data/frameworks), two runs log every key the framework's code emits: a
healthy run, and a run whose core quantities turn bad half-way (KL runs away, the loss turns NaN, entropy
collapses, the reward falls, the inference engine drifts from the trainer, ...). ROLL, veRL, TRL and Trinity-RFT
log through ``tel.log`` (their integrations' path). OpenRLHF, slime, AReaL, NeMo-RL and SkyRL write TensorBoard
event files with the writer each one uses (torch's ``SummaryWriter``; tensorboardX for AReaL) and prime-rl its
``metrics.jsonl`` lines; ``rl-otel watch --framework <name>`` follows those files and serves them. The rules are
the generated ones with every ``for`` at 0s and short windows (the expressions are the shipped ones). Every alert
on a concept the framework logs fires on the bad run and stays quiet on the healthy one, and every dashboard
panel reading a family the framework's keys produce returns data.

Alerts that compare a run with its own hours-old median only (the drift and rising-trend alerts, the per-sequence
KL) cannot decide within a replay of seconds: tests/test_alert_corpus.py checks them on hours of series.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import rl_otel
from rl_otel.catalog import SCOPED_FRAMEWORKS, default_catalog
from rl_otel.catalog.concepts import CONCEPTS
from rl_otel.ops import rules
from rl_otel.ops.dashboards import dashboards
from rl_otel.ops.promql import metric_names, substitute
from rl_otel.ops.thresholds import DEFAULT
from tests.frameworks import ALL_FRAMEWORKS, concept_sources, concepts_logged, load, resolve
from tests.promtools import PrometheusServer, samples, scrape

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[1]

# Every alert's `for` at 0s and its windows short, so a replay of a few seconds decides it; expressions unchanged.
FAST = dataclasses.replace(DEFAULT, **{f.name: "0s" for f in dataclasses.fields(DEFAULT) if f.name.endswith("_for")},
                           reward_window="10m", eval_window="10m", eval_smooth="3s", eval_resolution="1s",
                           throughput_window="10m", telemetry_errors_window="10m", entropy_window="10m")
# decided over hours of a run's own history, or on values no framework's healthy or bad run here logs (a fraction
# above 1): tests/test_alert_corpus.py
NOT_REPLAYED = {"RLRefKLDrift", "RLTrainInferenceMismatchRising", "RLPhaseStuck", "RLRankSkew", "RLMetricImpossible"}

# (healthy value, bad value) of each concept, placed against the thresholds (in the concept's terms: a source
# that carries it through a transform, |r - 1| of a ratio, is written its inverse).
VALUES: dict[str, tuple[float, float]] = {
    "reward": (0.5, 0.5 - 2 * FAST.reward_drop),
    "policy_kl": (FAST.approx_kl_floor / 10, FAST.approx_kl_max * 10),
    "ref_kl": (FAST.ref_kl_floor / 10, FAST.ref_kl_max * 10),
    "sequence_ref_kl": (FAST.sequence_floor, FAST.sequence_floor),  # baseline-only: the corpus decides it
    "importance_ratio_max": (1.1, FAST.ratio_max * 5),
    "clip_ratio": (FAST.clip_ratio_max / 10, (1 + FAST.clip_ratio_max) / 2),
    "entropy": (1.0, FAST.entropy_min / 10),
    "sequence_entropy": (50.0, 50.0 * FAST.entropy_ratio_min / 10),
    "explained_variance": (0.6, FAST.explained_variance_min - 0.5),
    "policy_loss": (0.5, math.nan),
    "gpu_memory_peak_ratio": (0.5, (1 + FAST.gpu_peak_ratio_max) / 2),
    "throughput": (1000.0, 1000.0 * FAST.throughput_ratio_min / 5),
    "eval_score": (0.7, 0.7 - 4 * FAST.eval_drop),
    "train_infer_kl": (FAST.mismatch_kl_max / 20, FAST.mismatch_kl_max * 5),
    "train_infer_logprob_diff": (FAST.mismatch_logprob_diff_max / 20, FAST.mismatch_logprob_diff_max * 5),
    "train_infer_ratio_deviation": (FAST.mismatch_ratio_deviation_max / 20, FAST.mismatch_ratio_deviation_max * 5),
    "staleness": (1.0, FAST.staleness_max * 3),
    "mfu": (0.4, 0.4),  # a sane fraction in both runs: the sanity alert's broken runs are the corpus'
}
HEALTHY_STEPS, BAD_STEPS = 6, 8
WRITER = {"openrlhf": "torch", "slime": "torch", "areal": "tensorboardX", "nemo_rl": "torch", "skyrl": "torch",
          "prime_rl": "jsonl"}


def _logged(transform: str, value: float) -> float:
    form = transform.replace(" ", "")
    return 1 + value if form == "abs({}-1)" else -value if form == "-({})" else value


def _values(keys, bad: bool, step: int) -> dict[str, float]:
    counters = {k.key for k in keys if k.kind == "counter"}
    by_key = {key: (c.name, src.transform) for c in CONCEPTS if c.name in VALUES
              for key, src in concept_sources(keys, c).items()}
    out = {}
    for k in keys:
        if k.key in counters:
            out[k.key] = float(10 * (step + 1))
        elif k.key in by_key:
            name, transform = by_key[k.key]
            healthy, broken = VALUES[name]
            out[k.key] = _logged(transform, broken if bad and step >= HEALTHY_STEPS else healthy)
        else:
            out[k.key] = 1.0
    return out


class _Files:
    """One framework's two runs, written as the framework writes them, and the ``rl-otel watch`` serving them."""

    def __init__(self, framework: str, root: Path) -> None:
        self.framework, self.root = framework, root / framework
        self.sd = root / f"{framework}-sd"
        self.writers = {}
        for health in ("good", "bad"):
            run_dir = self.root / f"{framework}-{health}"
            run_dir.mkdir(parents=True)
            kind = WRITER[framework]
            if kind == "torch":
                from torch.utils.tensorboard import SummaryWriter

                self.writers[health] = SummaryWriter(str(run_dir))
            elif kind == "tensorboardX":
                from tensorboardX import SummaryWriter as XWriter

                self.writers[health] = XWriter(str(run_dir))
            else:
                self.writers[health] = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rl_otel.cli", "watch", str(self.root), "--framework", framework, "--host",
             "127.0.0.1", "--port", "0", "--file-sd", str(self.sd), "--no-state", "--interval", "0.2"],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)

    def write(self, health: str, values: dict[str, float], step: int) -> None:
        writer = self.writers[health]
        if WRITER[self.framework] == "jsonl":  # prime-rl's FileMonitor: {"step", "time", **metrics}, NaN dropped
            line = {"step": step, "time": time.time(), **{k: v for k, v in values.items() if not math.isnan(v)}}
            writer.write(json.dumps(line) + "\n")
            writer.flush()
        else:
            for key, value in values.items():
                writer.add_scalar(key, value, step)
            writer.flush()

    def targets(self, timeout: float = 60.0) -> dict[str, str]:
        """``{run: host:port}`` once the watcher's endpoint (published in its file_sd file: one target serves every
        run it follows) serves both runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {}
            for path in self.sd.glob("*.json") if self.sd.exists() else ():
                try:
                    for group in json.loads(path.read_text()):
                        target = group["targets"][0]
                        served = samples(scrape(f"http://{target}/metrics"), "rl_step")
                        found.update({dict(key)["run"]: target for key in served})
                except (OSError, ValueError, KeyError):
                    continue
            if len(found) == 2:
                return found
            if self.proc.poll() is not None:
                raise RuntimeError(f"rl-otel watch exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.2)
        raise TimeoutError(f"rl-otel watch did not serve both {self.framework} runs")

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_served(url: str, step: int, timeout: float = 30.0) -> None:
    """Until the endpoint serves ``step`` for every run it serves (the watcher read the step's values)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served = samples(scrape(url), "rl_step")
        if served and min(served.values()) >= step:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not serve step {step}")


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    rule_paths = []
    for name, doc in rules.rule_files(FAST).items():
        path = tmp / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
        rule_paths.append(path)
    fixtures = {f: load(f) for f in ALL_FRAMEWORKS}
    tels, files, server = {}, {}, None
    try:
        targets = []
        for f in ALL_FRAMEWORKS:
            if f in SCOPED_FRAMEWORKS:
                files[f] = _Files(f, tmp)
                continue
            for health in ("good", "bad"):
                tels[f, health] = rl_otel.init(run=f"{f}-{health}", rank=0, handle_sigterm=False,
                                               prometheus={"host": "127.0.0.1", "port": 0})
                targets.append(tels[f, health].metrics_url.split("//")[1].split("/")[0])
        for step in range(HEALTHY_STEPS + BAD_STEPS):
            for f, watched in files.items():
                for health in ("good", "bad"):
                    watched.write(health, _values(fixtures[f], health == "bad", step), step)
            if step == 0:  # the watchers start each run's endpoint at its first values
                for watched in files.values():
                    targets.extend(set(watched.targets().values()))
                (tmp / "prom").mkdir()
                server = PrometheusServer(tmp / "prom", targets, rule_files=rule_paths)
                server.wait_for_scrapes(1)
            for (f, health), tel in tels.items():
                tel.log(_values(fixtures[f], health == "bad", step), step=step)
            for watched in files.values():
                for target in set(watched.targets().values()):
                    _wait_served(f"http://{target}/metrics", step)
            _wait_next_scrape(server)
        _wait_rules(server)
        yield server, fixtures
    finally:
        if server is not None:
            server.close()
        for tel in tels.values():
            tel.close()
        for watched in files.values():
            watched.close()


def _wait_next_scrape(server: PrometheusServer) -> None:
    """Until every target was scraped once more (so each step's values are seen by Prometheus)."""
    start = {r["metric"]["instance"]: float(r["value"][1])
             for r in server.query("timestamp(up)")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = {r["metric"]["instance"]: float(r["value"][1]) for r in server.query("timestamp(up)")}
        if now and all(now.get(i, 0) > t for i, t in start.items()):
            return
        time.sleep(0.2)
    raise TimeoutError("targets were not scraped again")


def _wait_rules(server: PrometheusServer) -> None:
    """Until the rule groups evaluated twice after the last scrape (alerts with for=0s are then firing)."""
    last_scrape = max(float(r["value"][1]) for r in server.query("timestamp(up)"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        groups = server.api("rules")["groups"]
        evaluated = [g.get("lastEvaluation", "") for g in groups]
        stamps = [_rfc3339(e) for e in evaluated]
        if stamps and all(s > last_scrape + 1.5 for s in stamps):
            return
        time.sleep(0.3)
    raise TimeoutError("rules were not evaluated after the last scrape")


def _rfc3339(text: str) -> float:
    from datetime import datetime

    m = re.fullmatch(r"(.*?)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        return 0.0
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float(m.group(2) or 0)


def _decidable(alert: rules.Alert, logged: dict[str, list[str]], framework: str) -> bool:
    """Whether a replay of seconds decides ``alert`` for ``framework`` logging ``logged``: it reads a concept the
    framework logs with a value that breaks it (not a baseline-only per-sequence KL, not a sane MFU). prime-rl's
    FileMonitor drops NaN and Inf from metrics.jsonl, so a NaN loss never reaches its file (docs/watch.md)."""
    if alert.name in NOT_REPLAYED:
        return False
    breaking = {name for name, (good, bad) in VALUES.items()
                if good != bad and not (WRITER.get(framework) == "jsonl" and math.isnan(bad))}
    return bool(set(alert.concepts) & set(logged) & breaking)


@pytest.mark.parametrize("framework", ALL_FRAMEWORKS)
def test_every_alert_on_a_logged_concept_fires_on_the_bad_run_only(replay, framework):
    server, fixtures = replay
    logged = concepts_logged(fixtures[framework])
    firing = {(r["metric"]["alertname"], r["metric"].get("run")) for r in server.query('ALERTS{alertstate="firing"}')}
    checked = []
    for alert in rules.alerts(FAST):
        if not alert.concepts:
            continue
        if _decidable(alert, logged, framework):
            checked.append(alert.name)
            assert (alert.name, f"{framework}-bad") in firing, (alert.name, {c: logged.get(c) for c in alert.concepts})
        assert (alert.name, f"{framework}-good") not in firing, alert.name
    assert len(checked) >= 5, checked
    print(f"\n{framework}: {len(checked)} alerts fire on the bad run only: {checked}")


@pytest.mark.parametrize("framework", ALL_FRAMEWORKS)
def test_every_panel_on_a_logged_family_returns_data(replay, framework):
    server, fixtures = replay
    families = {res.spec.prometheus_name for res in resolve(fixtures[framework]).values() if res.known}
    logged = set(concepts_logged(fixtures[framework]))
    values = {"job": "rl_otel", "run": f"{framework}-good", "cluster": ".*", "phase": ".*", "device_id": ".*",
              "datasource": "prometheus"}
    checked, empty = 0, []
    for board in dashboards(FAST):
        for panel in board.panels:
            read = {n for q in panel.queries for n in metric_names(q.expr)}
            reads_family = {n for n in read if n in families or n.rsplit("_", 1)[0] in families}
            if panel.concept is not None:
                if panel.concept not in logged:
                    continue
            elif not reads_family:
                continue
            checked += 1
            if not any(server.query(substitute(q.expr, values)) for q in panel.queries):
                empty.append((board.uid, panel.title))
    assert checked > 0 and empty == []


@pytest.mark.parametrize("framework", SCOPED_FRAMEWORKS)
def test_watched_values_are_served_as_written(replay, framework):
    """Through the framework's own writer and ``rl-otel watch``: every catalogued key of the last step is served
    in its framework's family (float32 precision for event files), under the run the directory names."""
    server, fixtures = replay
    catalog = default_catalog(framework)
    last = _values(fixtures[framework], False, HEALTHY_STEPS + BAD_STEPS - 1)
    checked = 0
    for key, value in last.items():
        res = catalog.resolve(key)
        if not res.known or math.isnan(value) or res.spec.kind.value != "gauge":
            continue
        matchers = ", ".join([f'run="{framework}-good"', *(f'{k}="{v}"' for k, v in res.labels)])
        query = f"{res.spec.prometheus_name}{{{matchers}}}"
        result = server.query(query)
        assert result, query
        assert float(result[0]["value"][1]) == pytest.approx(value * res.spec.scale, rel=1e-6), query
        checked += 1
    assert checked >= 10, checked
