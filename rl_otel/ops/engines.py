"""Recording rules and alerts of the rollout engine (vLLM, SGLang), joined to the run, its roles and its phases.

The engines' families reach Prometheus two ways, with the same labels: an in-process engine's on the rank's own
endpoint (``_internal/exporters/engines.py``: ``run``, ``role``, ``rank``, ``replica`` added, the engine's labels
kept), an engine server as a target of its own (``tel.engine``: the same labels on the target, and
``rl_target="engine"``). Each rule takes whichever name an engine serves (:data:`SOURCES`: vLLM V1's names, the
names they replaced, SGLang's, and each with its colon written as an underscore, as prometheus_client writes them
to a Prometheus 2 scraping an engine server); the first one a replica reports wins.

Replicas. An engine's series are per ``replica``. Within one, the rules sum over vLLM's ``engine`` label (the
data-parallel engine cores of one front end) and take the largest over everything else: the ranks of one
tensor-parallel group (verl's and OpenRLHF's colocated engines, each rank running the same requests) and SGLang's
``tp_rank`` series report the same scheduler, so a sum would count each token once per GPU. A replica's GPU count
is the number of those ranks and ``tp_rank`` s it shows (1 for a server that shows none: per replica, then).

Phases. rl_otel's goodput accounting says how much of a role's wall time its generation phases took
(``rl_goodput_bucket_seconds_total{bucket="generation"}``): tokens per second of generation, and an engine idle
while a generation phase is open (the tail: the last requests finished, the phase waits on something else). The
gauge ``requests running`` is seen at the scrape interval (15 s: a shorter gap is invisible to it); the token
counters see every gap, averaged over their window.
"""

from __future__ import annotations

from rl_otel.ops import contract
from rl_otel.ops.rules import GOODPUT_SHARE, JOB_REGEX, ROLE, Alert, Recording, duration_minutes
from rl_otel.ops.thresholds import DEFAULT, Thresholds

REPLICA = "job, run, role, replica"
TARGET_LABEL = "rl_target"  # on an engine server's target (exporters/engine_targets.py)

# what each engine calls a quantity, newest first (vllm/v1/metrics/loggers.py, sglang/srt/metrics/collector.py)
_NAMES: dict[str, tuple[str, ...]] = {
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    # SGLang retracts a request where vLLM preempts it (its KV cache is freed, it is run again later)
    "preemptions": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    # vLLM 0.9 renamed gpu_cache_usage_perc; SGLang's token_usage is the share of its KV token pool in use
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "ttft": ("vllm:time_to_first_token_seconds_bucket", "sglang:time_to_first_token_seconds_bucket"),
    "queue_time": ("vllm:request_queue_time_seconds_bucket", "sglang:queue_time_seconds_bucket"),
    # vLLM's time_per_output_token_seconds was renamed inter_token_latency_seconds (same buckets)
    "itl": ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
            "sglang:inter_token_latency_seconds_bucket"),
}



def _spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names``, then each with its colon as an underscore: how an engine server's prometheus_client (0.26 here)
    writes a sample name in OpenMetrics when the scraper asks for no escaping scheme, as Prometheus 2 does
    (``vllm_generation_tokens_total`` under ``# TYPE vllm:generation_tokens counter``; pinned by
    tests/test_engines.py). rl_otel's own endpoint serves the colon names."""
    return (*names, *(n.replace(":", "_") for n in names))


SOURCES: dict[str, tuple[str, ...]] = {quantity: _spellings(names) for quantity, names in _NAMES.items()}

