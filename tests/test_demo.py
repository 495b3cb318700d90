"""rl-otel demo: a real PPO run that learns, serves every metric family, and mirrors to TensorBoard."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

torch = pytest.importorskip("torch")

import rl_otel  # noqa: E402
from rl_otel.demo import CountingTask, DemoConfig, run  # noqa: E402
from tests._readers import tensorboard_scalars  # noqa: E402
from tests._waits import CHILD_ENV, DEADLINE_S, finish, read_line  # noqa: E402
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
    environ = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "10", "--port", "0", "--host", "127.0.0.1",
         "--log-dir", str(tmp_path / "logs"), "--linger", "120", "--no-progress", *extra],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_lingering(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """Read the demo's stderr until it says it is serving after training; return the metrics URL and lines. Each
    line within read_line's bound: a demo that hangs or ends first fails with its stderr and stack."""
    lines = []
    while not lines or "more (Ctrl-C stops)" not in lines[-1]:
        lines.append(read_line(proc, f"the demo's next line after {lines[-3:]}", stream=proc.stderr).rstrip())
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
    "rl_last_step_timestamp_seconds", "rl_process_resident_memory_bytes", "rl_actor_grad_norm", "rl_critic_grad_norm",
)


def test_cli_serves_every_family_and_mirrors_to_tensorboard(tmp_path):
    proc = _start_demo(tmp_path)
    try:
        url, lines = _wait_until_lingering(proc)
        assert any(f"tensorboard --logdir {tmp_path / 'logs'}" in s for s in lines), lines
        text = scrape(url)
        assert promtool_check(text) == ""
        for family in FAMILIES:
            assert samples(text, family), f"{family} missing from the scrape"
        assert samples(text, "rl_step") == {frozenset({("run", "demo-0"), ("role", "trainer"), ("rank", "0")}): 9.0}
        eval_keys = {dict(k)["stat"] + "@" + dict(k)["k"] for k in samples(text, "rl_eval_metric")}
        assert {"mean@4", "std@4", "best@2", "worst@4"} <= eval_keys
        clusters = {dict(k)["cluster"] for k in samples(text, "rl_phase_last_duration_seconds")}
        assert clusters == {"actor_infer", "reference", "critic", "actor_train"}
    finally:
        proc.send_signal(signal.SIGINT)  # ends the linger; the demo closes its trackers and exits
        out, err = finish(proc, "the demo's end after a Ctrl-C in its linger")
    assert proc.returncode == 0, err
    # the stdout tracker: a short summary line per step (steps // 10 = 1: every step), never the whole dict
    summary = [line for line in out.splitlines() if line.startswith("step ")]
    assert [int(line.split()[1]) for line in summary] == list(range(10)), out
    # both KLs by name: to the reference (what a PPO/GRPO user watches drift) and old -> new policy
    assert all(len(line) < 100 and "reward=" in line and "kl_ref=" in line and "kl_old=" in line
               for line in summary), summary
    assert "metrics_tag" not in out
    (run_dir,) = (tmp_path / "logs").iterdir()  # TensorBoard names the run after its folder, never "."
    assert run_dir.name.startswith("demo-0-"), run_dir
    scalars = tensorboard_scalars(str(run_dir))
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


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: each line is what follows its last carriage return (a redrawn
    progress bar is one line), escape sequences removed."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", raw.replace("\r\n", "\n"))
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_the_terminal_shows_progress_and_urls_on_one_screen_and_the_cwd_stays_clean(tmp_path):
    """On a terminal (a pty), a whole run fits 24 rows of 100 columns: the URL, the TensorBoard command, the
    progress bar and a few summary lines. The run name comes from RL_OTEL_RUN (as docker-compose and the Kubernetes
    example set it), and TensorBoard's files go to the cache directory, not the current one."""
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache), "RL_OTEL_RUN": "from-env",
           "COLUMNS": "100", "LINES": "24"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "30", "--port", "0",
                             "--host", "127.0.0.1"], cwd=cwd, env={**env, **CHILD_ENV}, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower)
    os.close(follower)
    try:
        shown = _read_until_closed(leader, proc)
    finally:
        os.close(leader)
    assert proc.returncode == 0, shown
    screen = [line for line in _screen(shown) if line.strip()]
    # (the TensorBoard line holds a path as long as pytest's temporary directory: not counted for its width)
    assert len(screen) <= 20 and all(len(line) <= 100 for line in screen if str(cache) not in line), \
        "\n".join(screen)
    assert re.search(r"metrics:\s+http://127\.0\.0\.1:\d+/metrics", screen[1]), screen
    assert "run 'from-env'" in screen[0], screen
    assert any(line.startswith("[####") and "step 30/30" in line for line in screen), screen
    assert sum(line.startswith("step ") for line in screen) == 10, screen
    assert list(cwd.iterdir()) == []
    tb_line = next(line for line in screen if "tensorboard --logdir" in line)
    logdir = Path(tb_line.split("--logdir", 1)[1].strip())
    assert logdir.parent == cache / "rl_otel" / "demo", logdir  # this invocation's own directory
    (run_dir,) = logdir.iterdir()
    assert run_dir.name.startswith("from-env-") and any(run_dir.glob("events.out.tfevents.*")), run_dir
    # stdin was no terminal (a script, not a person): training over, the endpoint closed, the command ended
    assert not any("Ctrl-C" in line for line in screen), screen


