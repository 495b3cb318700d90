"""Secrets in tracker configs are recognised by the words of their names (hf_token, openai_api_key, db_password,
slackWebhookUrl, sentry_dsn, connection_string), not only by exact names, and inside URLs and connection strings
under any name (userinfo, secret query parameters, a webhook's path, AccountKey=): redacted in reprs, in what a
tracker uploads, and in error messages."""

from __future__ import annotations

import pathlib

import pytest

from rl_otel._internal.trackers.config import TrackerSpec, redact, secret_values

SECRETS = {"hf_token": "hf_SECRET1", "openai_api_key": "sk-SECRET2", "db_password": "SECRET3",
           "x-api-key": "SECRET4", "aws_secret_access_key": "SECRET5", "wandb.auth": "SECRET6",
           # camelCase, PascalCase, UPPER_CASE, kebab-case: the same words (before: all but the first reached WandB)
           "hfToken": "SECRET8", "dbPassword": "SECRET9", "openaiApiKey": "SECRET10", "wandbApiKey": "SECRET11",
           "githubPAT": "SECRET12", "HfToken": "SECRET13", "OPENAI_API_KEY": "SECRET14", "refresh-token": "SECRET15",
           "clientSecret": "SECRET16", "AuthorizationHeader": "SECRET17", "sessionCookie": "SECRET18",
           # values that are their credential whole: webhook URLs, DSNs, connection strings (issue 35)
           "slackWebhookUrl": "https://hooks.slack.com/services/T0/B0/SECRET19", "discord_webhook": "SECRET20",
           "SENTRY_DSN": "https://SECRET21@o1.ingest.sentry.io/2", "sentryDsn": "SECRET22",
           "connection_string": "SECRET23", "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=SECRET24",
           "dbConnStr": "SECRET25", "teams-webhook-uri": "SECRET26"}
PLAIN = {"lr": 1e-6, "tokenizer": "qwen", "max_tokens": 512, "log_dir": "tb", "monkey": "ok", "num_tokens": 7,
         "token_budget": 4096, "maxTokens": 256, "tokenizerPath": "qwen-tok", "eos_token": "</s>", "pad_token_id": 0,
         "prompt_key": "prompt", "reward_fn_key": "data_source", "patience": 3, "PATH": "/bin", "author": "me",
         "keyword": "kw", "max_token_len": 2048,
         # URLs and names near the secret ones that carry none
         "url": "http://localhost:3000/d/x?orgId=1&var-run=a", "otlp_endpoint": "http://collector:4318",
         "token_url": "https://auth.example.com/oauth/token", "project_url": "https://wandb.ai/me/p",
         "webhook_timeout": 5, "connection_timeout": 30, "num_connections": 4, "dsn_retries": 2,
         "ssh": "git@github.com:o/r.git", "notes": "lr=1e-6; warmup=10"}
# credentials inside a value, under a name that says nothing: (value, what is uploaded)
EMBEDDED = {
    "db": ("postgres://admin:SECRET31@db.internal:5432/runs", "postgres://admin:***@db.internal:5432/runs"),
    "repo": ("https://ghp_SECRET32@github.com/o/r.git", "https://***@github.com/o/r.git"),
    "artifact": ("https://b.s3.amazonaws.com/m.pt?X-Amz-Credential=SECRET33&X-Amz-Signature=SECRET34&v=2",
                 "https://b.s3.amazonaws.com/m.pt?X-Amz-Credential=***&X-Amz-Signature=***&v=2"),
    "callback": ("https://api.example.com/cb?api_key=SECRET35&run=7", "https://api.example.com/cb?api_key=***&run=7"),
    "alerts": ("https://discord.com/api/webhooks/1/SECRET36", "https://discord.com/***"),
    "storage": ("DefaultEndpointsProtocol=https;AccountName=acc;AccountKey=SECRET37;EndpointSuffix=core.windows.net",
                "DefaultEndpointsProtocol=https;AccountName=acc;AccountKey=***;EndpointSuffix=core.windows.net"),
    "bus": ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=SECRET38",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=***"),
    "sql": ("Server=h;User Id=u;Password=SECRET39;Database=d", "Server=h;User Id=u;Password=***;Database=d"),
}


def test_secret_names_are_recognised_by_their_words():
    config = {**SECRETS, **PLAIN, "nested": [{"hf_token": "hf_SECRET7"}]}
    redacted = redact(config)
    assert all(redacted[k] == "***" for k in SECRETS) and redacted["nested"] == [{"hf_token": "***"}]
    assert all(redacted[k] == v for k, v in PLAIN.items())  # whole words only: tokenizer, max_tokens stay
    assert secret_values(config) == {*SECRETS.values(), "hf_SECRET7"}
    text = repr(TrackerSpec("wandb", {"config": config}))
    assert not any(s in text for s in (*SECRETS.values(), "hf_SECRET7"))


