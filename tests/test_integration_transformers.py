"""The TRL / transformers integration (``RLOtelCallback``) in real trainers: TRL's GRPOTrainer on a tiny model
built here (no network), transformers' Trainer, and two ranks as torchrun starts them."""

from __future__ import annotations

import gc
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_otel import default_catalog
from tests._child import finish_ranks
from tests._readers import tensorboard_scalars
from tests._waits import CHILD_ENV
from tests._waits import read_line as read_line_within
from tests.promtools import free_port, free_port_pair, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def series(key: str, run: str, rank: int = 0) -> tuple[str, frozenset]:
    """The sample name and labels a logged key is served as."""
    res = default_catalog().resolve(key)
    return res.spec.prometheus_name, frozenset({("run", run), ("role", "trainer"), ("rank", str(rank)), *res.labels})


def served(text: str, key: str, run: str) -> float | None:
    name, labels = series(key, run)
    return samples(text, name).get(labels)


# -- a tiny causal LM and its tokenizer, built locally (as /work/notes/trl_run_harness.py does) -----------------

WORDS = [f"w{i}" for i in range(40)]


def tiny_model(path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                               bos_token="<bos>", unk_token="<unk>")
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                      bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), tok


def prompts(n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [" ".join(WORDS[(i + 7 * j) % len(WORDS)] for j in range(3))
                                         for i in range(n)]})


@pytest.fixture
def trl(monkeypatch):
    """TRL, imported with no network and no telemetry ping (TRL's trainers send one from rank 0 unless CI is set)."""
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"), ("HF_DATASETS_OFFLINE", "1"),
                        ("TRANSFORMERS_OFFLINE", "1"), ("CI", os.environ.get("CI", "1")), ("WANDB_MODE", "disabled"),
                        ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(name, value)
    pytest.importorskip("datasets")
    return pytest.importorskip("trl")


class Probe(transformers.TrainerCallback):
    """Runs after RLOtelCallback in the same on_log: scrapes the endpoint as each log dict lands."""

    def __init__(self, callback) -> None:
        self.callback = callback
        self.seen: list[tuple[int, dict, str]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append((state.global_step, dict(logs or {}), scrape(self.callback.telemetry.metrics_url)))


def test_grpo_train_then_evaluate_every_logged_key_is_served(trl, tmp_path):
    from rl_otel.integrations.transformers import RLOtelCallback

    model, tok = tiny_model(tmp_path / "tiny")
    calls = {"flaky": 0}

    def length_reward(completions, **kwargs):
        return [len(c.split()) / 8.0 for c in completions]

    def flaky_reward(completions, **kwargs):  # scores the first batch, then None for every sample (-> TRL logs None)
        calls["flaky"] += 1
        return [0.25] * len(completions) if calls["flaky"] == 1 else [None] * len(completions)

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), run_name="grpo-run", max_steps=2, logging_steps=1,
                          per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=2,
                          max_completion_length=4, learning_rate=1e-3, report_to="none", save_strategy="no",
                          use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    callback = RLOtelCallback(trackers={"tensorboard": {"log_dir": str(tmp_path / "tb")}}, **LOCAL)
    probe = Probe(callback)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[length_reward, flaky_reward], args=args,
                              train_dataset=prompts(8), eval_dataset=prompts(4), processing_class=tok,
                              callbacks=[callback, probe])
    trainer.train()
    tel = callback.telemetry
    assert tel is not None, "the endpoint outlives train()"
    after_train = scrape(tel.metrics_url)
    summary = probe.seen[-1][1]
    assert "train_runtime" in summary and "total_flos" in summary
    for key in summary:  # the final summary is still served after train() returned
        assert served(after_train, key, "grpo-run") == pytest.approx(summary[key]), key
    trainer.evaluate()
    assert callback.telemetry is tel

    # every key of every on_log - steps, summary, evaluate() - is on the endpoint right after it was logged
    steps, eval_logs = [s for s, logs, _ in probe.seen], [logs for _, logs, _ in probe.seen if "eval_loss" in logs]
    assert steps == [1, 2, 2, 2] and len(eval_logs) == 1  # step 1, step 2, the summary, evaluate() at step 2
    assert any(k.startswith("eval_rewards/") for k in eval_logs[0])
    for _, logs, text in probe.seen:
        for key, logged in logs.items():
            if logged is not None:
                assert served(text, key, "grpo-run") == pytest.approx(logged), key

    # None (all samples unscored): the series that had a value at step 1 is gone at step 2, not left stale
    (_, logs1, text1), (_, logs2, text2) = probe.seen[:2]
    assert logs1["rewards/flaky_reward/mean"] == 0.25 and served(text1, "rewards/flaky_reward/mean", "grpo-run") == 0.25
    assert logs2["rewards/flaky_reward/mean"] is None and logs2["rewards/flaky_reward/std"] is None
    assert served(text2, "rewards/flaky_reward/mean", "grpo-run") is None
    assert served(text2, "rewards/flaky_reward/std", "grpo-run") is None
    final = scrape(tel.metrics_url)
    assert eval_logs[0]["eval_rewards/flaky_reward/mean"] is None
    assert served(final, "eval_rewards/flaky_reward/mean", "grpo-run") is None
    assert served(final, "eval_rewards/length_reward/mean", "grpo-run") == pytest.approx(
        eval_logs[0]["eval_rewards/length_reward/mean"])
    assert samples(final, "rl_step") == {frozenset({("run", "grpo-run"), ("role", "trainer"), ("rank", "0")}): 2.0}

    url = tel.metrics_url
    callback.close()
    callback.close()  # idempotent
    with pytest.raises(OSError):
        scrape(url)
    scalars = tensorboard_scalars(str(tmp_path / "tb"))
    assert [s for s, _ in scalars["loss"]] == [1, 2] and [s for s, _ in scalars["eval_loss"]] == [2]
    assert [s for s, _ in scalars["rewards/flaky_reward/mean"]] == [1]  # None is not mirrored either


