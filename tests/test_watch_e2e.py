"""``rl-otel watch`` end to end: torch's real ``SummaryWriter`` and a JSONL writer reach the endpoint with every
value equal, within 2 s; a watcher killed with SIGKILL and restarted loses and duplicates nothing; ``rl-otel
backfill`` writes runs that the real promtool turns into blocks a real Prometheus answers at the original times."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.promtools import OPENMETRICS, PrometheusServer, key_samples, require_binary, samples, scrape
from tests.test_watch_support import ThreadedWatcher, served, wait_for

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

pytest.importorskip("tensorboard")
torch_tb = pytest.importorskip("torch.utils.tensorboard")

TB_KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "timing_s/gen",
           "my/custom_metric")


def _tb_values(step: int) -> dict[str, float]:
    return {k: float(np.float32(np.sin(step + i) * 10 ** (i % 3))) for i, k in enumerate(TB_KEYS)}


def _jsonl_values(step: int) -> dict:
    return {"step": step, "reward": {"mean": step / 8, "max": 0.1 + step}, "loss": {"policy": -step / 3},
            "throughput": 1234.5 + step, "run_name": "not a metric"}


def _assert_served(url: str, run: str, expected: dict[str, float], rel: float = 0.0) -> None:
    for key, value in expected.items():
        found = key_samples(url, key, run)
        assert len(found) == 1, (key, found)
        (got,) = found.values()
        assert got == pytest.approx(value, rel=rel, abs=0.0), key


# Each wait is bounded and names what it waited for; how soon a value is served (about a poll, 0.5 s, on an idle
# machine) is a figure, printed here (pytest -s) and measured by benchmarks/bench_watch_scale.py, never asserted:
# a loaded machine stretches it.
BOUND = 30.0


def test_summarywriter_and_jsonl_values_reach_the_endpoint(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    w = ThreadedWatcher([str(root)])  # the default poll (0.5 s) and rescan (1 s)
    try:
        writer = torch_tb.SummaryWriter(str(root / "exp1"))
        latencies = []
        for step in range(6):
            for key, value in _tb_values(step).items():
                writer.add_scalar(key, value, step)
            writer.flush()  # what the framework has written (SummaryWriter buffers up to flush_secs otherwise)
            t0 = time.monotonic()
            if step == 0:
                url = w.url("exp1", timeout=BOUND)
            wait_for(lambda s=step, u=url: served(u, "rl_step", run="exp1") == s, BOUND, f"step {step}")
            latencies.append(time.monotonic() - t0)
        _assert_served(url, "exp1", _tb_values(5), rel=1e-7)  # float32 in the file: equal as float32
        assert served(url, "target_info", rl_framework="verl") == 1.0  # inferred from the keys

        # a restarted training writes a new event file in the same directory: picked up
        writer.close()
        writer2 = torch_tb.SummaryWriter(str(root / "exp1"), filename_suffix=".restart")
        for key, value in _tb_values(6).items():
            writer2.add_scalar(key, value, 6)
        writer2.flush()
        t0 = time.monotonic()
        wait_for(lambda: served(url, "rl_step", run="exp1") == 6, BOUND, "the new event file")
        latencies.append(time.monotonic() - t0)
        _assert_served(url, "exp1", _tb_values(6), rel=1e-7)
        writer2.close()

        # a new run directory, rank in its path, a JSONL writer: every value exact
        jpath = root / "exp2" / "rank_1" / "metrics.jsonl"
        jpath.parent.mkdir(parents=True)
        with open(jpath, "a") as f:
            for step in range(4):
                f.write(json.dumps(_jsonl_values(step)) + "\n")
                f.flush()
                t0 = time.monotonic()
                if step == 0:
                    url2 = w.url("exp2", rank=1, timeout=BOUND)
                wait_for(lambda s=step, u=url2: served(u, "rl_step", run="exp2", rank="1") == s, BOUND,
                         f"line {step}")
                latencies.append(time.monotonic() - t0)
        _assert_served(url2, "exp2", {"reward/mean": 3 / 8, "reward/max": 3.1, "loss/policy": -1.0,
                                      "throughput": 1237.5})
        assert 'run_name' not in scrape(url2)
        print(f"\nserved after (s): median {sorted(latencies)[len(latencies) // 2]:.2f}, max {max(latencies):.2f}")
    finally:
        w.close()


def _watch_cli(root: Path, fsd: Path, state: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "watch", str(root), "--host", "127.0.0.1",
                             "--port", "0", "--file-sd", str(fsd), "--state", str(state), "--interval", "0.1",
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _urls(fsd: Path, run: str) -> list[str]:
    """The endpoints published in the file_sd directory (one per watcher: it serves every run), newest first (a
    killed watcher's file stays behind: SIGKILL leaves no time to remove it)."""
    urls = []
    for path in sorted(fsd.glob("rl_otel-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            (group,) = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        urls.append(f"http://{group['targets'][0]}/metrics")
    return urls


def _step_served(fsd: Path, run: str, step: int) -> str | None:
    for url in _urls(fsd, run):
        try:
            if served(url, "rl_step", run=run) == step:
                return url
        except OSError:
            continue
    return None


def _write_steps(root: Path, steps: range) -> None:
    run = root / "exp"
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "critic/score/mean": s / 4, "training/global_step": s,
                                "tokens/response_length_dist": [s, 10, 20, 30]}) + "\n")
    writer = torch_tb.SummaryWriter(str(run), filename_suffix=f".{steps.start}")
    for s in steps:
        writer.add_scalar("actor/pg_loss", s / 8, s)
    writer.close()