# vLLM V1's families as its PrometheusStatLogger registers them for one engine (vllm/v1/metrics/loggers.py at
# vllm-project/vllm@005a810bc40faa25b8870fbc8559c3462581eee3; labels model_name, engine): (name, kind, buckets:
# their count, or "1-2-5" for build_1_2_5_buckets(max_model_len)). What `rl-otel budget --engines-per-worker` counts.
VLLM_FAMILIES: tuple[tuple[str, str, int | str], ...] = (
    ("vllm:num_requests_running", "gauge", 0), ("vllm:num_requests_waiting", "gauge", 0),
    ("vllm:gpu_cache_usage_perc", "gauge", 0), ("vllm:kv_cache_usage_perc", "gauge", 0),
    ("vllm:cache_config_info", "gauge", 0),
    ("vllm:gpu_prefix_cache_queries", "counter", 0), ("vllm:gpu_prefix_cache_hits", "counter", 0),
    ("vllm:prefix_cache_queries", "counter", 0), ("vllm:prefix_cache_hits", "counter", 0),
    ("vllm:num_preemptions", "counter", 0), ("vllm:prompt_tokens", "counter", 0),
    ("vllm:generation_tokens", "counter", 0),
    ("vllm:request_prompt_tokens", "histogram", "1-2-5"), ("vllm:request_generation_tokens", "histogram", "1-2-5"),
    ("vllm:iteration_tokens_total", "histogram", 13), ("vllm:request_max_num_generation_tokens", "histogram", "1-2-5"),
    ("vllm:request_params_n", "histogram", 5), ("vllm:request_params_max_tokens", "histogram", "1-2-5"),
    ("vllm:time_to_first_token_seconds", "histogram", 22), ("vllm:time_per_output_token_seconds", "histogram", 19),
    ("vllm:time_per_prefill_token_request_seconds", "histogram", 10),
    ("vllm:e2e_request_latency_seconds", "histogram", 21), ("vllm:request_queue_time_seconds", "histogram", 21),
    ("vllm:request_inference_time_seconds", "histogram", 21), ("vllm:request_prefill_time_seconds", "histogram", 21),
    ("vllm:request_decode_time_seconds", "histogram", 21),
)
VLLM_FINISH_REASONS = ("stop", "length", "abort")  # vllm:request_success{finished_reason}: a counter each


def vllm_lines(max_model_len: int = 4096) -> int:
    """The sample lines one vLLM V1 engine's families serve (a histogram: its buckets, +Inf, _sum, _count)."""
    one_two_five = sum(1 for e in range(20) for m in (1, 2, 5) if m * 10 ** e <= max_model_len)
    lines = len(VLLM_FINISH_REASONS)
    for _name, kind, buckets in VLLM_FAMILIES:
        n = one_two_five if buckets == "1-2-5" else int(buckets)
        lines += n + 3 if kind == "histogram" else 1
    return lines


# the recorded series (level:metric:operations)
GENERATION = "run_role_replica:rl_engine_generation_tokens:rate1m"
PROMPT = "run_role_replica:rl_engine_prompt_tokens:rate1m"
ROLE_GENERATION = "run_role:rl_engine_generation_tokens:rate1m"
ROLE_PROMPT = "run_role:rl_engine_prompt_tokens:rate1m"
ROLE_GENERATING = "run_role:rl_engine_generation_tokens:rate1m_generating"  # only while tokens flow
GPUS = "run_role_replica:rl_engine_gpus:count"
PER_GPU = "run_role_replica:rl_engine_generation_tokens_per_gpu:rate1m"
PER_GENERATION_SECOND = "run_role:rl_engine_generation_tokens_per_generation_second:rate5m"
KV = "run_role_replica:rl_engine_kv_cache_usage:max"
PREEMPTIONS = "run_role_replica:rl_engine_preemptions:rate5m"
RUNNING = "run_role_replica:rl_engine_requests_running:max"
WAITING = "run_role_replica:rl_engine_requests_waiting:max"
ROLE_RUNNING = "run_role:rl_engine_requests_running:sum"
TTFT = "run_role_replica:rl_engine_time_to_first_token_seconds:p{q}"
QUEUE = "run_role_replica:rl_engine_queue_time_seconds:p{q}"
ITL = "run_role_replica:rl_engine_inter_token_latency_seconds:p{q}"
GENERATION_SHARE = f'{GOODPUT_SHARE}{{bucket="generation"}}'


