"""The rollout engine beside the trainer: an in-process engine's families served on rl_otel's endpoint with the
run's labels (``exporters/engines.py``), a multiprocess directory served once, and an engine server published as a
scrape target (``tel.engine``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import rl_otel
from rl_otel._internal.exporters.engines import LOCK_NAME, EngineFamilies, EnginesConfig
from rl_otel.errors import ConfigurationError
from tests.engine_families import VLLM_TTFT_BUCKETS, sglang_engine, vllm_engine

LOCAL = {"host": "127.0.0.1", "port": 0}


@contextmanager
def in_process_registry() -> Iterator[CollectorRegistry]:
    """A registry of an engine's families, hung in prometheus_client's global REGISTRY for the block (where an
    in-process vLLM or SGLang puts its families), taken out again after it."""
    registry = CollectorRegistry()
    REGISTRY.register(registry)
    try:
        yield registry
    finally:
        REGISTRY.unregister(registry)


def _scrape(tel) -> str:
    with urllib.request.urlopen(tel.metrics_url, timeout=10) as response:
        return response.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_an_in_process_vllm_engines_families_are_served_with_the_runs_labels_and_its_own():
    """vLLM's gauges, counters and histograms reach rl_otel's endpoint under their own names, with run, role,
    rank and replica added and model_name and engine kept; the exposition parses (before: nothing of the engine
    was served)."""
    with in_process_registry() as registry:
        engine = vllm_engine(registry)
        engine.step(running=3, waiting=1, kv=0.5, prompt=100, generated=40, preempted=2, ttft=0.03, itl=0.02,
                    finished=[(0.4, 2.0, 40)])
        with rl_otel.init(run="r", role="rollout", rank=2, prometheus=LOCAL) as tel:
            text = _scrape(tel)
    samples = _samples(text)
    base = {"run": "r", "role": "rollout", "rank": "2", "replica": "2", "model_name": "Qwen/Qwen2.5-0.5B",
            "engine": "0"}
    assert samples[("vllm:num_requests_running", frozenset(base.items()))] == 3
    assert samples[("vllm:kv_cache_usage_perc", frozenset(base.items()))] == 0.5
    assert samples[("vllm:generation_tokens_total", frozenset(base.items()))] == 40
    assert samples[("vllm:num_preemptions_total", frozenset(base.items()))] == 2
    assert samples[("vllm:time_to_first_token_seconds_count", frozenset(base.items()))] == 1
    assert samples[("vllm:time_to_first_token_seconds_bucket", frozenset({**base, "le": "0.04"}.items()))] == 1
    assert samples[("vllm:time_to_first_token_seconds_bucket", frozenset({**base, "le": "0.02"}.items()))] == 0
    buckets = [k for k in samples if k[0] == "vllm:time_to_first_token_seconds_bucket"]
    assert len(buckets) == len(VLLM_TTFT_BUCKETS) + 1  # the engine's own buckets, +Inf
    assert not any(name.endswith("_created") for name, _ in samples)
    assert "# TYPE vllm:generation_tokens_total counter" in text


def test_an_engine_label_named_like_a_base_label_is_renamed_not_dropped_and_replica_is_configurable():
    registry = CollectorRegistry()
    from prometheus_client import Gauge

    Gauge("sglang:num_running_reqs", "running", ["rank", "replica", "tp_rank"], registry=registry).labels(
        "7", "x", "1").set(4)
    counted: list[str] = []
    engines = EngineFamilies(EnginesConfig(replica="dp3"), rank=0, max_series_per_metric=100,
                             count=counted.append, registry=registry)
    [(spec, labels, value)] = engines.collect()
    assert spec.name == "sglang:num_running_reqs" and value == 4
    assert dict(labels) == {"replica": "dp3", "engine_rank": "7", "engine_replica": "x", "tp_rank": "1"}
    assert counted == []


def test_engines_false_serves_none_and_prefixes_choose_the_families():
    with in_process_registry() as registry:
        vllm_engine(registry).step(running=1, waiting=0, kv=0.1)
        sglang_engine(registry).step(running=2, queued=0, usage=0.2)
        with rl_otel.init(run="off", prometheus=LOCAL, engines=False) as tel:
            assert "vllm:" not in _scrape(tel)
        with rl_otel.init(run="some", prometheus=LOCAL, engines=["sglang:"]) as tel:
            text = _scrape(tel)
            assert "sglang:num_running_reqs{" in text and "vllm:" not in text
            assert tel.value("sglang:num_running_reqs", replica="0", model_name="Qwen/Qwen2.5-0.5B",
                             engine_type="unified", tp_rank="0", pp_rank="0", moe_ep_rank="0") == 2


def test_an_engine_family_is_capped_like_any_family_and_what_is_left_out_is_counted():
    with in_process_registry() as registry:
        from prometheus_client import Gauge

        gauge = Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=registry)
        for i in range(5):
            gauge.labels("m", str(i)).set(i)
        with rl_otel.init(run="cap", prometheus=LOCAL, max_series_per_metric=3) as tel:
            text = _scrape(tel)
            assert text.count("vllm:num_requests_running{") == 3
            assert tel.value("rl_telemetry_errors_total", sink="live", reason="engine_series_cap") >= 1


@pytest.mark.parametrize("bad", ["vllm:", 3, {"prefix": ["vllm:"]}, {"prefixes": []}, {"prefixes": ["rl_"]},
                                 {"replica": ""}, {"replica": True}])
def test_a_bad_engines_option_fails_at_init_naming_it(bad):
    with pytest.raises(ConfigurationError, match="engines"):
        rl_otel.init(run="bad", prometheus=False, engines=bad)


_WRITER = textwrap.dedent("""
    import sys
    from prometheus_client import Counter, Gauge
    tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ["model_name", "engine"])
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    ["model_name", "engine"], multiprocess_mode="mostrecent")
    tokens.labels("m", "0").inc(float(sys.argv[1]))
    running.labels("m", "0").set(float(sys.argv[1]))
