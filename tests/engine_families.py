"""vLLM's and SGLang's metric families, made with the real prometheus_client, as the engines make them.

Neither engine installs here (vLLM's wheel is ~400 MB and its stat logger needs a ``VllmConfig``, i.e. torch,
transformers and a model config; SGLang's collector imports its server arguments and CUDA kernels), so the families
are declared from the engines' source at pinned commits, with their names, types, label names and buckets as
written there (data, not code):

- vLLM ``vllm/v1/metrics/loggers.py`` at vllm-project/vllm@005a810bc40faa25b8870fbc8559c3462581eee3
  (``PrometheusStatLogger``: labels ``model_name``, ``engine``). That commit serves ``vllm:time_per_output_token_
  seconds`` (renamed ``vllm:inter_token_latency_seconds`` later, same buckets) and the deprecated
  ``vllm:gpu_cache_usage_perc`` beside ``vllm:kv_cache_usage_perc``; ``new_names=False`` makes a V0-era engine
  (only the old names) for the rules' fallbacks.
- SGLang ``python/sglang/srt/metrics/collector.py`` at sgl-project/sglang@00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538
  (``SchedulerMetricsCollector``: labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
  ``moe_ep_rank``; ``TokenizerMetricsCollector``: ``model_name``; its TTFT buckets are the fixed list of the
  collector before they became configurable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

VLLM_COMMIT = "005a810bc40faa25b8870fbc8559c3462581eee3"
SGLANG_COMMIT = "00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538"

VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                     40.0, 80.0]
VLLM_REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
SGLANG_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       15.0, 20.0, 25.0, 30.0]
SGLANG_QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300,
                        400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets`` (1, 2, 5, 10, 20, ... up to ``max_value``)."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10 ** exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


@dataclass
class VllmEngine:
    """One vLLM engine's families (``engine`` index), with the calls its stat logger makes."""

    running: Any
    waiting: Any
    kv_usage: Any
    preemptions: Any
    prompt_tokens: Any
    generation_tokens: Any
    ttft: Any
    itl: Any
    queue_time: Any
    e2e: Any
    request_success: Any
    request_generation_tokens: Any

    def step(self, *, running: int, waiting: int, kv: float, prompt: int = 0, generated: int = 0,
             preempted: int = 0, ttft: float | None = None, itl: float | None = None,
             finished: list[tuple[float, float, int]] = ()) -> None:
        """One scheduler iteration as ``PrometheusStatLogger.record`` sees it; ``finished``: (queue s, e2e s,
        generated tokens) of each request that finished."""
        for gauge, value in ((self.running, running), (self.waiting, waiting)):
            gauge.set(value)
        for gauge in self.kv_usage:
            gauge.set(kv)
        self.preemptions.inc(preempted)
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        if ttft is not None:
            self.ttft.observe(ttft)
        if itl is not None:
            self.itl.observe(itl)
        for queued, e2e, tokens in finished:
            self.queue_time.observe(queued)
            self.e2e.observe(e2e)
            self.request_success.inc()
            self.request_generation_tokens.observe(tokens)


def vllm_engine(registry: CollectorRegistry | None = None, *, model: str = "Qwen/Qwen2.5-0.5B", engine: str = "0",
                new_names: bool = True, max_model_len: int = 4096) -> VllmEngine:
    """The families ``PrometheusStatLogger.__init__`` registers (those the rules and dashboard read, and the
    request-count ones beside them), in ``registry`` (a fresh one by default), labelled for one engine."""
    registry = registry if registry is not None else CollectorRegistry()
    names = ["model_name", "engine"]
    values = (model, engine)

    def gauge(name: str, doc: str) -> Any:
        return Gauge(name, doc, names, registry=registry, multiprocess_mode="mostrecent").labels(*values)

    def counter(name: str, doc: str, extra: tuple[str, ...] = (), more: tuple[str, ...] = ()) -> Any:
        return Counter(name, doc, names + list(extra), registry=registry).labels(*values, *more)

    def histogram(name: str, doc: str, buckets: list) -> Any:
        return Histogram(name, doc, names, registry=registry, buckets=buckets).labels(*values)

    kv = [gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")]
    if new_names:
        kv.append(gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."))
    itl_name = "vllm:inter_token_latency_seconds" if new_names else "vllm:time_per_output_token_seconds"
    return VllmEngine(
        running=gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
        waiting=gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
        kv_usage=kv,
        preemptions=counter("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
        prompt_tokens=counter("vllm:prompt_tokens", "Number of prefill tokens processed."),
        generation_tokens=counter("vllm:generation_tokens", "Number of generation tokens processed."),
        ttft=histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       VLLM_TTFT_BUCKETS),
        itl=histogram(itl_name, "Histogram of inter-token latency in seconds.", VLLM_TPOT_BUCKETS),
        queue_time=histogram("vllm:request_queue_time_seconds",
                             "Histogram of time spent in WAITING phase for request.", VLLM_REQUEST_LATENCY_BUCKETS),
        e2e=histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                      VLLM_REQUEST_LATENCY_BUCKETS),
        request_success=counter("vllm:request_success", "Count of successfully processed requests.",
                                ("finished_reason",), ("stop",)),
        request_generation_tokens=histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                            build_1_2_5_buckets(max_model_len)),
    )


@dataclass
class SglangEngine:
    """One SGLang server's families: its scheduler's (per TP rank) and its tokenizer manager's."""

    running: Any
    queued: Any
    token_usage: Any
    retracted: Any
    prompt_tokens: Any
    generation_tokens: Any
    ttft: Any
    queue_time: Any

    def step(self, *, running: int, queued: int, usage: float, prompt: int = 0, generated: int = 0,
             retracted: int = 0, ttft: float | None = None) -> None:
        self.running.set(running)
        self.queued.set(queued)
        self.token_usage.set(usage)
        self.retracted.inc(retracted)
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        if ttft is not None:
            self.ttft.observe(ttft)
            self.queue_time.observe(ttft / 2)


def sglang_engine(registry: CollectorRegistry | None = None, *, model: str = "Qwen/Qwen2.5-0.5B",
                  tp_rank: int = 0) -> SglangEngine:
    registry = registry if registry is not None else CollectorRegistry()
    sched = {"model_name": model, "engine_type": "unified", "tp_rank": str(tp_rank), "pp_rank": "0",
             "moe_ep_rank": "0"}

    def gauge(name: str, doc: str) -> Any:
        return Gauge(name, doc, list(sched), registry=registry, multiprocess_mode="mostrecent").labels(**sched)

    tok = {"model_name": model}
    return SglangEngine(
        running=gauge("sglang:num_running_reqs", "The number of running requests."),
        queued=gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
        token_usage=gauge("sglang:token_usage", "The token usage."),
        retracted=Counter("sglang:num_retracted_requests_total", "Total number of retracted requests.", list(sched),
                          registry=registry).labels(**sched),
        prompt_tokens=Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", list(tok),
                              registry=registry).labels(**tok),
        generation_tokens=Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                  list(tok), registry=registry).labels(**tok),
        ttft=Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       list(tok), registry=registry, buckets=SGLANG_TTFT_BUCKETS).labels(**tok),
        queue_time=Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", list(sched),
                             registry=registry, buckets=SGLANG_QUEUE_BUCKETS).labels(**sched),
    )
