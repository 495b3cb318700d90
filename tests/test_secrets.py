"""Secrets in tracker configs are recognised by the words of their names (hf_token, openai_api_key, db_password),
not only by exact names: redacted in reprs, in what a tracker uploads, and in error messages."""

from __future__ import annotations

import pathlib

import pytest

from rl_otel._internal.trackers.config import TrackerSpec, redact, secret_values

SECRETS = {"hf_token": "hf_SECRET1", "openai_api_key": "sk-SECRET2", "db_password": "SECRET3",
           "x-api-key": "SECRET4", "aws_secret_access_key": "SECRET5", "wandb.auth": "SECRET6",
           # camelCase, PascalCase, UPPER_CASE, kebab-case: the same words (before: all but the first reached WandB)
           "hfToken": "SECRET8", "dbPassword": "SECRET9", "openaiApiKey": "SECRET10", "wandbApiKey": "SECRET11",
           "githubPAT": "SECRET12", "HfToken": "SECRET13", "OPENAI_API_KEY": "SECRET14", "refresh-token": "SECRET15",
           "clientSecret": "SECRET16", "AuthorizationHeader": "SECRET17", "sessionCookie": "SECRET18"}
PLAIN = {"lr": 1e-6, "tokenizer": "qwen", "max_tokens": 512, "log_dir": "tb", "monkey": "ok", "num_tokens": 7,
         "token_budget": 4096, "maxTokens": 256, "tokenizerPath": "qwen-tok", "eos_token": "</s>", "pad_token_id": 0,
         "prompt_key": "prompt", "reward_fn_key": "data_source", "patience": 3, "PATH": "/bin", "author": "me",
         "keyword": "kw", "max_token_len": 2048}


def test_secret_names_are_recognised_by_their_words():
    config = {**SECRETS, **PLAIN, "nested": [{"hf_token": "hf_SECRET7"}]}
    redacted = redact(config)
    assert all(redacted[k] == "***" for k in SECRETS) and redacted["nested"] == [{"hf_token": "***"}]
    assert all(redacted[k] == v for k, v in PLAIN.items())  # whole words only: tokenizer, max_tokens stay
    assert secret_values(config) == {*SECRETS.values(), "hf_SECRET7"}
    text = repr(TrackerSpec("wandb", {"config": config}))
    assert not any(s in text for s in (*SECRETS.values(), "hf_SECRET7"))


def test_wandb_files_hold_none_of_the_secrets(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from rl_otel.sinks.wandb import WandbSink
    from tests._readers import wandb_config, wandb_history

    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sink = WandbSink(run="r", project="p", dir=str(tmp_path), config={**SECRETS, **PLAIN})
    sink.log({"actor/pg_loss": 0.5}, 0)
    sink.close()
    history = wandb_history(str(tmp_path))  # waits for the run's last record
    written = b"".join(p.read_bytes() for p in pathlib.Path(tmp_path).rglob("*") if p.is_file())
    assert not any(s.encode() in written for s in SECRETS.values())  # in no file of the run, log or cache
    config = wandb_config(str(tmp_path))
    assert {k: config[k] for k in PLAIN} == PLAIN  # the harmless keys are uploaded as they are
    assert {k: config[k] for k in SECRETS} == dict.fromkeys(SECRETS, "***")
    assert history[0]["actor/pg_loss"] == 0.5