""")


@pytest.mark.slow  # subprocesses
def test_a_multiprocess_directory_shared_by_two_ranks_is_served_once_and_taken_over_when_its_server_leaves(
        tmp_path):
    """Two engine worker processes write PROMETHEUS_MULTIPROC_DIR (as SGLang's and vLLM's multiprocess front ends
    do); two ranks of the node read it: one serves the directory's sum, the other nothing, so a sum over ranks
    counts each token once. When the serving rank closes, the other serves it at its next collection."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for tokens in ("30", "12"):
        subprocess.run([sys.executable, "-c", _WRITER, tokens], env=env, check=True, timeout=60)
    config = EnginesConfig(multiprocess_dir=str(tmp_path))
    first = EngineFamilies(config, rank=0, max_series_per_metric=100, count=lambda r: None)
    second = EngineFamilies(config, rank=1, max_series_per_metric=100, count=lambda r: None)
    try:
        served = first.collect()
        assert second.collect() == []
        tokens = {dict(labels)["replica"]: value for spec, labels, value in served
                  if spec.name == "vllm:generation_tokens"}
        assert tokens == {"0": 42.0}  # the two writers' sum, once
        assert (tmp_path / LOCK_NAME).exists()
        first.close()
        assert {spec.name for spec, _, _ in second.collect()} == {"vllm:generation_tokens",
                                                                    "vllm:num_requests_running"}
    finally:
        first.close()
        second.close()


def test_tel_engine_publishes_an_engine_server_as_a_file_sd_target_with_the_runs_labels(tmp_path):
    prometheus = {**LOCAL, "file_sd": str(tmp_path)}
    tel = rl_otel.init(run="prime", role="orchestrator", rank=0, prometheus=prometheus)
    try:
        path = tel.engine("http://10.0.0.5:8000", name="rollout-0")
        tel.engine("https://[fd00::1]:30000/metrics/", name="rollout-1")
        assert path is not None
        [group] = json.loads(Path(path).read_text())
        assert group == {"targets": ["10.0.0.5:8000"],
                         "labels": {"run": "prime", "role": "orchestrator", "rank": "0", "replica": "rollout-0",
                                    "rl_target": "engine", "__scheme__": "http", "__metrics_path__": "/metrics"}}
        assert len(list(tmp_path.iterdir())) == 3  # the process's own target, two engines
        again = tel.engine("http://10.0.0.6:8000", name="rollout-0")  # the engine moved: its target replaced
        assert len(list(tmp_path.iterdir())) == 3
        assert json.loads(Path(again).read_text())[0]["targets"] == ["10.0.0.6:8000"]
        with pytest.raises(ValueError, match="host and a port"):
            tel.engine("http://no-port", name="x")
    finally:
        tel.close()
    assert list(tmp_path.iterdir()) == []
    assert tel.engine("http://10.0.0.5:8000", name="late") is None and list(tmp_path.iterdir()) == []