def test_transformers_trainer_serves_past_train_and_evaluate(tmp_path):
    from rl_otel.integrations.transformers import RLOtelCallback

    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    torch.manual_seed(0)
    data = [{"x": torch.randn(2), "labels": torch.tensor(1.0)} for _ in range(32)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, logging_steps=1,
                                          per_device_train_batch_size=8, report_to=[], run_name="hf-run",
                                          save_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = RLOtelCallback(trackers={"tensorboard": {"log_dir": str(tmp_path / "tb")}}, **LOCAL)
    trainer = transformers.Trainer(model=Regressor(), args=args, train_dataset=data, eval_dataset=data[:8],
                                   callbacks=[callback])
    trainer.train()
    text = scrape(callback.telemetry.metrics_url)
    assert samples(text, "rl_step") == {frozenset({("run", "hf-run"), ("role", "trainer"), ("rank", "0")}): 4.0}
    assert samples(text, "rl_loss") and samples(text, "rl_train_runtime_seconds")
    assert [s for s, _ in tensorboard_scalars(str(tmp_path / "tb"))["loss"]] == [1, 2, 3, 4]  # flushed at train end
    metrics = trainer.evaluate()
    assert served(scrape(callback.telemetry.metrics_url), "eval_loss", "hf-run") == pytest.approx(metrics["eval_loss"])
    callback.close()


class Args:  # what the callback reads of TrainingArguments
    def __init__(self, run_name: str | None) -> None:
        self.run_name = run_name


def test_callback_lifetime_close_gc_handover_and_a_new_training(tmp_path):
    """The owned Telemetry outlives train(); it closes on close(), when the callback is collected, or when
    another callback of the process starts training; training again from step 0 starts a fresh one."""
    import rl_otel
    from rl_otel.integrations.transformers import RLOtelCallback

    state, control = transformers.TrainerState(), transformers.TrainerControl()
    first = RLOtelCallback(**LOCAL)
    first.on_log(Args("early"), state, control, logs={"eval_loss": 1.0})  # evaluate() before train() starts it
    tel = first.telemetry
    assert served(scrape(tel.metrics_url), "eval_loss", "early") == 1.0
    first.on_train_begin(Args("early"), state, control)
    assert first.telemetry is tel
    state.global_step = 3
    first.on_log(Args("early"), state, control, logs={"loss": 0.5})
    first.on_train_end(Args("early"), state, control)
    assert served(scrape(tel.metrics_url), "loss", "early") == 0.5  # still serving

    second = RLOtelCallback(**LOCAL)  # a new trainer's callback starts training: the ended one hands over
    second.on_train_begin(Args("second"), transformers.TrainerState(), control)
    with pytest.raises(OSError):
        scrape(tel.metrics_url)
    first.on_log(Args("early"), state, control, logs={"eval_loss": 2.0})  # after close: ignored, never raises
    assert first.telemetry is None

    owned = second.telemetry
    state2 = transformers.TrainerState()
    state2.global_step = 5
    second.on_log(Args("second"), state2, control, logs={"loss": 0.1})
    second.on_train_begin(Args("second"), transformers.TrainerState(), control)  # train() again from step 0
    assert second.telemetry is not owned and second.telemetry.step is None
    with pytest.raises(OSError):
        scrape(owned.metrics_url)

    url = second.telemetry.metrics_url
    del second
    gc.collect()  # the trainer (and its callbacks) deleted: the endpoint closes
    with pytest.raises(OSError):
        scrape(url)

    with rl_otel.init(run="mine", **LOCAL) as mine:  # a Telemetry passed in is never closed by the callback
        third = RLOtelCallback(telemetry=mine)
        third.on_train_begin(Args(None), transformers.TrainerState(), control)
        third.on_train_end(Args(None), transformers.TrainerState(), control)
        RLOtelCallback(**LOCAL).on_train_begin(Args("x"), transformers.TrainerState(), control)
        third.close()
        assert third.telemetry is mine and scrape(mine.metrics_url)


# Two ranks as torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE), each driving the callback as a Trainer does,
# with the README's example options: one explicit port for all ranks.
RANK_WORKER = """
import json, sys
from transformers import TrainerControl, TrainerState
from rl_otel.integrations.transformers import RLOtelCallback

class Args:
    run_name = "trl-ranks"

base, tb = int(sys.argv[1]), sys.argv[2]
callback = RLOtelCallback(prometheus={"host": "127.0.0.1", "port": base}, trackers={"tensorboard": {"log_dir": tb}})
args, state, control = Args(), TrainerState(), TrainerControl()
callback.on_train_begin(args, state, control)
tel = callback.telemetry
rank = tel.config.rank
for step in (1, 2):
    state.global_step = step
    callback.on_log(args, state, control, logs={"loss": 10.0 * rank + step, "epoch": step / 2})
callback.on_log(args, state, control, logs={"train_runtime": 1.5, "train_loss": 10.0 * rank + 1.5})
callback.on_train_end(args, state, control)
callback.on_log(args, state, control, logs={"eval_loss": 10.0 * rank + 0.5})  # trainer.evaluate()
print(json.dumps({"url": tel.metrics_url, "trackers": list(tel.trackers), "rank": rank}), flush=True)
sys.stdin.readline()
# exits without close(): the exit hook flushes rank 0's TensorBoard
"""



def test_two_ranks_each_serve_base_plus_local_rank_and_rank0_alone_mirrors(tmp_path):
    base, tb = free_port_pair(), tmp_path / "tb"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_WORKER, str(base), str(tb)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        # a rank that ended first (e.g. a PortInUseError) or hangs fails with its stderr and stack
        lines = [read_line_within(p, f"rank {rank}'s endpoint") for rank, p in enumerate(procs)]
        ready = [json.loads(line) for line in lines]
        assert [r["rank"] for r in ready] == [0, 1]
        assert [r["url"] for r in ready] == [f"http://127.0.0.1:{base + rank}/metrics" for rank in (0, 1)]
        assert [r["trackers"] for r in ready] == [["tensorboard"], []]  # rank 1: no tracker sink
        for rank, r in enumerate(ready):
            text = scrape(r["url"])
            assert samples(text, "rl_loss") == {
                frozenset({("run", "trl-ranks"), ("role", "trainer"), ("rank", str(rank))}): 10.0 * rank + 2}
            assert samples(text, "rl_eval_loss") == {
                frozenset({("run", "trl-ranks"), ("role", "trainer"), ("rank", str(rank))}): 10.0 * rank + 0.5}
    finally:
        outs = [p.communicate("\n", timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    assert tensorboard_scalars(str(tb))["loss"] == [(1, 1.0), (2, 2.0)]  # rank 0's, written at exit


# One rank of a launch whose TrainingArguments leave run_name None (transformers 5's default). Building them joins
# the launch's gloo group, as in a Trainer; rank 1 then waits for the test's word before it starts training. Each
# reports its run label and the second its training started in, then serves until its stdin closes.
UNNAMED_RANK = """
import json, sys, time
from transformers import TrainerControl, TrainerState, TrainingArguments
from rl_otel.integrations.transformers import RLOtelCallback

args = TrainingArguments(output_dir=sys.argv[1], report_to=[], use_cpu=True)
callback = RLOtelCallback(prometheus={"host": "127.0.0.1", "port": 0})
if args.process_index == 1:
    sys.stdin.readline()
started = int(time.time())
callback.on_train_begin(args, TrainerState(), TrainerControl())
callback.on_log(args, TrainerState(), TrainerControl(), logs={"loss": 1.0})
tel = callback.telemetry
print(json.dumps({"run_name": args.run_name, "run": tel.config.run, "url": tel.metrics_url, "started": started}),
      flush=True)
sys.stdin.readline()
"""


def read_line(proc: subprocess.Popen, timeout: float = 120) -> str:
    """The child's next stdout line, or '' when it prints none within ``timeout`` (it hung or died)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def test_ranks_without_a_run_name_share_one_run_label_though_started_seconds_apart(tmp_path):
    """Rank 1 starts training in a later second than rank 0 (a per-rank timestamp would differ): both derive one
    label from what the launch shares (the output directory's name, the launch's identity)."""
    launch = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port_pair()),
              "TORCHELASTIC_RUN_ID": "none", "CUDA_VISIBLE_DEVICES": ""}
    procs = []
    for rank in (0, 1):
        env = {**os.environ, **launch, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank)}
        env.pop("RL_OTEL_RUN", None)
        procs.append(subprocess.Popen([sys.executable, "-c", UNNAMED_RANK, str(tmp_path / "grpo-out")], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        first = read_line(procs[0])
        assert first, "rank 0 did not start"
        ready = [json.loads(first)]
        deadline = time.monotonic() + 30
        while int(time.time()) <= ready[0]["started"]:  # rank 1 starts training in a later second
            assert time.monotonic() < deadline
            time.sleep(0.05)
        procs[1].stdin.write("go\n")
        procs[1].stdin.flush()
        second = read_line(procs[1])
        assert second, "rank 1 did not start"
        ready.append(json.loads(second))
        assert ready[1]["started"] > ready[0]["started"]
        assert ready[0]["run_name"] is None and ready[0]["run"] == ready[1]["run"]
        assert ready[0]["run"].startswith("grpo-out")
        for rank, r in enumerate(ready):
            assert samples(scrape(r["url"]), "rl_loss") == {
                frozenset({("run", ready[0]["run"]), ("role", "trainer"), ("rank", str(rank))}): 1.0}
    finally:
        outs = finish_ranks(procs)
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]


# One rank as torchrun starts it, whose TrainingArguments leave run_name None: it reports the run label its callback
# derived and ends.
TORCHRUN_RANK = """
import json, sys
from transformers import TrainerControl, TrainerState, TrainingArguments
from rl_otel.integrations.transformers import RLOtelCallback

args = TrainingArguments(output_dir=sys.argv[1], report_to=[], use_cpu=True)
callback = RLOtelCallback(prometheus={"host": "127.0.0.1", "port": 0})
callback.on_train_begin(args, TrainerState(), TrainerControl())
print("RUN " + json.dumps({"rank": callback.telemetry.config.rank, "run": callback.telemetry.config.run}), flush=True)
callback.close()
"""


def test_two_torchrun_launches_on_one_port_and_directory_never_share_a_run(tmp_path):
    """The same command run twice (days apart in the issue): torchrun with one master port, one output directory,
    no run name. The ranks of each launch share a label; the two launches do not."""
    script, port = tmp_path / "rank.py", free_port()
    script.write_text(TORCHRUN_RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RL_OTEL_RUN", None)
    launches = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_addr", "127.0.0.1", "--master_port", str(port), str(script),
                               str(tmp_path / "grpo-out")], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the two ranks share torchrun's stdout: their lines may land run together, so each report is found alone
        reports = [json.loads(found) for found in re.findall(r"RUN (\{[^{}]*\})", proc.stdout)]
        assert sorted(r["rank"] for r in reports) == [0, 1], proc.stdout
        launches.append({r["run"] for r in reports})
    first, second = launches
    assert len(first) == len(second) == 1, launches  # one label per launch
    assert first != second, "two launches share a run label"
    assert all(run.startswith("grpo-out-") for run in first | second)