def _per_replica(quantity: str, rate: str | None = None) -> str:
    """A quantity per replica: summed over vLLM's ``engine`` cores, the largest over the ranks and TP ranks that
    report one scheduler; the first source a replica reports wins."""
    parts = []
    for name in SOURCES[quantity]:
        sel = f"rate({name}[{rate}])" if rate else name
        parts.append(f"max by ({REPLICA}) (sum without (engine) ({sel}))")
    return " or ".join(parts)


def _quantile(quantity: str, q: float) -> str:
    return " or ".join(f"histogram_quantile({q:g}, sum by ({REPLICA}, le) (rate({name}[5m])))"
                       for name in SOURCES[quantity])


def recording_rules(t: Thresholds = DEFAULT) -> tuple[Recording, ...]:
    """The engines' recorded series: per replica, per role, and joined with the role's generation time."""
    gauges = " or ".join(SOURCES["running"])
    generation_bucket = f'{contract.GOODPUT_BUCKET.exposed}{{bucket="generation"}}'
    rules = [
        Recording(GENERATION, _per_replica("generation_tokens", "1m")),
        Recording(PROMPT, _per_replica("prompt_tokens", "1m")),
        Recording(ROLE_GENERATION, f"sum by ({ROLE}) ({GENERATION})"),
        Recording(ROLE_PROMPT, f"sum by ({ROLE}) ({PROMPT})"),
        # tokens/s while the engines generate: a colocated engine's minutes of training are left out, so the
        # throughput alert compares generating minutes with generating minutes
        Recording(ROLE_GENERATING, f"{ROLE_GENERATION} > 0"),
        Recording(GPUS, f"count by ({REPLICA}) (count by ({REPLICA}, rank, tp_rank, engine) ({gauges}))"),
        Recording(PER_GPU, f"{GENERATION} / on ({REPLICA}) {GPUS}"),
        Recording(PER_GENERATION_SECOND,
                  f"sum by ({ROLE}) ({_per_replica('generation_tokens', '5m')}) / on ({ROLE}) "
                  f"(max by ({ROLE}) (rate({generation_bucket}[5m])) > 0)"),
        Recording(KV, _per_replica("kv_cache_usage")),
        Recording(PREEMPTIONS, _per_replica("preemptions", "5m")),
        Recording(RUNNING, _per_replica("running")),
        Recording(WAITING, _per_replica("waiting")),
        Recording(ROLE_RUNNING, f"sum by ({ROLE}) ({RUNNING})"),
    ]
    for q, tag in ((0.5, "50"), (0.95, "95")):
        rules += [Recording(TTFT.format(q=tag), _quantile("ttft", q)),
                  Recording(QUEUE.format(q=tag), _quantile("queue_time", q)),
                  Recording(ITL.format(q=tag), _quantile("itl", q))]
    return tuple(rules)


