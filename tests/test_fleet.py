"""Many ranks on one host: port policy (base + LOCAL_RANK, search on conflict), file_sd targets files, and an
end-to-end run of 8 rank processes discovered and aggregated by a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rl_otel
from rl_otel import ConfigurationError, PortInUseError
from tests._waits import CHILD_ENV, read_line
from tests.promtools import PrometheusServer, samples, scrape
from tests.rank_worker import expected

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
# Recording rules, when the project has them, are loaded into the e2e Prometheus: it refuses to start on a bad one.
RULE_FILES = sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
WORLD = 8


def free_port_range(n: int) -> int:
    """A base port with ``n`` free ports after it (retried: another process may take one meanwhile)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port range")


def port_of(tel: rl_otel.Telemetry) -> int:
    return int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])


def test_port_base_plus_local_rank(monkeypatch):
    base = free_port_range(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with rl_otel.init(run="r", rank=11, prometheus={"host": "127.0.0.1", "port": base, "add_local_rank": True}) as t:
        assert port_of(t) == base + 3
        assert samples(scrape(t.metrics_url), "rl_otel_build_info")


def test_port_in_use_searches_the_next_ports_when_asked():
    base = free_port_range(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base))
        taken.listen()
        with pytest.raises(PortInUseError, match=f"port {base} is already in use"):
            rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": base})
        with rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": base, "port_search": 2}) as t:
            assert port_of(t) == base + 1
            with rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": base, "port_search": 2}) as t2:
                assert port_of(t2) == base + 2
                with pytest.raises(PortInUseError, match=f"ports {base}..{base + 2} are all already in use"):
                    rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": base, "port_search": 2})


@pytest.mark.parametrize(("env", "prometheus", "match"), [
    ({"LOCAL_RANK": "one"}, {"port": 9000, "add_local_rank": True}, "LOCAL_RANK environment variable .* 'one'"),
    ({"LOCAL_RANK": "-1"}, {"port": 9000, "add_local_rank": True}, "LOCAL_RANK environment variable .* '-1'"),
    ({}, {"port": 0, "add_local_rank": True}, "needs a base port"),
    ({}, {"port": 9000, "add_local_rank": "yes"}, "add_local_rank must be True or False"),
    ({}, {"port": 9000, "port_search": -1}, "port_search must be"),
    ({}, {"port": 65530, "port_search": 10}, "port_search must be"),
    ({}, {"file_sd": 3}, "file_sd must be"),
    ({}, {"advertise_host": ""}, "advertise_host must be"),
    ({}, {"web_config_file": "/nonexistent/web.yml"}, "cannot be read"),
    ({}, {"ports": 1}, "unknown prometheus option"),
])
def test_bad_port_policy_is_a_configuration_error(monkeypatch, env, prometheus, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigurationError, match=match):
        rl_otel.init(run="r", prometheus={"host": "127.0.0.1", **prometheus})


def test_file_sd_target_is_written_atomically_and_removed_on_close(tmp_path):
    sd = tmp_path / "targets"
    tel = rl_otel.init(run="exp/1 a", rank=4, prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(sd)})
    [path] = sd.iterdir()  # no temporary file left behind
    assert re.fullmatch(r"rl_otel-exp_1_a-trainer-rank4-[0-9a-f]{10}\.json", path.name), path.name
    # the owner labels (host, process) let the next process reap the file of a killed one; Prometheus drops them
    assert json.loads(path.read_text()) == [{"targets": [f"127.0.0.1:{port_of(tel)}"],
                                             "labels": {"run": "exp/1 a", "role": "trainer", "rank": "4",
                                                        "__rl_otel_host": tel.config.host_name,
                                                        "__rl_otel_pid": str(os.getpid())}}]
    tel.close()
    assert list(sd.iterdir()) == []


def test_file_sd_yaml_file_and_advertised_host(tmp_path):
    import yaml

    path = tmp_path / "sd" / "me.yml"
    with rl_otel.init(run="r", prometheus={"host": "0.0.0.0", "port": 0, "file_sd": str(path),
                                           "advertise_host": "node-7.cluster"}) as tel:
        assert yaml.safe_load(path.read_text()) == [{"targets": [f"node-7.cluster:{port_of(tel)}"],
                                                     "labels": {"run": "r", "role": "trainer", "rank": "0"}}]
    assert not path.exists()


def test_file_sd_close_leaves_a_successor_file_alone(tmp_path):
    first = rl_otel.init(run="r", rank=1, prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)})
    second = rl_otel.init(run="r", rank=1, prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)})
    first.close()  # a restarted rank 1 (second) has replaced the file: it stays
    [path] = tmp_path.iterdir()
    assert json.loads(path.read_text())[0]["targets"] == [f"127.0.0.1:{port_of(second)}"]
    second.close()
    assert list(tmp_path.iterdir()) == []