def _saved(state: Path, root: Path) -> bool:
    try:
        files = json.loads(state.read_text())["files"]
    except (OSError, ValueError):
        return False
    on_disk = {str(p): p.stat().st_size for p in (root / "exp").iterdir()}
    return all(files.get(p, [0])[0] == size for p, size in on_disk.items())


def _totals(url: str) -> tuple:
    """The run's histogram count and sum, counter and gauges, from one scrape."""
    text = scrape(url)

    def one(name: str, **labels: str) -> float | None:
        return next((v for key, v in samples(text, name).items() if {"run": "exp", **labels}.items() <= set(key)),
                    None)

    return (one("rl_tokens_response_length_dist_count"), one("rl_tokens_response_length_dist_sum"),
            one("rl_training_steps_total"), one("rl_critic_score", stat="mean"), one("rl_actor_pg_loss"))


def _expected(last: int) -> tuple:
    """Every value once, none lost, none twice: the histogram's count and sum count each value of every step."""
    n = last + 1
    return 4 * n, sum(s + 60 for s in range(n)), last, last / 4, last / 8


def _check_totals(url: str, last: int) -> None:
    wait_for(lambda: _totals(url) == _expected(last), 10, f"the totals of steps 0-{last}")
    seen = _totals(url)
    assert seen == _expected(last), seen


def test_a_watcher_killed_with_sigkill_and_restarted_loses_and_duplicates_nothing(tmp_path):
    root, fsd, state = tmp_path / "runs", tmp_path / "sd", tmp_path / "state.json"
    _write_steps(root, range(10))
    first = _watch_cli(root, fsd, state, "--checkpoint-interval", "0.2")
    try:
        url = wait_for(lambda: _step_served(fsd, "exp", 9), 30, "steps 0-9 served")
        _check_totals(url, 9)
        wait_for(lambda: _saved(state, root), 10, "the state saved")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)

    _write_steps(root, range(10, 15))  # written while no watcher runs
    # the second watcher saves its state once, at its first poll, then never again (a huge interval): what it
    # reads after that is read again by the third, which must neither lose nor count any of it twice
    second = _watch_cli(root, fsd, state, "--checkpoint-interval", "3600")
    try:
        url = wait_for(lambda: _step_served(fsd, "exp", 14), 30, "steps 10-14 served after the restart")
        restored = _totals(url)  # right after the restart: nothing went back
        assert all(a >= b for a, b in zip(restored, _expected(9), strict=True)), restored
        _check_totals(url, 14)
        _write_steps(root, range(15, 20))
        wait_for(lambda: _step_served(fsd, "exp", 19), 10, "steps 15-19")
        _check_totals(url, 19)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(30)

    left_behind = set(fsd.iterdir())
    third = _watch_cli(root, fsd, state, "--checkpoint-interval", "0.2")
    try:
        url = wait_for(lambda: _step_served(fsd, "exp", 19), 30, "the third watcher")
        _check_totals(url, 19)
        wait_for(lambda: _saved(state, root), 10, "the state saved")
        _check_totals(url, 19)
    finally:
        third.send_signal(signal.SIGTERM)  # a clean stop: state saved, endpoint and targets file gone
        assert third.wait(30) == 0, third.stderr.read().decode() if third.stderr else ""
    assert set(fsd.iterdir()) <= left_behind  # its own targets file removed


