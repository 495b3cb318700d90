"""``promtool test rules`` cases of the rollout engines' alerts (``prometheus/tests/rl_otel_engines_test.yml``).

Each alert has broken runs it must fire on and healthy runs it must stay quiet on, fed as an engine serves them
(the names, labels and 15 s scrape interval of a vLLM or SGLang engine behind rl_otel: ``run``, ``role``,
``rank``, ``replica``, the engine's own ``model_name``/``engine``/``tp_rank``), through the shipped recording rules
(goodput, last step) and the engines' file. The expected values are written here by hand, not computed by the
rules' code, so a wrong expression fails.
"""

from __future__ import annotations

from rl_otel.ops import engines
from rl_otel.ops.promtests import JOB, Case, Firing, _expected
from rl_otel.ops.rules import RunbookLinks
from rl_otel.ops.thresholds import DEFAULT, Thresholds

INTERVAL_S = 15  # prometheus/prometheus.yml's scrape interval: what the engines' rates are written for
PER_MINUTE = 60 // INTERVAL_S


def _s(name: str, run: str, rank: int = 0, role: str = "rollout", replica: str = "0", **labels: str) -> str:
    inner = {"job": JOB, "instance": f"{run}-{rank}:9464", "run": run, "role": role, "rank": str(rank),
             "replica": replica, **labels}
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in inner.items() if v) + "}"


def _vllm(name: str, run: str, rank: int = 0, replica: str = "0", role: str = "rollout") -> str:
    return _s(name, run, rank, role, replica, model_name="Qwen/Qwen2.5-7B", engine="0")


def _sglang(name: str, run: str) -> str:
    """A series of an SGLang scheduler's (TP rank 0 of the replica)."""
    return _s(name, run, model_name="Qwen/Qwen2.5-7B", engine_type="unified", tp_rank="0", pp_rank="0",
              moe_ep_rank="0")


def values(samples: list[float]) -> str:
    """``samples`` (one per scrape) in promtool's notation: runs of a constant step as ``a+bxN``."""
    out, i = [], 0
    while i < len(samples):
        j = i + 1
        step = samples[j] - samples[i] if j < len(samples) else 0.0
        while j + 1 < len(samples) and samples[j + 1] - samples[j] == step:
            j += 1
        if j >= len(samples):
            j = len(samples) - 1
        n = j - i
        out.append(f"{samples[i]:g}" if n == 0 else f"{samples[i]:g}{step:+g}x{n}")
        i = j + 1
    return " ".join(out)


def counter(rates: list[tuple[int, float]]) -> str:
    """A counter growing at ``per_second`` for each ``(minutes, per_second)`` segment, one sample per scrape."""
    samples, total = [0.0], 0.0
    for minutes, per_second in rates:
        for _ in range(minutes * PER_MINUTE):
            total += per_second * INTERVAL_S
            samples.append(total)
    return values(samples)


def gauge(levels: list[tuple[int, float]]) -> str:
    samples = [levels[0][1]]
    for minutes, level in levels:
        samples += [level] * (minutes * PER_MINUTE)
    return values(samples)


def _kv_cases(t: Thresholds) -> list[Case]:
    full, preempting = t.engine_kv_usage_max + 0.04, t.engine_preemptions_min * 2
    minutes = 30
    bad = {}
    for rank in (0, 1):  # two ranks of one tensor-parallel group: one replica, counted once
        bad[_vllm("vllm:kv_cache_usage_perc", "vllm-full", rank)] = gauge([(5, 0.5), (minutes - 5, full)])
        bad[_vllm("vllm:num_preemptions_total", "vllm-full", rank)] = counter([(5, 0), (minutes - 5, preempting)])
    old = {_vllm("vllm:gpu_cache_usage_perc", "vllm-old-names"): gauge([(5, 0.5), (minutes - 5, full)]),
           _vllm("vllm:num_preemptions_total", "vllm-old-names"): counter([(5, 0), (minutes - 5, preempting)])}
    sglang = {_sglang("sglang:token_usage", "sglang-full"): gauge([(5, 0.5), (minutes - 5, full)]),
              _sglang("sglang:num_retracted_requests_total", "sglang-full"): counter([(5, 0),
                                                                                      (minutes - 5, preempting)])}
    healthy = {  # a full cache is what a busy engine looks like; without preemptions it is no trouble
        _vllm("vllm:kv_cache_usage_perc", "busy"): gauge([(minutes, full)]),
        _vllm("vllm:num_preemptions_total", "busy"): counter([(minutes, 0)]),
        # a few preemptions while the cache has room (a burst of long prompts): not saturation
        _vllm("vllm:kv_cache_usage_perc", "roomy"): gauge([(minutes, 0.6)]),
        _vllm("vllm:num_preemptions_total", "roomy"): counter([(minutes, preempting)]),
    }

    def fired(run: str) -> Firing:
        return Firing({"job": JOB, "run": run, "role": "rollout", "replica": "0"}, full)

    return [Case({**bad, **old, **sglang, **healthy},
                 {12: [], 25: [fired("sglang-full"), fired("vllm-full"), fired("vllm-old-names")]})]