def test_credentials_inside_urls_and_connection_strings_are_redacted_under_any_name():
    from rl_otel._internal.trackers.config import scrub

    config = {"nested": {"slackWebhookUrl": "https://hooks.slack.com/services/T0/B0/SECRET40"},
              **{k: v for k, (v, _) in EMBEDDED.items()}, "list": [EMBEDDED["db"][0]], **PLAIN}
    redacted = redact(config)
    assert redacted["nested"] == {"slackWebhookUrl": "***"}
    assert {k: redacted[k] for k in EMBEDDED} == {k: shown for k, (_, shown) in EMBEDDED.items()}
    assert redacted["list"] == [EMBEDDED["db"][1]]
    assert {k: redacted[k] for k in PLAIN} == PLAIN  # a URL without a credential is kept as it is
    found = secret_values(config)
    message = f"sink failed: {config!r}"
    assert "SECRET" not in scrub(message, found)  # an error message naming the config holds none of them
    assert {"SECRET31", "ghp_SECRET32", "SECRET33", "SECRET34", "SECRET35", "SECRET37", "SECRET38",
            "SECRET39"} <= found
    assert not any(v in found for v in ("admin", "db.internal", "acc", "Root", "2", "7"))  # only the credentials
    assert "SECRET" not in repr(TrackerSpec("wandb", {"config": config}))


def test_wandb_files_hold_none_of_the_secrets(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from rl_otel.sinks.wandb import WandbSink
    from tests._readers import wandb_config, wandb_history

    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    embedded = {k: v for k, (v, _) in EMBEDDED.items()}
    sink = WandbSink(run="r", project="p", dir=str(tmp_path), config={**SECRETS, **PLAIN, **embedded})
    sink.log({"actor/pg_loss": 0.5}, 0)
    sink.close()
    history = wandb_history(str(tmp_path))  # waits for the run's last record
    written = b"".join(p.read_bytes() for p in pathlib.Path(tmp_path).rglob("*") if p.is_file())
    assert not any(s.encode() in written for s in SECRETS.values())  # in no file of the run, log or cache
    assert b"SECRET3" not in written  # nor a credential inside a URL or a connection string (SECRET31..39)
    config = wandb_config(str(tmp_path))
    assert {k: config[k] for k in PLAIN} == PLAIN  # the harmless keys are uploaded as they are
    assert {k: config[k] for k in SECRETS} == dict.fromkeys(SECRETS, "***")
    assert {k: config[k] for k in EMBEDDED} == {k: shown for k, (_, shown) in EMBEDDED.items()}
    assert history[0]["actor/pg_loss"] == 0.5


def test_a_yaml_syntax_error_names_the_line_never_quotes_it(tmp_path):
    """Issue 41 item 14: PyYAML's message quotes the offending line; before, the api_key came with it."""
    from rl_otel._internal.runtime.options import load_config_file
    from rl_otel.errors import ConfigurationError

    config = tmp_path / "run.yaml"
    config.write_text("rl_otel:\n  run: r\n  tracker_kwargs:\n    api_key: wandb-SECRET40 : oops\n")
    with pytest.raises(ConfigurationError) as caught:
        load_config_file(config)
    message = str(caught.value)
    assert "SECRET40" not in message
    assert "is not valid YAML: mapping values are not allowed here (line 4, column" in message


# under ordinary option names: what the credential is says it is one (before: all three reached an error message)
_SHAPED = {
    "notify": ("https%3A%2F%2Fhooks.slack.com%2Fservices%2FT0%2FB0%2FSECRET41",),  # a percent-encoded webhook URL
    "alerts": ("https://api.telegram.org/botSECRET42/sendMessage".replace("SECRET42", "123456789:AAF-SECRET42x"),),
    "channel": ("xoxb-1234567890-SECRET43abc",),  # a Slack bot token
    "callback": ("https://example.com/cb?next=https%3A%2F%2Fuser%3ASECRET44%40db.internal%2Fx",),
}


def test_percent_encoded_urls_telegram_bot_urls_and_token_shapes_are_redacted_under_any_name():
    from rl_otel._internal.trackers.config import scrub

    config = {name: value for name, (value,) in _SHAPED.items()}
    redacted = redact(config)
    assert "SECRET" not in repr(redacted), redacted
    assert redacted["alerts"] == "https://api.telegram.org/bot***/sendMessage"
    assert redacted["channel"] == "***"
    found = secret_values(config)
    message = f"tracker failed: POST {config['notify']} returned 403; config={config!r}"
    assert "SECRET" not in scrub(message, found), scrub(message, found)
    assert "SECRET" not in repr(TrackerSpec("wandb", {"config": config}))
    # near misses stay: a short sk- word, a ratio written like a token, a plain encoded URL with no credential
    plain = {"mode": "sk-learn", "ratio": "3:4", "page": "https%3A%2F%2Fexample.com%2Fdocs"}
    assert redact(plain) == plain and secret_values(plain) == set()
