"""rl_otel inside Ray actors (rl_otel.integrations.ray): a real local Ray cluster, actors of two roles serving on
free ports, registered with the driver's registry and discovered by a real Prometheus through ``http_sd_configs``
- no shared filesystem, no RANK/LOCAL_RANK. An actor that crashes is restarted by Ray (``max_restarts``) and
found again at its new address; one that dies for good stays a target that is down; a closed one disappears."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import ray

import rl_otel
from rl_otel.errors import ConfigurationError
from rl_otel.integrations import ray as rl_ray
from tests.promtools import PrometheusServer

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
RUN = "ray-run"
ROLES = ("actor_train", "actor_infer")
DEADLINE_S = 120.0


def score(role: str, rank: int) -> float:
    return {"actor_train": 0.1, "actor_infer": 0.2}.get(role, 0.5) + rank * 0.01


class Worker:
    """A training worker as the frameworks place them: rank and role given by the launcher, not the environment."""

    def __init__(self, run: str, role: str, rank: int) -> None:
        # a real cluster binds 0.0.0.0 and registers its node's address; scrapes stay on loopback in this test
        self.tel = rl_otel.init(run=run, role=role, rank=rank, handle_sigterm=False,
                                prometheus={"host": "127.0.0.1", "port": 0})
        self.registration = rl_ray.register(self.tel)
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.tel.log({"critic/score/mean": score(role, rank), "custom/restarted": float(restarted)}, step=1)

    def info(self) -> dict[str, object]:
        target = self.registration.target
        return {"pid": os.getpid(), "address": target.address if target else None,
                "registered": self.registration.registered}

    def crash(self) -> None:
        os._exit(1)

    def close(self) -> None:
        self.registration.close()
        self.tel.close()


def wait_until(what: str, check, timeout: float = DEADLINE_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Ray cluster for the module (starting one takes seconds): 2 CPUs, no dashboard. Its own: a cluster another
    program runs on this machine (Ray's current-cluster file, RAY_ADDRESS) is never joined."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    targets = rl_ray.serve_targets(host="127.0.0.1", port=0)
    server = None
    try:
        server = PrometheusServer(tmp_path_factory.mktemp("prom"), scrape_configs=[{
            "job_name": "rl_otel_ray", "honor_labels": True,
            "http_sd_configs": [{"url": targets.url, "refresh_interval": "1s"}]}])
        yield targets, server
    finally:
        if server is not None:
            server.close()
        targets.close()
        ray.shutdown()


def actor(role: str, rank: int, max_restarts: int = 0):
    # num_cpus=0: the workers only serve metrics here; 5 of them fit a 2-CPU cluster
    return ray.remote(num_cpus=0, max_restarts=max_restarts)(Worker).remote(RUN, role, rank)


def ups(server: PrometheusServer) -> dict[tuple[str, str], tuple[str, float]]:
    """``{(role, rank): (instance, up)}`` of the run's targets."""
    return {(r["metric"]["role"], r["metric"]["rank"]): (r["metric"]["instance"], float(r["value"][1]))
            for r in server.query(f'up{{run="{RUN}"}}')}


@pytest.mark.prometheus
def test_actors_are_discovered_with_role_and_rank_and_restarted_ones_found_again(cluster):
    targets, server = cluster
    workers = {(role, rank): actor(role, rank, max_restarts=1) for role in ROLES for rank in (0, 1)}
    try:
        infos = {k: ray.get(w.info.remote(), timeout=DEADLINE_S) for k, w in workers.items()}
        assert all(i["registered"] for i in infos.values())
        # the http_sd endpoint lists each actor once, with its labels
        groups = json.loads(urllib.request.urlopen(targets.url, timeout=10).read())
        assert sorted((g["labels"]["role"], g["labels"]["rank"], g["targets"][0]) for g in groups) == sorted(
            (role, str(rank), infos[role, rank]["address"]) for role, rank in workers)
        assert all(g["labels"]["run"] == RUN and g["labels"]["__metrics_path__"] == "/metrics" for g in groups)
        expected = {(role, str(rank)): 1.0 for role, rank in workers}
        wait_until("4 actors up", lambda: {k: v[1] for k, v in ups(server).items()} == expected)
        # every series of an actor carries its role (the target label) and its rank (its own label)
        by_actor = {(r["metric"]["role"], r["metric"]["rank"]): float(r["value"][1])
                    for r in wait_until("scores", lambda: len(server.query('rl_critic_score{stat="mean"}')) == 4
                                        and server.query('rl_critic_score{stat="mean"}'))}
        assert by_actor == {(role, str(rank)): pytest.approx(score(role, rank)) for role, rank in workers}

        # one actor crashes; Ray restarts it (max_restarts=1) in a new process on a new port, which re-registers
        key = ("actor_infer", 1)
        old = infos[key]
        workers[key].crash.remote()
        new = wait_until("the restarted actor", lambda: _info_if_new(workers[key], old["pid"]))
        assert new["registered"] and new["address"] != old["address"]
        wait_until("the restarted actor scraped at its new address",
                   lambda: ups(server).get(("actor_infer", "1")) == (new["address"], 1.0))
        assert len(ups(server)) == 4  # the old address is no target any more
        restarted = wait_until("its restarted flag", lambda: server.query(f'rl_custom_restarted{{run="{RUN}"}} == 1'))
        assert [(r["metric"]["role"], r["metric"]["rank"]) for r in restarted] == [("actor_infer", "1")]
        # a clean close removes the target
        ray.get(workers["actor_train", 0].close.remote(), timeout=DEADLINE_S)
        assert ("actor_train", "0") not in {(t.labels["role"], t.labels["rank"]) for t in targets.targets()}
        wait_until("the closed actor gone", lambda: ("actor_train", "0") not in ups(server))
    finally:
        for w in workers.values():
            ray.kill(w)