def _throughput_cases(t: Thresholds) -> list[Case]:
    before, after = 100.0, 30.0
    drop_at, end = 120, 160
    # more of its time training later on (idle engine), generating at one speed
    cycles = [(10, before), (5, 0.0)] * (drop_at // 15) + [(5, before), (10, 0.0)] * ((end - drop_at) // 15 + 1)
    return [Case({
        _vllm("vllm:generation_tokens_total", "slower"): counter([(drop_at, before), (end - drop_at, after)]),
        # a colocated engine: 10 minutes of generation, 5 of training with the engine idle, then 5 and 10,
        _vllm("vllm:generation_tokens_total", "colocated"): counter(cycles),
        # an engine that generates twice as fast (responses got longer: more tokens per request, not slower)
        _vllm("vllm:generation_tokens_total", "faster"): counter([(drop_at, before), (end - drop_at, 2 * before)]),
    }, {125: [], 155: [Firing({"job": JOB, "run": "slower", "role": "rollout"}, after / before)]})]


def _idle_cases(t: Thresholds) -> list[Case]:
    minutes = 25

    def role(run: str, generation: list[tuple[int, float]], training: list[tuple[int, float]],
             running: list[tuple[int, float]], tokens: list[tuple[int, float]]) -> dict[str, str]:
        bucket = "rl_goodput_bucket_seconds_total"
        return {
            _s(bucket, run, role="actor", replica="", bucket="generation"): counter(generation),
            _s(bucket, run, role="actor", replica="", bucket="training"): counter(training),
            _s("rl_goodput_wall_seconds_total", run, role="actor", replica=""): counter([(minutes, 1.0)]),
            _vllm("vllm:num_requests_running", run, role="actor"): gauge(running),
            _vllm("vllm:generation_tokens_total", run, role="actor"): counter(tokens),
        }

    series = {
        # generation stays open 15 minutes after the last request finished
        **role("tail", [(minutes, 1.0)], [(minutes, 0.0)], [(10, 8), (minutes - 10, 0)],
               [(10, 50.0), (minutes - 10, 0.0)]),
        # a long tail that still works: one request running, tokens trickling
        **role("slow-tail", [(minutes, 1.0)], [(minutes, 0.0)], [(10, 8), (minutes - 10, 1)],
               [(10, 50.0), (minutes - 10, 2.0)]),
        # a colocated engine idle while its role trains
        **role("training", [(10, 1.0), (minutes - 10, 0.0)], [(10, 0.0), (minutes - 10, 1.0)],
               [(10, 8), (minutes - 10, 0)], [(10, 50.0), (minutes - 10, 0.0)]),
    }
    return [Case(series, {12: [], 20: [Firing({"job": JOB, "run": "tail", "role": "actor"}, 1.0)]})]


def _target_down_cases(t: Thresholds) -> list[Case]:
    minutes = 40

    def up(run: str, levels: list[tuple[int, float]]) -> dict[str, str]:
        labels = {"job": JOB, "instance": f"10.0.0.5:{8000 + len(run)}", "run": run, "role": "orchestrator",
                  "rank": "0", "replica": "rollout-0", engines.TARGET_LABEL: "engine"}
        return {"up{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}": gauge(levels)}

    def steps(run: str, until: int) -> dict[str, str]:  # the trainer's last step time, one step a scrape
        name = _s("rl_last_step_timestamp_seconds", run, role="orchestrator", replica="")
        samples = [float(min(i, until * PER_MINUTE) * INTERVAL_S) for i in range(minutes * PER_MINUTE + 1)]
        return {name: values(samples)}

    series = {**up("died", [(5, 1), (minutes - 5, 0)]), **steps("died", minutes),
              # the run ended at minute 1; its engine server went away long after (no run left to page for)
              **up("finished", [(30, 1), (minutes - 30, 0)]), **steps("finished", 1),
              **up("healthy", [(minutes, 1)]), **steps("healthy", minutes)}
    labels = {"job": JOB, "instance": "10.0.0.5:8004", "run": "died", "role": "orchestrator", "rank": "0",
              "replica": "rollout-0", engines.TARGET_LABEL: "engine"}
    return [Case(series, {7: [], 12: [Firing(labels, 0)], 39: [Firing(labels, 0)]})]


def cases(t: Thresholds = DEFAULT) -> dict[str, list[Case]]:
    """``{alert: its cases}`` for every engine alert."""
    return {"RLEngineKVCacheSaturated": _kv_cases(t), "RLEngineThroughputDrop": _throughput_cases(t),
            "RLEngineIdleDuringGeneration": _idle_cases(t), "RLEngineTargetDown": _target_down_cases(t)}


def test_file(t: Thresholds = DEFAULT, links: RunbookLinks | None = None) -> dict[str, object]:
    """The ``promtool test rules`` document (rule files relative to ``prometheus/tests/``)."""
    by_name = {a.name: a for a in engines.alerts(t)}
    tests = []
    for name, groups in cases(t).items():
        alert = by_name[name]
        for case in groups:
            tests.append({
                "interval": f"{INTERVAL_S}s",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{minute}m", "alertname": name,
                     "exp_alerts": [_expected(alert, f, links) for f in firings]}
                    for minute, firings in case.checks.items()],
            })
    return {"rule_files": ["../rules/rl_otel_recording.yml", "../rules/rl_otel_engines.yml"],
            "evaluation_interval": "1m", "tests": tests}
