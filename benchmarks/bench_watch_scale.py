"""``rl-otel watch`` beside a cluster's shared log directory: thousands of finished runs and one new training.

    python benchmarks/bench_watch_scale.py [--runs 5000] [--files 10] [--nofile 1024]

Writes ``runs`` finished runs of ``files`` metric files each (JSONL, a few steps of five keys), starts ``rl-otel watch``
on them in a child process limited to ``nofile`` open descriptors (``ulimit -n``), and measures: the time until
every run is served, the watcher's threads, open descriptors and resident memory (peak) then, the time a new
training's first value takes to be served, what a scrape of the endpoint costs (seconds, bytes: three right after
every run is served, five while one training appends a step every 0.1 s, one idle), and the share of a core the
watcher uses while no file grows (targets, issue 41: a scrape of 5,000 runs under 2 s, idle under
5% of a core; ``scrape_while_writing_s`` and ``scrape_after_catch_up_s`` are what the scrape target reads). Before
one endpoint served every run (a run per port, a thread per run), 5,000 runs x 10 files held 8,000 threads,
19,998 of 20,000 descriptors and 446 MiB, and with ``ulimit -n 1024`` and 400 runs a new training was never served.
Information rows (no target): see docs/watch.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one

KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "timing_s/gen", "timing_s/step")


def write_runs(root: Path, runs: int, files: int, steps: int = 3) -> None:
    """``runs`` run directories of ``files`` JSONL files each (``part<i>.jsonl``: one run and rank, the files a
    restarted or resumed training leaves)."""
    for r in range(runs):
        for f in range(files):
            path = root / f"run{r:05d}" / f"part{f}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as out:
                for s in range(steps):
                    out.write(json.dumps({"step": s, "time": 1.7e9 + s, **dict.fromkeys(KEYS, r + s / 10)}) + "\n")


def proc_status(pid: int) -> dict[str, int]:
    """Threads, open descriptors, RSS and peak RSS (kB) of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Threads", "VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    fields["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return fields


def served_runs(url: str) -> tuple[set[str], float, int]:
    """The runs the endpoint serves (their rl_step series), the scrape's seconds and bytes."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body = response.read()
    took = time.perf_counter() - start
    runs = {line.split('run="', 1)[1].split('"', 1)[0] for line in body.decode().splitlines()
            if line.startswith("rl_step{")}
    return runs, took, len(body)


def watch(root: Path, sd: Path, nofile: int, log: Path) -> subprocess.Popen:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    # its log goes to a file: a line per run served would fill a pipe nobody reads and stop the watcher
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "watch", str(root), "--host", "127.0.0.1",
                                 "--port", "0", "--file-sd", str(sd), "--no-state"], preexec_fn=limit,
                                stdout=subprocess.DEVNULL, stderr=out)


def endpoint(sd: Path, proc: subprocess.Popen, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in sd.glob("*.json"):
            try:
                return f"http://{json.loads(path.read_text())[0]['targets'][0]}/metrics"
            except (OSError, ValueError, IndexError, KeyError):
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"rl-otel watch exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError("no endpoint published")


def measure(runs: int, files: int, nofile: int, timeout_s: float = 1800.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="rl_otel-watch-scale-") as tmp:
        root, sd = Path(tmp) / "logs", Path(tmp) / "sd"
        write_runs(root, runs, files)
        start = time.monotonic()
        proc = watch(root, sd, nofile, Path(tmp) / "watch.log")
        try:
            url = endpoint(sd, proc)
            served: set[str] = set()
            deadline = time.monotonic() + timeout_s
            while len(served) < runs:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(served)} of {runs} runs served after {timeout_s:g} s")
                if proc.poll() is not None:
                    raise RuntimeError(f"rl-otel watch exited: {(Path(tmp) / 'watch.log').read_text()[-2000:]}")
                served, _, _ = served_runs(url)
                time.sleep(0.5)
            all_served_s = time.monotonic() - start
            status = proc_status(proc.pid)
            caught_up = [served_runs(url)[1:] for _ in range(3)]  # right after catching up
            scrape_bytes = caught_up[-1][1]
            with Writing(root / "run00000" / "part0.jsonl"):  # one training writes while Prometheus scrapes
                writing = []
                for _ in range(5):
                    writing.append(served_runs(url)[1])
                    time.sleep(1.0)
            new = root / "new-training" / "metrics.jsonl"  # a new training starts writing
            new.parent.mkdir(parents=True)
            written = time.monotonic()
            new.write_text(json.dumps({"step": 0, "time": 1.7e9, "critic/score/mean": 0.5}) + "\n")
            while "new-training" not in served_runs(url)[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"a new training not served after {timeout_s:g} s")
                time.sleep(0.1)
            new_run_s = time.monotonic() - written
            after = proc_status(proc.pid)
            idle_cpu = idle_share(proc.pid, 20.0)  # no file grows: the cost of watching alone
            _, idle_scrape_s, _ = served_runs(url)
        finally:
            proc.terminate()
            proc.wait(60)
    return {"runs": runs, "files": runs * files, "nofile": nofile, "all_served_s": round(all_served_s, 1),
            "threads": max(status["Threads"], after["Threads"]), "fds": max(status["fds"], after["fds"]),
            "rss_mib": round(status["VmRSS"] / 1024), "peak_rss_mib": round(after["VmHWM"] / 1024),
            "new_run_served_s": round(new_run_s, 2),
            "scrape_after_catch_up_s": spread([took for took, _ in caught_up]),
            "scrape_while_writing_s": spread(writing),
            "scrape_mib": round(scrape_bytes / 2**20, 1), "idle_scrape_s": round(idle_scrape_s, 2),
            "idle_cpu_share": round(idle_cpu, 3), "targets": {"scrape_s": 2.0, "idle_cpu_share": 0.05}}


class Writing:
    """A training writing: a thread appending a step of ``KEYS`` to ``path`` every 0.1 s while in the block."""

    def __init__(self, path: Path) -> None:
        self.path, self.stop = path, threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        step = 1_000
        while not self.stop.wait(0.1):
            with open(self.path, "a") as out:
                out.write(json.dumps({"step": step, "time": 1.7e9 + step, **dict.fromkeys(KEYS, step / 1e4)}) + "\n")
            step += 1

    def __enter__(self) -> Writing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def spread(seconds: list[float]) -> dict[str, float]:
    """The median and the maximum of some durations."""
    return {"median": round(statistics.median(seconds), 2), "max": round(max(seconds), 2), "n": len(seconds)}


def idle_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over ``seconds`` (its user and system time, from /proc)."""
    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    # past the files' first 30 s of being watched closely (watcher.QUIET_S), as a long-running watcher is
    time.sleep(40.0)
    start, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - start) / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--nofile", type=int, default=1024)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs, args.files, args.nofile), indent=2))


if __name__ == "__main__":
    main()