def test_file_sd_close_leaves_a_successor_file_with_the_same_bytes_alone(tmp_path):
    from rl_otel._internal.exporters.file_sd import TargetsFile

    path = tmp_path / "rl_otel-r-rank1.json"
    old = TargetsFile(path, "node-1:9464", {"run": "r", "rank": "1"})
    restarted = TargetsFile(path, "node-1:9464", {"run": "r", "rank": "1"})  # same host, port, run, rank
    old.close()  # the old process's late close: the file is the restarted rank's now
    assert json.loads(path.read_text()) == [{"targets": ["node-1:9464"], "labels": {"run": "r", "rank": "1"}}]
    restarted.close()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_file_sd_is_a_configuration_error_and_the_endpoint_is_closed(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    sd = blocker / "targets"  # cannot be created, even by root
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigurationError,
                       match=f"file_sd targets file {re.escape(str(sd))}.*cannot be written.*Not a directory"):
        rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": port, "file_sd": str(sd)})
    with rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": port}) as tel:  # the port was released
        assert port_of(tel) == port


def start_ranks(run: str, sd: Path) -> list[subprocess.Popen]:
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, **CHILD_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.rank_worker", run, str(sd)], cwd=ROOT, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    return procs


@pytest.mark.prometheus
def test_eight_ranks_discovered_by_file_sd_and_aggregated(tmp_path):
    run, sd = "fleet", tmp_path / "targets"
    procs = start_ranks(run, sd)
    server = None
    try:
        # each rank is serving and has published
        urls = [read_line(p, f"rank {rank} serving").split()[1] for rank, p in enumerate(procs)]
        assert len(set(urls)) == WORLD
        assert len(list(sd.glob("*.json"))) == WORLD
        server = PrometheusServer(tmp_path, rule_files=RULE_FILES, scrape_configs=[{
            "job_name": "rl_otel", "honor_labels": True,
            "file_sd_configs": [{"files": [str(sd / "*.json")], "refresh_interval": "1s"}]}])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(server.query("up")) < WORLD:
            time.sleep(0.3)
        server.wait_for_scrapes(1)

        def one(promql: str) -> float:
            [result] = server.query(promql)
            return float(result["value"][1])

        assert one(f'count by (run) (up{{run="{run}"}} == 1)') == WORLD
        assert {r["metric"]["rank"] for r in server.query("up")} == {str(r) for r in range(WORLD)}
        scores = [expected(r)["critic/score/mean"] for r in range(WORLD)]
        kls = [expected(r)["actor/approxkl"] for r in range(WORLD)]
        assert one('sum by (run) (rl_critic_score{stat="mean"})') == pytest.approx(sum(scores))
        assert one('max by (run) (rl_critic_score{stat="mean"})') == pytest.approx(max(scores))
        assert one('min by (run) (rl_critic_score{stat="mean"})') == pytest.approx(min(scores))
        assert one('avg by (run) (rl_critic_score{stat="mean"})') == pytest.approx(sum(scores) / WORLD)
        assert one("max by (run) (rl_actor_approx_kl)") == pytest.approx(max(kls))
        assert one("sum by (run) (rl_system_samples_total)") == sum(expected(r)["system/samples"]
                                                                     for r in range(WORLD))
        assert one('sum by (run) (rl_env_reward_dist_bucket{le="+Inf"})') == sum(r + 1 for r in range(WORLD))
        assert one("count by (run) (rl_step == 10)") == WORLD
        # the recording rules (prometheus/rules/rl_otel_recording.yml) aggregate the 8 ranks into one series a run
        # (rules are evaluated every second: wait for an evaluation that saw all 8 scrapes)
        deadline = time.monotonic() + 15
        while (time.monotonic() < deadline
               and [float(r["value"][1]) for r in server.query("run:rl_step:count")] != [WORLD]):
            time.sleep(0.3)
        server.wait_for_scrapes(1)
        recorded = {r["metric"]["__name__"]: r for r in server.query(f'{{__name__=~"run:.+", run="{run}"}}')}
        assert all("rank" not in r["metric"] for r in recorded.values())
        assert one("run:rl_step:count") == WORLD
        assert one("run:rl_step:max") == 10
        assert one("run:rl_reward:avg") == pytest.approx(sum(scores) / WORLD)
        assert one("run:rl_policy_kl:max") == pytest.approx(max(kls))
        # the rank label on each series is the process's own
        by_rank = {r["metric"]["rank"]: float(r["value"][1]) for r in server.query('rl_critic_score{stat="mean"}')}
        assert by_rank == {str(r): expected(r)["critic/score/mean"] for r in range(WORLD)}
    finally:
        for p in procs:
            p.stdin.close()
        outs = [p.stdout.read() for p in procs]
        codes = [p.wait(30) for p in procs]
        if server is not None:
            server.close()
    assert codes == [0] * WORLD and all("closed" in out for out in outs)
    assert list(sd.iterdir()) == []  # every rank removed its target on close