def _info_if_new(worker, old_pid: int) -> dict | None:
    try:
        info = ray.get(worker.info.remote(), timeout=30)
    except ray.exceptions.RayActorError:  # still restarting
        return None
    return info if info["pid"] != old_pid else None


@pytest.mark.prometheus
def test_an_actor_that_dies_for_good_stays_a_target_that_is_down(cluster):
    targets, server = cluster
    worker = actor("critic", 0, max_restarts=0)
    info = ray.get(worker.info.remote(), timeout=DEADLINE_S)
    wait_until("the critic up", lambda: ups(server).get(("critic", "0")) == (info["address"], 1.0))
    worker.crash.remote()
    # no restart: its registration stays, Prometheus scrapes nothing there: up == 0 (RLScrapeTargetDown's condition)
    wait_until("the critic down", lambda: ups(server).get(("critic", "0")) == (info["address"], 0.0))
    assert [t.address for t in targets.targets() if t.labels["role"] == "critic"] == [info["address"]]


def test_register_without_a_registry_warns_and_training_goes_on(cluster, caplog):
    with rl_otel.init(run="lonely", role="actor_train", prometheus={"host": "127.0.0.1", "port": 0}) as tel:
        with caplog.at_level(logging.WARNING, logger="rl_otel"):
            registration = rl_ray.register(tel, name="no_such_registry", timeout_s=0.5)
        assert not registration.registered and registration.target is None
        assert "no Ray actor 'no_such_registry'" in caplog.text
        registration.close()  # a no-op


def test_target_labels_and_bad_arguments(cluster):
    with rl_otel.init(run="r", role="reference", rank=3, prometheus={"host": "0.0.0.0", "port": 0}) as tel:
        target = rl_ray.target_of(tel, {"cluster_name": "a"})
        port = str(tel.metrics_url).rsplit(":", 1)[1].split("/")[0]
        # bound to all interfaces: the address Ray reaches the node at (no request is sent to it here)
        node = rl_ray.node_address()
        assert node == ray.nodes()[0]["NodeManagerAddress"] and target.address == f"{node}:{port}"
        assert target.group() == {"targets": [f"{node}:{port}"], "labels": {
            "run": "r", "role": "reference", "rank": "3", "cluster_name": "a", "__scheme__": "http",
            "__metrics_path__": "/metrics"}}
        assert rl_ray.target_of(tel, advertise_host="node-7").address == f"node-7:{port}"
        with pytest.raises(ConfigurationError, match=r"labels \['rank'\] are set by rl_otel"):
            rl_ray.target_of(tel, {"rank": "9"})
    with rl_otel.init(run="r", prometheus=False) as tel, pytest.raises(ConfigurationError, match="scrape endpoint"):
        rl_ray.register(tel)
    with pytest.raises(ConfigurationError, match="port must be"):
        rl_ray.serve_targets(port=-1)
    with pytest.raises(ConfigurationError, match="'rl_otel_targets' exists already"):
        rl_ray.serve_targets(host="127.0.0.1", port=0)
    with pytest.raises(ConfigurationError, match="cannot listen"):
        rl_ray.serve_targets(host="127.0.0.1", port=int(cluster[0].url.rsplit(":", 1)[1].split("/")[0]),
                             name="second_registry")


def test_a_registry_that_starts_late_warns_and_the_driver_goes_on(cluster, caplog):
    """A busy node starts the registry actor after serve_targets() stopped waiting (here: it waits no time at all):
    the driver is warned, not stopped, and /targets answers once the actor is up (503 before)."""
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        late = rl_ray.serve_targets(host="127.0.0.1", port=0, name="late_registry", start_timeout_s=0)
    try:
        assert "'late_registry' did not start within 0 s" in caplog.text

        def answered():
            try:
                # longer than the endpoint's own wait for the registry's answer (10 s), after which it says 503
                return json.loads(urllib.request.urlopen(late.url, timeout=60).read()) == []
            except urllib.error.HTTPError as exc:
                assert exc.code == 503  # not up yet: Prometheus keeps its last list
                return False

        wait_until("the late registry answering /targets", answered)
    finally:
        late.close()