def alerts(t: Thresholds = DEFAULT) -> tuple[Alert, ...]:
    """The engines' alerts (each with a healthy and a broken run in ``engine_promtests.py``)."""
    replica = "replica {{ $labels.replica }} ({{ $labels.role }}) of run {{ $labels.run }}"
    smooth, window, offset = (t.engine_throughput_smooth, t.engine_throughput_baseline_window,
                              t.engine_throughput_baseline_offset)
    history = max(1, round(duration_minutes(window) * t.engine_throughput_min_history))
    throughput = (f"quantile_over_time(0.5, {ROLE_GENERATING}[{smooth}]) / quantile_over_time(0.5, "
                  f"{ROLE_GENERATING}[{window}] offset {offset}) < {t.engine_throughput_ratio_min:g} and "
                  f"count_over_time({ROLE_GENERATING}[{window}] offset {offset}) >= {history}")
    # a role in generation whose engines run nothing and produce no token (max over rl_goodput's ranks)
    idle = (f"sum without (bucket) ({GENERATION_SHARE}) > {t.engine_idle_generation_share:g} "
            f"and on ({ROLE}) {ROLE_RUNNING} == 0 and on ({ROLE}) {ROLE_GENERATION} == 0")
    live = f"time() - run:rl_last_step_timestamp_seconds:max < {t.stall_seconds:g}"
    return (
        Alert("RLEngineKVCacheSaturated",
              f"{KV} > {t.engine_kv_usage_max:g} and on ({REPLICA}) {PREEMPTIONS} > {t.engine_preemptions_min:g}",
              t.engine_kv_for, "warning",
              f"Engine {replica}: KV cache full, requests preempted",
              f"The KV cache of engine {replica} is {{{{ $value | humanizePercentage }}}} used and its requests are "
              f"preempted (vLLM) or retracted (SGLang) more than {t.engine_preemptions_min:g}/s, for "
              f"{t.engine_kv_for}: preempted requests are recomputed, so rollout slows down and its tail grows. "
              "Give the engine more KV memory (gpu_memory_utilization, mem_fraction_static), fewer concurrent "
              "sequences (max_num_seqs), or shorter responses."),
        Alert("RLEngineThroughputDrop", throughput, t.engine_throughput_for, "warning",
              "Run {{ $labels.run }}: rollout tokens/s of {{ $labels.role }} fell to "
              "{{ $value | humanizePercentage }} of its baseline",
              f"The generation tokens/s of the engines of role {{{{ $labels.role }}}} of run {{{{ $labels.run }}}}, "
              f"counted while they generate (a colocated engine's training minutes are left out) and its median "
              f"over {smooth}, is {{{{ $value | humanizePercentage }}}} of the run's own median over {window} "
              f"ending {offset} ago (below {t.engine_throughput_ratio_min:g}), for {t.engine_throughput_for}. "
              "Tokens, not requests: longer responses do not read as a slowdown. See the Rollout engines "
              "dashboard: KV cache and preemptions, requests waiting, queue time."),
        Alert("RLEngineIdleDuringGeneration", idle, t.engine_idle_for, "warning",
              "Run {{ $labels.run }}: {{ $labels.role }} is in generation but its engines run nothing",
              f"Role {{{{ $labels.role }}}} of run {{{{ $labels.run }}}} spends "
              f"{{{{ $value | humanizePercentage }}}} of its wall time in generation phases, while none of its "
              f"engines runs a request or produces a token, for {t.engine_idle_for}: the GPUs idle inside the "
              "phase (the tail after the last request, a reward or tool call the phase waits on, requests never "
              "sent). Seen at the scrape interval: gaps shorter than it are not."),
        Alert("RLEngineTargetDown",
              f'up{{job=~"{JOB_REGEX}", {TARGET_LABEL}="engine"}} == 0 and on (job, run) ({live})',
              t.target_down_for, "critical",
              "Engine {{ $labels.replica }} of run {{ $labels.run }} cannot be scraped",
              "Prometheus cannot scrape engine server {{ $labels.instance }} (replica {{ $labels.replica }}, "
              "published by {{ $labels.role }} rank {{ $labels.rank }}) while run {{ $labels.run }} still logs "
              "steps: the engine died or hangs, or its /metrics is off (SGLang: --enable-metrics)."),
    )


def rule_file(t: Thresholds = DEFAULT, links: object = None) -> dict[str, object]:
    """``prometheus/rules/rl_otel_engines.yml``: the recording group, then the alerts group."""
    return {"groups": [{"name": "rl_otel_engines_recording", "rules": [r.to_dict() for r in recording_rules(t)]},
                       {"name": "rl_otel_engines_alerts",
                        "rules": [a.to_dict(links) for a in alerts(t)]}]}  # type: ignore[arg-type]