def test_after_a_sigkill_and_a_restart_no_series_goes_back(tmp_path):
    """The state file lags the kill (saved once, at the first poll, then never): the restarted watcher holds the
    older values it saved, and reads the rest again. From its first scrape on it never serves an older step or
    value than the killed one served: the run is served once its files are read up to what they held at the
    restart (before: ``rl_step`` 5 where 6 had been served, and the gauges their step-5 values)."""
    root, fsd, state = tmp_path / "runs", tmp_path / "sd", tmp_path / "state.json"
    _write_steps(root, range(5))
    first = _watch_cli(root, fsd, state, "--checkpoint-interval", "3600")
    try:
        wait_for(lambda: _step_served(fsd, "exp", 4), 30, "steps 0-4 served")
        wait_for(lambda: _saved(state, root), 10, "the state saved at the first poll")
        _write_steps(root, range(5, 10))  # read and served, never saved
        url = wait_for(lambda: _step_served(fsd, "exp", 9), 30, "steps 5-9 served")
        _check_totals(url, 9)  # the event file of steps 5-9 read too
        before = _totals(url)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    for path in fsd.iterdir():
        path.unlink()  # the killed watcher's target: the next one publishes its own
    second = _watch_cli(root, fsd, state, "--checkpoint-interval", "3600")
    try:
        url = wait_for(lambda: (_urls(fsd, "exp") or [None])[0], 30, "the restarted watcher's endpoint")
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not seen or seen[-1] != before):
            try:
                totals = _totals(url)
            except OSError:
                continue
            if totals[-1] is not None:  # the run is served: never less than before the kill
                seen.append(totals)
        assert seen and seen[-1] == before, seen[-3:]
        assert all(a is not None and a >= b for totals in seen for a, b in zip(totals, before, strict=True)), seen
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


@pytest.mark.prometheus
def test_a_backfilled_run_is_queryable_at_its_original_timestamps(tmp_path):
    from rl_otel.cli import main

    promtool = require_binary("promtool")
    root = tmp_path / "tb"
    start = round(time.time()) - 1800  # half an hour ago: inside Prometheus' retention
    writer = torch_tb.SummaryWriter(str(root / "exp1"))
    for step in range(20):
        for key, value in _tb_values(step).items():
            writer.add_scalar(key, value, step, walltime=start + 10 * step)
    writer.close()
    jpath = root / "exp2" / "metrics.jsonl"
    jpath.parent.mkdir(parents=True)
    jpath.write_text("".join(json.dumps({**_jsonl_values(s), "timestamp": start + 10 * s + 5}) + "\n"
                             for s in range(20)))
    out = tmp_path / "out.om"
    assert main(["backfill", str(root), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.endswith("# EOF\n")

    # names, labels and headers are what the live endpoint serves for the same keys
    w = ThreadedWatcher([str(root)])
    try:
        live = {run: scrape(w.url(run), OPENMETRICS) for run in ("exp1", "exp2")}
        for run in live:
            wait_for(lambda r=run: served(w.url(r), "rl_step", run=r) == 19, 10, "the live run")
            live[run] = scrape(w.url(run), OPENMETRICS)
    finally:
        w.close()
    live_lines = [line for page in live.values() for line in page.splitlines()]
    headers = {line for line in live_lines if line.startswith("#")}
    live_series = {line.rsplit(" ", 1)[0] for line in live_lines if not line.startswith("#")}
    written = set()
    for line in text.splitlines():
        if line.startswith("#"):
            assert line in headers or line == "# EOF", line  # HELP/TYPE/UNIT as served
        else:
            written.add(line.rsplit(" ", 2)[0])  # name{labels} without the value and timestamp
    assert written <= live_series, written - live_series
    assert len(written) == 2 * 2 + len(TB_KEYS) + 4  # rl_step and its timestamp per run, exp1's keys, exp2's four

    data = tmp_path / "data"
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(out), str(data)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prom = PrometheusServer(tmp_path, targets=[])
    try:
        for step in (0, 7, 19):
            for key, value in _tb_values(step).items():
                from rl_otel.catalog import default_catalog

                res = default_catalog().resolve(key)
                selector = ",".join(['run="exp1"', *(f'{k}="{v}"' for k, v in res.labels)])
                got = prom.api("query", {"query": f"{res.spec.prometheus_name}{{{selector}}}",
                                         "time": str(start + 10 * step)})["result"]
                assert len(got) == 1 and float(got[0]["value"][1]) == pytest.approx(value, rel=1e-7), (key, got)
            got = prom.api("query", {"query": 'rl_reward_mean{run="exp2"}', "time": str(start + 10 * step + 5)})
            assert float(got["result"][0]["value"][1]) == step / 8
        # the value at a time between two steps is the earlier step's (its original timestamp, not the load time)
        got = prom.api("query", {"query": 'rl_step{run="exp1"}', "time": str(start + 10 * 7 + 3)})
        assert float(got["result"][0]["value"][1]) == 7
    finally:
        prom.close()
