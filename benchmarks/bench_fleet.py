"""A fleet on one machine: N rank processes (default 32) under one real Prometheus, as many as a 2-core VM holds.

Each rank is a worker of the default :class:`rl_otel.ops.budget.Shape` (5 clusters x 7 phases timed with
``tel.phase()``, GPU memory keys of one device as ROLL logs them, rank 0 also the step's statistics with
``ppo_stats(distributions=True)``, rollout and eval keys), logging a step every ``--step-interval`` seconds and
published by file_sd. Prometheus (the Debian package) scrapes them every ``--scrape-interval`` seconds and evaluates
the shipped rules. After ``--duration`` seconds Prometheus' own metrics say what it costs:

- head series against the computed budget (``rl-otel budget``): the ratio should be 1;
- scrape duration per target (average and worst over the last minute) against the scrape interval;
- rule evaluation time per group (worst over the last minute) against the evaluation interval;
- samples appended per second, Prometheus' CPU (cores) and resident memory; memory per series = the growth of
  RSS from the empty server to the loaded one, divided by the series added;

then the 1,024-GPU extrapolation of those figures (docs/scale.md holds a run's output).

    python benchmarks/bench_fleet.py [--ranks 32] [--duration 150] [--scrape-interval 5] [--step-interval 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's rl_otel, not an install

from rl_otel.ops import budget as b  # noqa: E402

RUN = "fleet-bench"


def rank_worker(rank: int, targets: str, step_interval: float, step_rank: bool) -> None:
    """One rank: serve, publish, log a step of the shape every ``step_interval`` s until stdin closes."""
    import threading

    import rl_otel

    shape = b.Shape()
    tel = rl_otel.init(run=RUN, rank=rank, handle_sigterm=False,
                       prometheus={"host": "127.0.0.1", "port": 0, "file_sd": targets})
    gpu_keys = [k for k in b.phase_keys(shape, rank) if k.startswith("memory/") and not k.startswith("memory/cpu/")]
    stats: dict = {}
    if step_rank:
        import torch

        from rl_otel.stats import ppo_stats

        g = torch.Generator().manual_seed(rank)
        n, t = 64, 256
        lp = -torch.rand(n, t, generator=g) * 3
        stats = ppo_stats(log_probs=lp, old_log_probs=lp + 0.1 * torch.randn(n, t, generator=g),
                          ref_log_probs=lp + 0.1 * torch.randn(n, t, generator=g), response_mask=torch.ones(n, t),
                          advantages=torch.randn(n, t, generator=g), values=torch.randn(n, t, generator=g),
                          returns=torch.randn(n, t, generator=g), rewards=torch.randn(n, generator=g),
                          scores=torch.randn(n, generator=g), entropy=torch.rand(n, t, generator=g),
                          distributions=True)
    done = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    print("ready", flush=True)
    step = 0
    while not done.is_set():
        for cluster, phase in b.phase_pairs(shape, rank):
            with tel.phase(cluster, phase):
                pass
        metrics: dict = dict.fromkeys(gpu_keys, 0.1 + (step % 7) / 10)
        if step_rank:
            metrics.update(stats)
            metrics.update({k: 0.5 for k in b.step_keys(shape) if k not in stats})
        tel.log(metrics, step=step)
        step += 1
        done.wait(step_interval)
    tel.close()


class Prometheus:
    def __init__(self, tmp: Path, targets: Path, interval: float, rule_paths: list[Path]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = {"global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s",
                             "evaluation_interval": f"{interval:g}s"},
                  "rule_files": [str(p) for p in rule_paths],
                  "scrape_configs": [
                      {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]},
                      {"job_name": "rl_otel", "honor_labels": True,
                       "file_sd_configs": [{"files": [str(targets / "*.json")], "refresh_interval": "2s"}]}]}
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - the server's log, closed by close()
        self.proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp / 'data'}", "--log.level=warn",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError("prometheus did not start")

    def value(self, promql: str) -> float:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        result = json.loads(urllib.request.urlopen(url, timeout=30).read())["data"]["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    def values(self, promql: str, label: str) -> dict[str, float]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        result = json.loads(urllib.request.urlopen(url, timeout=30).read())["data"]["result"]
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}

    def slowest_rules(self, n: int) -> list[tuple[str, float]]:
        """The ``n`` rules whose last evaluation took longest (the rules API's ``evaluationTime``)."""
        groups = json.loads(urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=30).read())["data"]["groups"]
        times = [(r["name"], float(r["evaluationTime"])) for g in groups for r in g["rules"]]
        return sorted(times, key=lambda t: -t[1])[:n]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def measure(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench_fleet-") as tmp_name:
        tmp = Path(tmp_name)
        targets = tmp / "targets"
        targets.mkdir()
        rule_paths = []
        from rl_otel.ops.rules import rule_files

        for name, doc in rule_files().items():
            (tmp / name).write_text(json.dumps(doc))
            rule_paths.append(tmp / name)
        prom = Prometheus(tmp, targets, args.scrape_interval, rule_paths)
        ranks: list[subprocess.Popen] = []
        try:
            time.sleep(3 * args.scrape_interval)  # a few self-scrapes: the empty server's memory
            empty_rss = prom.value('process_resident_memory_bytes{job="prometheus"}')
            empty_series = prom.value("prometheus_tsdb_head_series")
            env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   "OMP_NUM_THREADS": "1"}
            for rank in range(args.ranks):
                ranks.append(subprocess.Popen(
                    [sys.executable, __file__, "--rank-worker", str(rank), str(targets), str(args.step_interval)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            for p in ranks:
                assert p.stdout is not None and p.stdout.readline().startswith("ready")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and prom.value('count(up{job="rl_otel"} == 1)') != args.ranks:
                time.sleep(1)
            started = time.monotonic()
            print(f"{args.ranks} ranks up; measuring for {args.duration:g} s", file=sys.stderr)
            time.sleep(args.duration)
            window = "1m"
            out: dict[str, object] = {
                "ranks": args.ranks, "scrape_interval_s": args.scrape_interval,
                "duration_s": time.monotonic() - started,
                "head_series": prom.value("prometheus_tsdb_head_series"), "empty_series": empty_series,
                "target_series": prom.value('count({job="rl_otel", instance=~".+"})'),
                "recorded_series": prom.value('count({__name__=~"run.*:.+"})'),
                "scrape_s_avg": prom.value(f'avg(avg_over_time(scrape_duration_seconds{{job="rl_otel"}}[{window}]))'),
                "scrape_s_max": prom.value(f'max(max_over_time(scrape_duration_seconds{{job="rl_otel"}}[{window}]))'),
                "samples_scraped": prom.value('sum(scrape_samples_scraped{job="rl_otel"})'),
                "rule_group_s_max": prom.values(
                    f"max_over_time(prometheus_rule_group_last_duration_seconds[{window}])", "rule_group"),
                "samples_per_s": prom.value(f"rate(prometheus_tsdb_head_samples_appended_total[{window}])"),
                "cpu_cores": prom.value(f'rate(process_cpu_seconds_total{{job="prometheus"}}[{window}])'),
                "rss_bytes": prom.value('process_resident_memory_bytes{job="prometheus"}'),
                "heap_bytes": prom.value('go_memstats_heap_inuse_bytes{job="prometheus"}'),
                "empty_rss_bytes": empty_rss,
                "load": os.getloadavg(),
                "slowest_rules": prom.slowest_rules(5),
            }
        finally:
            for p in ranks:
                if p.stdin:
                    p.stdin.close()
            for p in ranks:
                p.wait(60)
            prom.close()
    return out


def report(m: dict, scrape_interval: float) -> str:
    # this machine has no GPU: no live GPU gauges (the extrapolation below counts them)
    shape = b.Shape(gpus=m["ranks"], gpus_per_node=m["ranks"], live_gpu=False)
    computed = b.budget(shape, scrape_interval_s=scrape_interval, evaluation_interval_s=scrape_interval)
    added = m["head_series"] - m["empty_series"]
    per_series = (m["rss_bytes"] - m["empty_rss_bytes"]) / added
    groups = m["rule_group_s_max"]
    rows = [
        ("rl_otel series in Prometheus (incl. up, scrape_*)", m["target_series"], computed.job_scraped,
         "computed budget (rl-otel budget)"),
        ("recorded series (run:*)", m["recorded_series"], computed.job_recorded, "computed budget"),
        ("scrape duration per target, average", m["scrape_s_avg"] * 1e3, scrape_interval * 1e3, "scrape interval (ms)"),
        ("scrape duration per target, worst in 1 min", m["scrape_s_max"] * 1e3, scrape_interval * 1e3,
         "scrape interval (ms)"),
        *((f"rule group {g.rsplit(';', 1)[-1]} evaluation, worst in 1 min", s * 1e3, scrape_interval * 1e3,
           "evaluation interval (ms)") for g, s in sorted(groups.items())),
        ("samples appended per second", m["samples_per_s"], computed.samples_per_second, "computed samples/s"),
        ("Prometheus CPU (cores)", m["cpu_cores"], 2.0, "the machine's 2 cores"),
    ]
    lines = ["| measurement | measured | baseline | ratio |", "|---|---|---|---|"]
    for name, measured, baseline, base_name in rows:
        lines.append(f"| {name} | {measured:,.4g} | {baseline:,.4g} ({base_name}) | {measured / baseline:.3g} |")
    lines.append(f"| Prometheus resident memory | {m['rss_bytes'] / 2**20:,.0f} MiB | "
                 f"{m['empty_rss_bytes'] / 2**20:,.0f} MiB (empty server) | - |")
    lines.append(f"| resident memory per added series | {per_series:,.0f} B | - | - |")
    slowest = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in m.get("slowest_rules", []))
    lines.append(f"\nSlowest rules (last evaluation): {slowest}")
    big = b.budget(b.Shape(gpus=1024), scrape_interval_s=15, evaluation_interval_s=15)
    lines.append("")
    lines.append(f"Extrapolated to 1,024 GPUs (default shape, 15 s scrape): {big.job_total:,} series, "
                 f"{big.samples_per_second:,.0f} samples/s, ~{big.job_total * per_series / 2**30:,.1f} GiB resident "
                 f"in one Prometheus at {per_series:,.0f} B/series; scrape work "
                 f"{m['scrape_s_avg'] * big.shape.workers / 15:.2f} target-seconds per second.")
    lines.append(f"({m['ranks']} ranks, {m['duration_s']:.0f} s measured, load {m['load'][0]:.1f}; "
                 f"{m['samples_scraped']:,.0f} samples per scrape round)")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-worker":
        rank, targets, interval = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
        rank_worker(rank, targets, interval, step_rank=rank == 0)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--duration", type=float, default=150.0, help="seconds measured after every rank is up")
    parser.add_argument("--scrape-interval", type=float, default=5.0)
    parser.add_argument("--step-interval", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="print the raw measurements too")
    args = parser.parse_args()
    if args.duration < 70:
        parser.error("--duration must be >= 70 s: the figures are taken over the last minute")
    m = measure(args)
    if args.json:
        print(json.dumps(m, indent=2))
    print(report(m, args.scrape_interval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