def test_tel_engine_without_a_file_sd_directory_publishes_nothing_and_says_so(caplog):
    with rl_otel.init(run="nofsd", prometheus=LOCAL) as tel:
        assert tel.engine("http://127.0.0.1:8000", name="e") is None
    assert any("file_sd" in r.getMessage() for r in caplog.records)


def test_prometheus_client_writes_an_engine_servers_colon_names_with_underscores_to_a_prometheus_2_scrape():
    """Why the engine rules also read ``vllm_*``/``sglang_*`` (rl_otel/ops/engines.py, ``_spellings``): asked for
    OpenMetrics without an escaping scheme (Prometheus 2's Accept header), prometheus_client (pinned 0.26) writes
    the samples of a family named ``sglang:generation_tokens`` as ``sglang_generation_tokens_total`` (its HELP and
    TYPE keep the colon). When this fails, the engines' servers are scraped under their own names again and the
    underscore spellings can go."""
    from prometheus_client.openmetrics.exposition import generate_latest

    registry = CollectorRegistry()
    sglang_engine(registry).step(running=1, queued=0, usage=0.1, generated=5)
    text = generate_latest(registry).decode()
    assert 'sglang_generation_tokens_total{model_name="Qwen/Qwen2.5-0.5B"} 5.0' in text
    assert "# TYPE sglang:generation_tokens counter" in text
    assert "sglang:generation_tokens_total{" not in text


def test_verls_backend_says_once_which_setting_turns_its_vllm_rollouts_metrics_on(caplog):
    """verl builds its vLLM engines with disable_log_stats=True by default: no engine family at all. Its rl_otel
    backend names the setting, and stays quiet once it is set (or for an SGLang rollout)."""
    from rl_otel.integrations.verl import RLOtelBackend, engine_stats_hint

    config = {"trainer": {"rl_otel": {"prometheus": False}},
              "actor_rollout_ref": {"rollout": {"name": "vllm", "disable_log_stats": True}}}
    backend = RLOtelBackend("p", "verl-engines", config=config)
    backend.finish()
    said = [r.getMessage() for r in caplog.records if "disable_log_stats" in r.getMessage()]
    assert len(said) == 1 and "actor_rollout_ref.rollout.disable_log_stats=False" in said[0]
    assert engine_stats_hint({"actor_rollout_ref": {"rollout": {"name": "vllm", "disable_log_stats": False}}}) is None
    assert engine_stats_hint({"actor_rollout_ref": {"rollout": {"name": "sglang"}}}) is None
    assert engine_stats_hint({"actor_rollout_ref": {"rollout": {"name": "vllm"}}}) is not None  # verl's default


