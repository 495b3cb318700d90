"""Tracker configuration: ROLL's ``track_with``/``tracker_kwargs``, a list of trackers keyed by name, YAML files.

Accepted forms (all normalize to a tuple of :class:`TrackerSpec`)::

    track_with="wandb", tracker_kwargs={"project": "p", "api_key": "..."}            # ROLL: one tracker, flat
    track_with=["tensorboard", "wandb"], tracker_kwargs={"wandb": {"project": "p"}}  # kwargs keyed by name
    trackers={"tensorboard": {"log_dir": "tb"}, "stdout": {}}                        # a mapping keyed by name
    trackers=["stdout", {"name": "tensorboard", "log_dir": "tb"}]                   # a list

Secrets (``api_key``, ``login_kwargs``, ...) are kept for the sink that needs them and redacted everywhere else:
``TrackerSpec``'s repr, :func:`redact`, and :func:`secret_values` for scrubbing error messages. A secret is known by
its option's name (``hf_token``, ``slackWebhookUrl``, ``sentry_dsn``, ``connection_string``), and a URL or a
connection string under any name has its credential parts redacted (userinfo, secret query parameters, a webhook's
path, ``AccountKey=``/``Password=`` pairs: ``embedded_secrets``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_otel._internal.trackers import embedded_secrets
from rl_otel._internal.trackers.sinks import registered_sinks
from rl_otel.errors import ConfigurationError

SECRET_KEYS = frozenset({"api_key", "login_kwargs", "key", "token", "password", "secret", "auth", "access_token",
                         "api_token", "credentials"})
# A name is secret by its words, split at "_", "-", "." and at case changes (hf_token, hfToken, HF_TOKEN,
# openaiApiKey, x-api-key, githubPAT, wandb.auth): its last word (after a trailing "value"/"header"/... and
# digits) names a secret - whole words only, so tokenizer, max_tokens, num_tokens, token_budget stay.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_SECRET_LAST = frozenset({"token", "password", "passwd", "pwd", "passphrase", "secret", "auth", "authorization",
                          "credential", "credentials", "cookie", "pat", "apikey", "key"})
_QUALIFIERS = frozenset({"value", "header", "headers", "str", "string", "raw", "b64", "base64"})
# a "<word>_token" / "<word>_key" that names data, not a secret: eos_token, max_token, prompt_key (verl), sort_key
_NOT_SECRET_BEFORE = {
    "token": frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "eot", "stop", "special", "image",
                        "video", "audio", "start", "end", "max", "min", "num", "total", "per", "new", "first",
                        "last", "next"}),
    "key": frozenset({"prompt", "response", "image", "video", "audio", "reward", "fn", "label", "answer", "query",
                      "chosen", "rejected", "input", "output", "text", "message", "messages", "column", "field",
                      "sort", "metric", "data", "dataset", "cache", "group", "primary", "foreign", "dict", "lookup",
                      "partition", "sample", "target", "extra", "tools", "truth", "index", "sequence", "batch"}),
}
# a name of a value that is or holds its credential whole: a webhook URL (its path is the secret), a DSN (Sentry's
# key, a database's password), a connection string (Azure's AccountKey=, a database's Password=); the word may be
# followed by a URL word (slackWebhookUrl, SENTRY_DSN, discord_webhook_endpoint)
_CREDENTIAL_URLS = frozenset({"webhook", "webhooks", "dsn", "connstr"})
_URL_WORDS = frozenset({"url", "urls", "uri", "uris", "endpoint", "address", "link"})
_CONNECTION_STRING = (frozenset({"connection", "conn"}), frozenset({"string", "str"}))
REDACTED = embedded_secrets.REDACTED


def _is_secret(key: object) -> bool:
    if not isinstance(key, str):
        return False
    if key.lower() in SECRET_KEYS:
        return True
    words = [w.lower() for w in _WORDS.findall(key) if not w.isdigit()]
    if len(words) > 1 and words[-2] in _CONNECTION_STRING[0] and words[-1] in _CONNECTION_STRING[1]:
        return True
    stem = words[:-1] if len(words) > 1 and words[-1] in _URL_WORDS else words
    if stem and stem[-1] in _CREDENTIAL_URLS:
        return True
    if len(words) > 1 and words[-1] in _QUALIFIERS:
        words.pop()
    if not words or words[-1] not in _SECRET_LAST:
        return "_".join(words[-2:]) == "login_kwargs"
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    return before not in _NOT_SECRET_BEFORE.get(last, ())


def redact(value: Any) -> Any:
    """A copy of ``value`` with every secret-named entry (any depth) replaced by ``"***"``, and the credential parts
    of every URL elsewhere (``postgres://user:***@host``) too."""
    if isinstance(value, Mapping):
        return {k: REDACTED if _is_secret(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return embedded_secrets.mask(value, _is_secret)
    return value


def secret_values(value: Any, found: set[str] | None = None) -> set[str]:
    """Every string found under a secret-named entry (at any depth), and the credential parts of every URL
    elsewhere, for scrubbing messages."""
    found = set() if found is None else found
    if isinstance(value, Mapping):
        for k, v in value.items():
            if _is_secret(k):
                _strings(v, found)
            else:
                secret_values(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            secret_values(v, found)
    elif isinstance(value, str):
        found.update(embedded_secrets.credentials(value, _is_secret))
    return found


_SHORTEST_SECRET = 4  # characters: a shorter value ("--token=1") is no secret, and scrubbing it would garble a dump


def command_line_secrets(argv: Sequence[str]) -> set[str]:
    """The secrets on a command line, for scrubbing what shows it (py-spy's dump prints it whole): the value of a
    secret-named option (``--wandb-api-key=v``, ``--api_key v``, Hydra's ``trainer.wandb.api_key=v``) and the
    credential parts of every URL or connection string in it."""
    found: set[str] = set()
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if sep and _is_secret(name.lstrip("-")):
            found.add(value)
        elif not sep and arg.startswith("-") and _is_secret(arg.lstrip("-")) and i + 1 < len(argv):
            found.add(argv[i + 1])
        found.update(embedded_secrets.credentials(arg, _is_secret))
    return {s for s in found if len(s) >= _SHORTEST_SECRET}


def process_command_line() -> list[str]:
    """This process's command line as the OS shows it to others (``/proc/self/cmdline``: what py-spy prints),
    else the interpreter's ``sys.orig_argv``."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        import sys

        return list(getattr(sys, "orig_argv", sys.argv))


def _strings(value: Any, found: set[str]) -> None:
    if isinstance(value, str) and value:
        found.add(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            _strings(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, found)


def scrub(text: str, secrets: set[str] | frozenset[str]) -> str:
    for s in secrets:
        text = text.replace(s, REDACTED)
    return text


@dataclass(frozen=True)
class TrackerSpec:
    """One tracker to mirror to: a registered sink name and its kwargs (secrets included, never printed)."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"TrackerSpec(name={self.name!r}, kwargs={redact(dict(self.kwargs))!r})"

    def to_dict(self) -> dict[str, Any]:
        """The spec with secrets redacted (safe to print or upload)."""
        return {"name": self.name, "kwargs": redact(dict(self.kwargs))}


def _kwargs(where: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(f"{where} must be a dict with str keys, got {type(value).__name__}")
    return dict(value)


def _names(track_with: object) -> list[str]:
    if isinstance(track_with, str):
        names = [n.strip() for n in track_with.split(",") if n.strip()]
    elif isinstance(track_with, Sequence) and all(isinstance(n, str) for n in track_with):
        names = list(track_with)
    else:
        raise ConfigurationError(f"track_with must be a tracker name or a list of names, got {track_with!r}")
    return names


def normalize_trackers(track_with: object = None, tracker_kwargs: object = None,
                       trackers: object = None) -> tuple[TrackerSpec, ...]:
    """Check and normalize the tracker options into specs; raises ConfigurationError naming the bad value."""
    if trackers is not None and track_with is not None:
        raise ConfigurationError("give either track_with (with tracker_kwargs) or trackers, not both")
    if trackers is None and track_with is None:
        if tracker_kwargs:
            raise ConfigurationError("tracker_kwargs given without track_with")
        return ()
    specs: list[TrackerSpec] = []
    if track_with is not None:
        names = _names(track_with)
        kwargs = _kwargs("tracker_kwargs", tracker_kwargs)
        if len(names) == 1 and not (isinstance(track_with, (list, tuple)) and set(kwargs) <= set(names)
                                    and kwargs):
            specs = [TrackerSpec(names[0], kwargs)]  # ROLL: one tracker, flat kwargs
        else:
            stray = sorted(set(kwargs) - set(names))
            if stray:
                raise ConfigurationError(f"with several trackers, tracker_kwargs is keyed by tracker name; "
                                         f"{stray} are not in track_with={names}")
            specs = [TrackerSpec(n, _kwargs(f"tracker_kwargs[{n!r}]", kwargs.get(n))) for n in names]
    elif isinstance(trackers, Mapping):
        specs = [TrackerSpec(str(n), _kwargs(f"trackers[{n!r}]", kw)) for n, kw in trackers.items()]
    elif isinstance(trackers, (str, Sequence)):
        for item in [trackers] if isinstance(trackers, str) else trackers:
            if isinstance(item, str):
                specs.append(TrackerSpec(item, {}))
            elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
                kw = _kwargs("a trackers entry", item)
                specs.append(TrackerSpec(kw.pop("name"), kw))
            else:
                raise ConfigurationError(f"each trackers entry must be a name or a dict with a 'name', "
                                         f"got {redact(item)!r}")
    else:
        raise ConfigurationError(f"trackers must be a dict keyed by tracker name or a list, got {type(trackers)}")
    known = registered_sinks()
    seen: set[str] = set()
    for spec in specs:
        if spec.name not in known:
            raise ConfigurationError(f"unknown tracker {spec.name!r}; known: {list(known)} "
                                     "(rl_otel.register_sink adds one)")
        if spec.name in seen:
            raise ConfigurationError(f"tracker {spec.name!r} is given twice")
        seen.add(spec.name)
    return tuple(specs)