def _read_until(fd: int, needle: str, deadline_s: float = 300.0) -> str:
    """What the terminal ``fd`` shows until ``needle`` appears (a bound for a wedged child, not a timing)."""
    text, end = "", time.monotonic() + deadline_s
    while needle not in text:
        left = end - time.monotonic()
        assert left > 0, f"{needle!r} never came:\n{text}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            assert data, f"the demo ended before {needle!r}:\n{text}"
            text += data.decode(errors="replace")
    return text


def _read_until_closed(fd: int, proc: subprocess.Popen, deadline_s: float = DEADLINE_S) -> str:
    """What the terminal ``fd`` shows until the demo closes it and ends. A demo still there at the deadline is
    asked for its threads' stacks (SIGABRT, CHILD_ENV) and the test fails with what the terminal showed."""
    text, end = "", time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            os.kill(proc.pid, signal.SIGABRT)
            time.sleep(2)  # its dump written to the terminal
            ready, _, _ = select.select([fd], [], [], 5)
            dump = os.read(fd, 1 << 20).decode(errors="replace") if ready else ""
            proc.kill()
            proc.wait(30)
            raise AssertionError(f"the demo still ran {deadline_s:.0f} s later; the terminal showed:\n{text}{dump}")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if data:
                text += data.decode(errors="replace")
                continue
        if ready or proc.poll() is not None:  # closed, or ended (a grandchild may hold the terminal open)
            proc.wait(30)
            return text


def _listening_addresses(pid: int, port: int) -> set[str]:
    import psutil

    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _path_without(directory: str) -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and os.path.realpath(d) != os.path.realpath(directory))


def test_in_a_terminal_it_serves_until_ctrl_c(tmp_path):
    """A person who runs the README's command (stdin and stderr a terminal): after training the endpoint stays up
    until Ctrl-C, with a line saying so, then the command ends cleanly."""
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "3", "--port", "0"],
                            cwd=tmp_path, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    try:
        screen = _screen(_read_until(leader, "press Ctrl-C to stop"))
        url = next(m.group(1) for s in screen if (m := re.search(r"metrics:\s+(http://\S+)", s)))
        assert f"still serving {url}" in [line for line in screen if line][-1], screen  # its last line so far
        assert samples(scrape(url), "rl_step") == {
            frozenset({("run", "demo-0"), ("role", "trainer"), ("rank", "0")}): 2.0}
        assert proc.poll() is None  # still serving after the scrape: nothing ends it but Ctrl-C
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        shown = _read_until_closed(leader, proc)
        assert proc.returncode == 0, shown
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