def test_the_budget_counts_the_lines_a_served_vllm_engine_makes():
    """``rl-otel budget --engines-per-worker 1`` adds what rl_otel serves for one vLLM V1 engine: its families
    (rl_otel/ops/engines.py's table, checked against tests/engine_families.py's separate transcription of the same
    source) served through the endpoint, counted line by line."""
    from prometheus_client import Counter, Gauge, Histogram

    from rl_otel.ops import budget, engines
    from tests.engine_families import build_1_2_5_buckets

    table = {name: (kind, buckets) for name, kind, buckets in engines.VLLM_FAMILIES}
    transcribed = CollectorRegistry()
    vllm_engine(transcribed, new_names=False)
    for metric in transcribed.collect():
        if metric.name in table:  # the transcription's names, kinds and bucket counts are the table's
            kind, buckets = table[metric.name]
            assert metric.type == kind, metric.name
            if kind == "histogram":
                bounds = {s.labels["le"] for s in metric.samples if s.name.endswith("_bucket")} - {"+Inf"}
                assert len(bounds) == (len(build_1_2_5_buckets(4096)) if buckets == "1-2-5" else buckets), metric.name
    with in_process_registry() as registry:
        labels = ["model_name", "engine"]
        for name, kind, buckets in engines.VLLM_FAMILIES:
            if kind == "histogram":
                bounds = (build_1_2_5_buckets(4096) if buckets == "1-2-5"
                          else [float(i + 1) for i in range(int(buckets))])
                Histogram(name, name, labels, registry=registry, buckets=bounds).labels("m", "0").observe(1)
            elif kind == "counter":
                Counter(name, name, labels, registry=registry).labels("m", "0").inc()
            else:
                Gauge(name, name, labels, registry=registry).labels("m", "0").set(1)
        success = Counter("vllm:request_success", "requests", [*labels, "finished_reason"], registry=registry)
        for reason in engines.VLLM_FINISH_REASONS:
            success.labels("m", "0", reason).inc()
        with rl_otel.init(run="budget", prometheus=LOCAL) as tel:
            served = [line for line in _scrape(tel).splitlines() if line.startswith("vllm:")]
    assert len(served) == engines.vllm_lines(4096)
    plain, with_engine = budget.budget(budget.Shape()), budget.budget(budget.Shape(engines_per_worker=1))
    assert with_engine.worker_series - plain.worker_series == len(served)
    assert with_engine.job_recorded > plain.job_recorded


@pytest.mark.slow  # a forked child
def test_a_forked_child_does_not_keep_the_directory_claim_after_its_parent_leaves(tmp_path):
    """flock belongs to the open file, which a fork shares: a child that kept its copy (a data loader's worker)
    would hold the directory after the serving rank exited. The child closes its copy at the fork."""
    config = EnginesConfig(multiprocess_dir=str(tmp_path))
    parent = EngineFamilies(config, rank=0, max_series_per_metric=10, count=lambda r: None)
    other = EngineFamilies(config, rank=1, max_series_per_metric=10, count=lambda r: None)
    try:
        assert parent._metrics() is not None and parent._claims[str(tmp_path)].held()
        read, write = os.pipe()
        started_read, started_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child (its fork hooks have run): say so, wait until the parent let go, then end
            os.close(write)
            os.write(started_write, b"s")
            os.read(read, 1)
            os._exit(0)
        os.close(read)
        os.close(started_write)
        assert os.read(started_read, 1) == b"s"  # bounded: the child writes at once or dies (EOF)
        os.close(started_read)
        try:
            parent.close()  # the serving rank leaves while its child lives on
            assert other._claims.get(str(tmp_path)) is None and list(other._metrics()) == []  # nothing written
            assert other._claims[str(tmp_path)].held()
        finally:
            os.write(write, b"x")
            os.close(write)
            os.waitpid(pid, 0)
    finally:
        parent.close()
        other.close()


def test_skyrls_remote_inference_engines_are_published_as_the_runs_engine_targets(tmp_path):
    """SkyRL's config names its engine servers when it runs none locally: its rl_otel tracker publishes each."""
    from rl_otel.integrations.skyrl import remote_engine_urls, rl_otel_tracker

    cfg = {"trainer": {"run_name": "skyrl-engines"},
           "generator": {"run_engines_locally": False,
                         "remote_inference_engine_urls": ["127.0.0.1:8001", "10.0.0.7:8001"]}}
    tracker = rl_otel_tracker(cfg, None, prometheus={**LOCAL, "file_sd": str(tmp_path)})
    try:
        groups = [json.loads(p.read_text())[0] for p in tmp_path.iterdir()]
        engines = {g["labels"]["replica"]: g["targets"] for g in groups if g["labels"].get("rl_target") == "engine"}
        assert engines == {"engine-0": ["127.0.0.1:8001"], "engine-1": ["10.0.0.7:8001"]}
    finally:
        tracker.finish()
    assert remote_engine_urls({"generator": {"run_engines_locally": True,
                                             "remote_inference_engine_urls": ["127.0.0.1:8001"]}}) == []
