"""Many nodes on loopback: 2 "nodes" x 4 rank processes, one Prometheus agent per node (prometheus/agent.yml)
remote-writing to two central stores at once - a central Prometheus (prometheus/central.yml, remote-write
receiver) and VictoriaMetrics with vmalert - both evaluating the shipped rules. Checked on each store: the run's
``run:*`` aggregates equal what the 8 ranks logged, an alert caused by one node's rank fires centrally and reaches
an Alertmanager-compatible receiver, and killing one node's agent fires RLNodeSilent for that node only.
Also: the deploy/multinode compose files carry the flags this test runs the binaries with, and RLNodeSilent's
promtool unit cases."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_otel.ops import promtests, rules
from rl_otel.ops.generate import dump_yaml
from rl_otel.ops.thresholds import DEFAULT
from tests._child import Child
from tests.promtools import free_port, require_binary

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
NODES = {"node-a": (0, 1, 2, 3), "node-b": (4, 5, 6, 7)}
WORLD = 8
RUN = "multinode"
STEP = 10
# every `for` 0s (as tests/test_frameworks_e2e.py), the node silence window short: the test waits seconds, not minutes
_ZERO_FOR: dict[str, Any] = {f.name: "0s" for f in dataclasses.fields(DEFAULT) if f.name.endswith("_for")}
FAST = dataclasses.replace(DEFAULT, **_ZERO_FOR)
SILENT_WINDOW, SILENT_LOOKBACK = "10s", "10m"
DEADLINE_S = 90.0  # every wait ends on its condition; this bounds it on a loaded 2-core machine

# the binaries' flags this test relies on; deploy/multinode/ must carry them (test_deploy_files_carry_the_flags)
AGENT_FLAGS = ("--enable-feature=agent,expand-external-labels",)
CENTRAL_FLAGS = ("--web.enable-remote-write-receiver",)
VMALERT_FLAGS = ("-datasource.url", "-remoteWrite.url", "-remoteRead.url", "-notifier.url")

RANK_SCRIPT = """
import json, sys
import rl_otel
run, rank, sd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tel = rl_otel.init(run=run, rank=rank, handle_sigterm=False,
                   prometheus={"host": "127.0.0.1", "port": 0, "file_sd": sd})
say(url=tel.metrics_url)
while True:
    line = wait()
    if line in ("", "exit"):
        break
    message = json.loads(line)
    tel.log(message["metrics"], step=message["step"])
    say(logged=message["step"])
tel.close()
"""


def logged(rank: int) -> dict[str, float]:
    """What rank ``rank`` logs at STEP; the central aggregates are checked against these."""
    return {"critic/score/mean": 0.1 * (rank + 1), "actor/approxkl": 0.001 * (rank + 1),
            "system/tps": 100.0 * (rank + 1)}


def wait_until(what: str, check: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    """``check()``'s first truthy result; fails naming ``what`` (and the last result) after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # a store still starting
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


