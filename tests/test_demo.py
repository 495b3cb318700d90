"""rl-otel demo: a real PPO run that learns, serves every metric family, and mirrors to TensorBoard."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import rl_otel  # noqa: E402
from rl_otel.demo import CountingTask, DemoConfig, run  # noqa: E402
from tests._readers import tensorboard_scalars  # noqa: E402
from tests.promtools import promtool_check, samples, scrape  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_reward_rises_with_a_fixed_seed():
    # 40 steps of 128 rollouts: a random policy scores ~0.1, the learned one > 0.5 (seeds 0, 1, 2 seen:
    # 0.09 -> 0.59, 0.10 -> 0.59, 0.09 -> 0.56, the last eval mean@4 0.66 each).
    result = run(DemoConfig(steps=40, seed=0, hidden=128), telemetry=False)
    first, last = _mean(result.scores[:10]), _mean(result.scores[-10:])
    assert first < 0.2, result.scores[:10]
    assert last > first + 0.25, (first, last)
    evals = [score for _, score in result.evals]
    assert evals[-1] > evals[0], result.evals
    assert len(result.step_seconds) == 40 and all(s > 0 for s in result.step_seconds)


def test_telemetry_does_not_change_the_math():
    cfg = DemoConfig(steps=4, seed=3)
    with rl_otel.init(run="same-math", prometheus=False) as tel:
        with_tel = run(cfg, telemetry=tel)
        assert tel.step == 3
    without = run(cfg, telemetry=False)
    assert with_tel.scores == without.scores


def test_task_scores_and_masks():
    task = CountingTask(vocab=5, response_len=3, num_prompts=4)
    prompts = torch.tensor([0, 3])
    right = task.targets(prompts)
    assert right.tolist() == [[1, 2, 3], [4, 1, 2]]
    responses = right.clone()
    responses[1, 1] = 0  # EOS after one right token
    assert task.response_mask(responses).tolist() == [[1, 1, 1], [1, 1, 0]]
    assert task.score(prompts, responses).tolist() == [1.0, pytest.approx(1 / 3)]


def test_bad_config_fails_naming_the_value():
    with pytest.raises(ValueError, match="steps"):
        DemoConfig(steps=0)


def _start_demo(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "10", "--port", "0", "--host", "127.0.0.1",
         "--log-dir", str(tmp_path / "logs"), "--linger", "120", "--no-progress", *extra],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_lingering(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """Read the demo's stderr until it says it is serving after training; return the metrics URL and lines."""
    lines = []
    for line in proc.stderr:
        lines.append(line.rstrip())
        if "more (Ctrl-C stops)" in line:
            break
    url = next((m.group(1) for s in lines if (m := re.search(r"metrics:\s+(\S+)", s))), None)
    assert url is not None and "more (Ctrl-C stops)" in lines[-1], "\n".join(lines)
    return url, lines


# One family per metric kind the demo exercises: phases (timing, CPU memory, histogram), PPO statistics (ROLL and
# TRL), distributions, rollout and eval aggregation (Trinity-RFT), throughput, liveness, live process memory.
FAMILIES = (
    "rl_phase_last_duration_seconds", "rl_phase_duration_seconds_bucket", "rl_cpu_memory_bytes",
    "rl_actor_approx_kl", "rl_actor_pg_loss", "rl_critic_score", "rl_critic_loss", "rl_ppo_policy_approx_kl",
    "rl_objective_kl", "rl_actor_importance_ratio_dist_bucket", "rl_env_reward_dist_bucket",
    "rl_tokens_response_length_dist_bucket", "rl_rollout_metric", "rl_eval_metric", "rl_eval_metric_across_tasks",
    "rl_system_samples_total", "rl_system_tokens_per_second", "rl_operation_duration_seconds", "rl_step",
    "rl_last_step_timestamp_seconds", "rl_process_resident_memory_bytes",
)


def test_cli_serves_every_family_and_mirrors_to_tensorboard(tmp_path):
    proc = _start_demo(tmp_path)
    try:
        url, lines = _wait_until_lingering(proc)
        assert any(f"tensorboard --logdir {tmp_path / 'logs' / 'tensorboard'}" in s for s in lines), lines
        text = scrape(url)
        assert promtool_check(text) == ""
        for family in FAMILIES:
            assert samples(text, family), f"{family} missing from the scrape"
        assert samples(text, "rl_step") == {frozenset({("run", "demo-0"), ("rank", "0")}): 9.0}
        eval_keys = {dict(k)["stat"] + "@" + dict(k)["k"] for k in samples(text, "rl_eval_metric")}
        assert {"mean@4", "std@4", "best@2", "worst@4"} <= eval_keys
        clusters = {dict(k)["cluster"] for k in samples(text, "rl_phase_last_duration_seconds")}
        assert clusters == {"actor_infer", "reference", "critic", "actor_train"}
    finally:
        proc.send_signal(signal.SIGINT)  # ends the linger; the demo closes its trackers and exits
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("metrics_tag: ") == 10  # the stdout tracker: one line per step
    scalars = tensorboard_scalars(str(tmp_path / "logs" / "tensorboard"))
    assert [s for s, _ in scalars["critic/score/mean"]] == list(range(10))
    assert "time/reference/compute_log_probs/onload" in scalars
    assert "memory/cpu/reference/compute_log_probs/end/rss" in scalars
    assert "eval/counting/accuracy/mean@4" in scalars
    assert "rollout/reward/mean" in scalars


def test_bad_options_exit_2_with_the_reason(capsys):
    from rl_otel.cli import main

    assert main(["demo", "--steps", "0", "--no-progress"]) == 2
    assert "steps must be a positive int" in capsys.readouterr().err
    assert main(["demo", "--port", "70000", "--no-progress"]) == 2
    assert "port" in capsys.readouterr().err


def test_the_command_line_stays_light_without_the_demo():
    code = "import sys; from rl_otel.cli import _parser; _parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert out.strip() == "False"