def test_it_listens_on_loopback_and_prints_a_tensorboard_command_that_runs(tmp_path):
    """Without --host the endpoint listens on 127.0.0.1 only, the address its banner prints; and the TensorBoard
    line runs as printed from a shell whose PATH lacks the venv's bin directory (a ``.venv`` not activated)."""
    path = _path_without(os.path.dirname(sys.executable))
    proc = subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "2", "--port", "0",
                             "--linger", "120", "--no-progress", "--log-dir", str(tmp_path / "logs")],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": path},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url, lines = _wait_until_lingering(proc)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert url.startswith("http://127.0.0.1:") and _listening_addresses(proc.pid, port) == {"127.0.0.1"}
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc, "the demo's end after a Ctrl-C in its linger")
    assert proc.returncode == 0
    command = next(line for line in lines if "--logdir" in line).split("tensorboard:", 1)[1].strip()
    assert command.endswith(f"--logdir {tmp_path / 'logs'}"), command
    assert shutil.which(shlex.split(command)[0], path=path) is not None, (command, path)
    version = subprocess.run([*shlex.split(command), "--version_tb"], env={**os.environ, "PATH": path},
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip(), version


def test_each_invocation_gets_its_own_tensorboard_directory_and_old_ones_are_pruned(tmp_path):
    """Earlier demos' runs no longer pile up in the TensorBoard a newcomer opens: the printed --logdir holds this
    invocation's runs only, and the cache keeps the newest KEPT_INVOCATIONS invocations."""
    from rl_otel.demo.cli import KEPT_INVOCATIONS

    parent = tmp_path / "cache" / "rl_otel" / "demo"
    old = []
    for i in range(KEPT_INVOCATIONS + 2):  # earlier invocations, oldest first
        old.append(parent / f"2024010{i}-000000")
        (old[-1] / "demo-0-x").mkdir(parents=True)
        os.utime(old[-1], (1_700_000_000 + i, 1_700_000_000 + i))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "2", "--port", "0",
                           "--no-progress", "--repeat", "2"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    hints = {line.split("--logdir", 1)[1].strip() for line in proc.stderr.splitlines() if "--logdir" in line}
    (logdir,) = hints  # both runs of one invocation share one directory
    assert Path(logdir).parent == parent
    assert sorted(p.name.rsplit("-", 2)[0] for p in Path(logdir).iterdir()) == ["demo-0-1", "demo-0-2"]
    assert sorted(parent.iterdir()) == sorted([*old[-(KEPT_INVOCATIONS - 1):], Path(logdir)])


def test_the_containers_ask_for_every_interface():
    """The demo binds loopback by default; a container's trainer is scraped from another container, so each
    container command asks for 0.0.0.0 itself."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    trainer = yaml.safe_load((ROOT / "deploy/kubernetes/trainer.yaml").read_text())
    (container,) = trainer["spec"]["template"]["spec"]["containers"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = json.loads(next(x for x in dockerfile.splitlines() if x.startswith("CMD "))[4:])
    for command in (compose["services"]["trainer"]["command"], container["command"], cmd):
        assert command[command.index("--host") + 1] == "0.0.0.0", command


def test_bad_linger_is_refused_naming_the_value(capsys):
    from rl_otel.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--linger", "-1"])
    assert exit_.value.code == 2
    assert "--linger must be 0 or more seconds" in capsys.readouterr().err


def test_a_taken_port_says_how_to_pick_a_free_one(capsys):
    from rl_otel.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--port", str(port), "--host", "127.0.0.1", "--no-progress", "--no-trackers"]) == 2
    err = capsys.readouterr().err
    assert f"port {port} is already in use" in err and "--port 0" in err and "prometheus=" not in err, err


def test_repeat_runs_back_to_back_under_numbered_names(tmp_path):
    """docker-compose's trainer: run after run (RL_OTEL_RUN-1, -2, ... with the next seed each), each closing its
    endpoint when done, so no finished run stays on the scrape to look stalled."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RL_OTEL_RUN": "loop"}
    proc = subprocess.run([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "2", "--port", "0", "--host",
                           "127.0.0.1", "--repeat", "2", "--no-trackers", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    headers = [line for line in proc.stderr.splitlines() if line.startswith("rl-otel demo: PPO")]
    assert headers == ["rl-otel demo: PPO on a counting task, run 'loop-1', 2 steps, seed 0",
                       "rl-otel demo: PPO on a counting task, run 'loop-2', 2 steps, seed 1"], proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_repeated_runs_each_keep_their_own_tensorboard_history(tmp_path):
    """``--repeat`` with ``--log-dir``: one named directory per run, so run 2 never overwrites run 1's steps."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "2", "--port", "0", "--host",
                           "127.0.0.1", "--repeat", "2", "--run", "rep", "--log-dir", str(tmp_path / "tb"),
                           "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "tb").iterdir())
    assert [r.name.rsplit("-", 2)[0] for r in runs] == ["rep-1", "rep-2"], runs
    for run_dir in runs:
        assert [s for s, _ in tensorboard_scalars(str(run_dir))["critic/score/mean"]] == [0, 1], run_dir


def test_log_before_init_says_what_to_do():
    with pytest.raises(AttributeError, match=r"call tel = rl_otel.init\(run=...\) once, then tel.log\(...\)"):
        rl_otel.log({"reward": 1.0})  # type: ignore[attr-defined]
    assert not hasattr(rl_otel, "phase") and not hasattr(rl_otel, "no_such_name")


def test_ctrl_c_while_training_ends_it_without_a_traceback(tmp_path):
    """A newcomer who stops the demo early sees one line, not a KeyboardInterrupt traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "200", "--port", "0",
                             "--no-trackers"], cwd=tmp_path, env={**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    while not lines or "step 1/200" not in lines[-1]:  # the progress line of the first step: training is under way
        lines.append(read_line(proc, "the demo's first step", stream=proc.stderr))
    proc.send_signal(signal.SIGINT)
    rest = finish(proc, "the demo's end after a Ctrl-C while training")[1]
    assert proc.returncode == 130, "".join(lines) + rest
    assert "Traceback" not in rest and rest.strip().endswith("rl-otel demo: stopped (Ctrl-C)"), rest


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_lost_in_a_finalizer_still_stops_the_demo():
    """Python runs a signal handler wherever the main thread is; inside a finalizer its KeyboardInterrupt is
    printed and dropped. The demo remembers the Ctrl-C and raises it again at its next step (and in its linger)."""
    from rl_otel.demo.cli import CtrlC

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # the handler runs in here: its KeyboardInterrupt goes nowhere
                pass

    with CtrlC() as ctrl_c:
        ctrl_c.check()  # nothing seen yet
        Finalized()  # dropped at once: the Ctrl-C lands in its __del__ and is lost there
        assert ctrl_c.seen
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_pruning_deletes_only_this_user_s_own_demo_invocations(tmp_path, monkeypatch):
    """A cache directory several users share: the demo deletes its own old invocations (this user's, named as it
    names them), never another user's runs nor anything else put there (before: every directory but the newest
    five)."""
    from rl_otel.demo.cli import prune_invocations

    made = []
    for i, name in enumerate(["20240101-000000", "20240102-000000", "20240103-000000-2", "someone-elses-notes"]):
        made.append(tmp_path / name)
        made[-1].mkdir()
        os.utime(made[-1], (1_700_000_000 + i, 1_700_000_000 + i))
    assert sorted(prune_invocations(tmp_path, keep=1)) == made[:2]  # the newest invocation and the other dir stay
    assert sorted(tmp_path.iterdir()) == made[2:]
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)  # the directories: another user's
    assert prune_invocations(tmp_path, keep=0) == [] and sorted(tmp_path.iterdir()) == made[2:]