class AlertReceiver:
    """An Alertmanager stand-in: records every alert POSTed to ``/api/v2/alerts`` (what Prometheus and vmalert
    send to their notifiers)."""

    def __init__(self) -> None:
        self.alerts: list[dict] = []
        received = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/api/v2/alerts":
                    received.extend(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def received(self, alertname: str) -> list[dict[str, str]]:
        return [a["labels"] for a in list(self.alerts) if a["labels"].get("alertname") == alertname]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Process:
    """A server binary on loopback, logging to a file; ``ready`` is a URL that answers 200 once it serves."""

    def __init__(self, tmp: Path, name: str, args: list[str], ready: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - the server's log, closed by kill()/stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=tmp,
                                     env={**os.environ, **(env or {})})
        wait_until(f"{name} to serve", lambda: self._ready(ready), timeout=60)

    def _ready(self, url: str) -> bool:
        if self.proc.poll() is not None:
            log = self.log_path.read_text()[-3000:]
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{log}")
        return urllib.request.urlopen(url, timeout=2).status == 200

    def kill(self) -> None:
        """SIGKILL: a node lost, not a clean shutdown."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self._log.close()


class CentralPrometheus:
    """prometheus/central.yml with the remote-write receiver on; its rules and Alertmanager replaced by the test's."""

    name = "prometheus"

    def __init__(self, tmp: Path, rule_paths: list[Path], receiver: AlertReceiver) -> None:
        config = yaml.safe_load((ROOT / "prometheus/central.yml").read_text())
        port = free_port()
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [str(p) for p in rule_paths]
        config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [receiver.url.split("//")[1]]
        config["scrape_configs"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
        (tmp / "central.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{port}"
        self.write_url = f"{self.url}/api/v1/write"
        self.receiver = receiver
        self.process = Process(tmp, "central-prometheus", [
            require_binary("prometheus"), f"--config.file={tmp / 'central.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *CENTRAL_FLAGS], f"{self.url}/-/ready")

    def query(self, promql: str) -> list[dict]:
        body = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def firing(self, alertname: str) -> list[dict[str, str]]:
        """Labels of the firing instances of ``alertname``, as the store's alerts API lists them."""
        alerts = _get(f"{self.url}/api/v1/alerts")["data"]["alerts"]
        return [a["labels"] for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]

    def close(self) -> None:
        self.process.stop()


class CentralVictoriaMetrics(CentralPrometheus):
    """VictoriaMetrics single-node (the Debian package) receiving remote write, and vmalert evaluating the same rule
    files against it, writing recorded series and alert state back into it."""

    name = "victoriametrics"

    def __init__(self, tmp: Path, rule_paths: list[Path], receiver: AlertReceiver) -> None:
        vm_port, alert_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{vm_port}"
        self.write_url = f"{self.url}/api/v1/write"
        self.receiver = receiver
        self.alerts_url = f"http://127.0.0.1:{alert_port}"
        # latencyOffset: VictoriaMetrics hides the newest 30 s by default (samples still arriving); 1 s here
        self.process = Process(tmp, "victoriametrics", [
            require_binary("victoria-metrics"), f"-storageDataPath={tmp / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{vm_port}", "-search.latencyOffset=1s", "-search.disableCache",
            "-loggerLevel=ERROR"], f"{self.url}/health")
        self.vmalert = Process(tmp, "vmalert", [
            require_binary("vmalert"), *[f"-rule={p}" for p in rule_paths], f"-datasource.url={self.url}",
            f"-remoteWrite.url={self.url}", f"-remoteRead.url={self.url}", f"-notifier.url={receiver.url}",
            "-evaluationInterval=1s", "-remoteWrite.flushInterval=1s", f"-httpListenAddr=127.0.0.1:{alert_port}",
            "-loggerLevel=ERROR"], f"{self.alerts_url}/health")

    def firing(self, alertname: str) -> list[dict[str, str]]:
        alerts = _get(f"{self.alerts_url}/api/v1/alerts")["data"]["alerts"] or []
        return [{**a["labels"], "alertname": a["name"]} for a in alerts
                if a["name"] == alertname and a["state"] == "firing"]

    def close(self) -> None:
        self.vmalert.stop()
        self.process.stop()


def agent(tmp: Path, node: str, targets_dir: Path, write_urls: list[str]) -> Process:
    """prometheus/agent.yml for ``node``: its file_sd directory, scrape and send every second, writing to every
    central store (each remote_write entry a copy of the shipped one)."""
    config = yaml.safe_load((ROOT / "prometheus/agent.yml").read_text())
    port = free_port()
    config["global"].update(scrape_interval="1s", scrape_timeout="1s")
    job = config["scrape_configs"][0]
    job["file_sd_configs"][0].update(files=[str(targets_dir / "*.json")], refresh_interval="1s")
    shipped = config["remote_write"][0]
    config["remote_write"] = [{**shipped, "url": url, "queue_config": {**shipped["queue_config"],
                                                                      "batch_send_deadline": "1s",
                                                                      "max_backoff": "1s"}}
                              for url in write_urls]
    path = tmp / f"agent-{node}.yml"
    path.write_text(yaml.safe_dump(config))
    return Process(tmp, f"agent-{node}", [
        require_binary("prometheus"), *AGENT_FLAGS, f"--config.file={path}",
        f"--storage.agent.path={tmp / f'wal-{node}'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        f"http://127.0.0.1:{port}/-/ready", env={"NODE_NAME": node})


def rule_files(tmp: Path) -> list[Path]:
    """The shipped rules, rendered with FAST thresholds and the short node silence window."""
    paths = []
    for name, doc in rules.rule_files(FAST).items():
        groups: list[dict[str, Any]] = doc["groups"]  # type: ignore[assignment]
        for group in groups:
            if group["name"] == "rl_otel_fleet":
                group["rules"] = [a.to_dict() for a in rules.fleet_alerts(FAST, SILENT_WINDOW, SILENT_LOOKBACK)]
        path = tmp / name
        path.write_text(dump_yaml(doc))
        paths.append(path)
    return paths


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ranks: dict[int, Child] = {}
        self.agents: dict[str, Process] = {}
        self.stores: dict[str, CentralPrometheus] = {}
        self.receivers: list[AlertReceiver] = []
        self._done: set[str] = set()

    def start(self) -> None:
        tmp = self.tmp
        rule_paths = rule_files(tmp)
        for kind in (CentralPrometheus, CentralVictoriaMetrics):
            receiver = AlertReceiver()
            self.receivers.append(receiver)
            (tmp / kind.name).mkdir()
            self.stores[kind.name] = kind(tmp / kind.name, rule_paths, receiver)
        for node, ranks in NODES.items():
            targets = tmp / node / "targets"
            for rank in ranks:
                (tmp / node / f"rank{rank}").mkdir(parents=True)
                self.ranks[rank] = Child(RANK_SCRIPT, [RUN, str(rank), str(targets)], tmp / node / f"rank{rank}")
        for rank, child in self.ranks.items():
            child.expect()  # serving, and published in its node's targets directory
            self.log(rank, logged(rank), STEP)
        for node in NODES:
            self.agents[node] = agent(tmp, node, tmp / node / "targets", [s.write_url for s in self.stores.values()])

    def log(self, rank: int, metrics: dict[str, float], step: int) -> None:
        child = self.ranks[rank]
        child.send(json.dumps({"metrics": metrics, "step": step}))
        assert child.expect() == {"logged": step}

    def once(self, what: str) -> bool:
        """True the first time ``what`` is asked: the tests share one fleet and each event happens once."""
        first = what not in self._done
        self._done.add(what)
        return first

    def close(self) -> None:
        for a in self.agents.values():
            a.stop()
        for child in self.ranks.values():
            if child.proc.poll() is None:
                child.finish()
        for store in self.stores.values():
            store.close()
        for receiver in self.receivers:
            receiver.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("multinode"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


STORES = ["prometheus", "victoriametrics"]


def _counted(store: CentralPrometheus) -> bool:
    return _one(store, "run:rl_step:count") == WORLD


def _one(store: CentralPrometheus, promql: str) -> float | None:
    result = store.query(promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


@pytest.mark.prometheus
@pytest.mark.parametrize("kind", STORES)
def test_central_run_aggregates_equal_what_the_eight_ranks_logged(fleet, kind):
    store = fleet.stores[kind]
    wait_until(f"{kind}: run:rl_step:count == {WORLD}", lambda: _one(store, "run:rl_step:count") == WORLD)
    scores = [logged(r)["critic/score/mean"] for r in range(WORLD)]
    kls = [logged(r)["actor/approxkl"] for r in range(WORLD)]
    tps = [logged(r)["system/tps"] for r in range(WORLD)]
    # the rules are evaluated every second on what has arrived: wait for one that saw all 8 ranks' values
    wait_until(f"{kind}: run:rl_tokens_per_second:sum", lambda: _one(store, "run:rl_tokens_per_second:sum") == sum(tps))
    recorded = {r["metric"]["__name__"]: r for r in store.query(f'{{__name__=~"run:.+", run="{RUN}"}}')}
    assert all("rank" not in r["metric"] and "node" not in r["metric"] for r in recorded.values())
    assert _one(store, "run:rl_step:max") == STEP
    assert _one(store, "run:rl_reward:avg") == pytest.approx(sum(scores) / WORLD)
    assert _one(store, "run:rl_policy_kl:max") == pytest.approx(max(kls))
    assert _one(store, "run:rl_tokens_per_second:sum") == pytest.approx(sum(tps))
    # each series arrived through its own node's agent, with its own run/rank
    by_rank = {(r["metric"]["node"], r["metric"]["rank"]): float(r["value"][1])
               for r in store.query('rl_critic_score{stat="mean"}')}
    assert by_rank == {(node, str(rank)): pytest.approx(logged(rank)["critic/score/mean"])
                       for node, ranks in NODES.items() for rank in ranks}
    ups = {(r["metric"]["node"], r["metric"]["rank"]) for r in store.query('up{job="rl_otel"} == 1')}
    assert ups == {(node, str(rank)) for node, ranks in NODES.items() for rank in ranks}


@pytest.mark.prometheus
@pytest.mark.parametrize("kind", STORES)
def test_an_alert_on_one_nodes_rank_fires_centrally(fleet, kind):
    store = fleet.stores[kind]
    kl = FAST.approx_kl_max * 10
    if fleet.once("bad kl"):  # rank 6 (node-b) reports a runaway KL; rank 2 (node-a) dies
        for name, each in fleet.stores.items():
            wait_until(f"{name}: all 8 ranks", partial(_counted, each))
            assert not each.firing("RLKLRunaway") and not each.firing("RLScrapeTargetDown")
        fleet.log(6, {"actor/approxkl": kl}, STEP + 1)
        fleet.ranks[2].kill()
    firing = wait_until(f"{kind}: RLKLRunaway", lambda: store.firing("RLKLRunaway"))
    assert [(a["run"], a["severity"]) for a in firing] == [(RUN, "warning")]
    # the run-level alert is traced to its node and rank by the raw series the central store holds
    over = store.query(f"rl_actor_approx_kl > {FAST.approx_kl_max}")
    assert [(r["metric"]["node"], r["metric"]["rank"], float(r["value"][1])) for r in over] == [("node-b", "6", kl)]
    down = wait_until(f"{kind}: RLScrapeTargetDown", lambda: store.firing("RLScrapeTargetDown"))
    assert [(a["node"], a["rank"], a["run"]) for a in down] == [("node-a", "2", RUN)]
    # and both reached the Alertmanager-compatible receiver of this store
    wait_until(f"{kind}: alerts delivered", lambda: store.receiver.received("RLKLRunaway")
               and store.receiver.received("RLScrapeTargetDown"))
    assert {a["rank"] for a in store.receiver.received("RLScrapeTargetDown")} == {"2"}


@pytest.mark.prometheus
@pytest.mark.parametrize("kind", STORES)
def test_killing_one_nodes_agent_fires_node_silent_for_that_node(fleet, kind):
    store = fleet.stores[kind]
    if fleet.once("kill agent"):
        for name, each in fleet.stores.items():
            wait_until(f"{name}: node-a reporting", partial(each.query, 'count_over_time(up{node="node-a"}[5s])'))
            assert not each.firing("RLNodeSilent")
        fleet.agents["node-a"].kill()
    firing = wait_until(f"{kind}: RLNodeSilent", lambda: store.firing("RLNodeSilent"))
    assert [(a["node"], a["run"], a["severity"]) for a in firing] == [("node-a", RUN, "critical")]
    # node-a's living ranks are not reported down: the central store cannot know, only that the node is silent
    down = {a["rank"] for a in store.firing("RLScrapeTargetDown")}
    assert down <= {"2"}
    wait_until(f"{kind}: RLNodeSilent delivered", lambda: store.receiver.received("RLNodeSilent"))
    assert {a["node"] for a in store.receiver.received("RLNodeSilent")} == {"node-a"}


def test_deploy_files_carry_the_flags_this_test_runs():
    node = yaml.safe_load((ROOT / "deploy/multinode/docker-compose.node.yml").read_text())
    central = yaml.safe_load((ROOT / "deploy/multinode/docker-compose.central.yml").read_text())
    agent_cmd = node["services"]["agent"]["command"]
    assert set(AGENT_FLAGS) <= set(agent_cmd) and "--config.file=/etc/prometheus/agent.yml" in agent_cmd
    assert node["services"]["agent"]["environment"]["NODE_NAME"].startswith("${NODE_NAME")
    services = central["services"]
    assert set(CENTRAL_FLAGS) <= set(services["central"]["command"])
    assert "--config.file=/etc/prometheus/central.yml" in services["central"]["command"]
    vmalert_flags = {arg.split("=", 1)[0] for arg in services["vmalert"]["command"]}
    assert set(VMALERT_FLAGS) <= vmalert_flags and "-rule=/etc/rules/*.yml" in services["vmalert"]["command"]
    for svc in services.values():
        for volume in svc.get("volumes", []):
            host = volume.split(":")[0]
            assert (ROOT / "deploy/multinode" / host).resolve().exists(), volume
    for volume in node["services"]["agent"]["volumes"]:
        host = volume.split(":")[0]
        assert host.startswith("/var/run/") or (ROOT / "deploy/multinode" / host).resolve().exists(), volume
    # the agent's and the central's configs are what promtool accepts
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "config", "--agent", str(ROOT / "prometheus/agent.yml")],
                          capture_output=True, text=True, env={**os.environ, "NODE_NAME": "n"}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([promtool, "check", "config", str(ROOT / "prometheus/central.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    agent_config = yaml.safe_load((ROOT / "prometheus/agent.yml").read_text())
    assert agent_config["global"]["external_labels"] == {rules.NODE_LABEL: "${NODE_NAME}"}
    assert "rule_files" not in agent_config and agent_config["remote_write"]


def _series(node: str, rank: int, run: str = "r") -> str:
    return f'up{{job="rl_otel", instance="{node}:{9464 + rank}", node="{node}", run="{run}", rank="{rank}"}}'


def test_node_silent_promtool_cases(tmp_path):
    """RLNodeSilent as shipped (default windows): fires for the node whose samples stopped while its run goes on
    elsewhere; quiet for a node whose rank is merely down (up == 0 still arrives), and for a run that ended on
    every node."""
    [alert] = rules.fleet_alerts()
    (tmp_path / "rules.yml").write_text(dump_yaml({"groups": [{"name": "fleet", "rules": [alert.to_dict()]}]}))
    series = {
        _series("a", 0): "1x10",                      # node a: its agent dies at minute 10
        _series("a", 1): "1x10",
        _series("b", 2): "1x40",                      # node b goes on
        _series("c", 3): "1x5 0x35",                  # node c: its rank is down, its agent alive
        _series("d", 4, "ended"): "1x10",             # run `ended` stops on its only node: not a silent node
    }
    labels = {"severity": "critical", "job": "rl_otel", "run": "r", "node": "a"}
    annotations = {"summary": promtests.render(alert.summary, labels, 2),
                   "description": promtests.render(alert.description, labels, 2),
                   "runbook_url": rules.RunbookLinks().url(
                       next(a for a in rules.fleet_alerts() if a.name == "RLNodeSilent"))}
    # node a's last samples at minute 10: silent past the 2m window from minute 12 on, firing 3m (for) later;
    # from minute 41 on, no node of run r reports: the run ended, no node is "silent"
    assert (rules.NODE_SILENT_WINDOW, alert.for_) == ("2m", "3m")
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "RLNodeSilent", "exp_alerts": []},
            {"eval_time": "14m", "alertname": "RLNodeSilent", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "RLNodeSilent",
             "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]},
            {"eval_time": "45m", "alertname": "RLNodeSilent", "exp_alerts": []},
        ]}]}
    (tmp_path / "test.yml").write_text(dump_yaml(test))
    proc = subprocess.run([require_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
