"""Credentials carried inside a string, whatever the name of the option that holds it.

A URL can hold its credential itself: the userinfo (``postgres://user:pass@host/db``, ``https://ghp_x@github.com``),
a query parameter with a secret's name (``?token=...``, ``?X-Amz-Signature=...``), or the path of a webhook, whose
path is the secret (``https://hooks.slack.com/services/T0/B0/XXXX``, ``https://discord.com/api/webhooks/1/abc``). A
connection string holds it as a ``name=value;`` pair (``AccountKey=...``, ``Password=...``). :func:`mask` writes
``***`` over those parts and keeps the rest (scheme, host, the user of a user:password pair, the other pairs);
:func:`credentials` returns them, for scrubbing messages. A URL written percent-encoded (``https%3A%2F%2F...``, a
URL inside another's query) is judged decoded. A Telegram bot's URL holds its token in the path
(``/bot<id>:<token>/``), and some tokens say what they are by their prefix (Slack's ``xoxb-``, GitHub's ``ghp_``,
Hugging Face's ``hf_``, OpenAI's ``sk-``, AWS's ``AKIA``): those are redacted wherever they are, under any name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from urllib.parse import unquote

REDACTED = "***"

# scheme://[userinfo@]host[path][?query][#fragment]; the userinfo runs to the authority's last "@" (a password with an
# unescaped "@" stays whole)
_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?:(?P<userinfo>[^/\s?#]*)@)?(?P<host>[^/\s?#@]*)"
                  r"(?P<path>[^\s?#]*)(?P<query>\?[^\s#]*)?")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# a webhook's URL: a host or a path segment naming one (Slack hooks.slack.com, Discord /api/webhooks/, Teams
# *.webhook.office.com/webhookb2/, Mattermost and Gitea /hooks/)
_HOOK_WORDS = frozenset({"hooks", "hook", "webhook", "webhooks", "webhookb2"})
# query parameters and connection-string keys that carry a signature rather than a secret-named value (S3/GCS
# presigned URLs, Azure SAS tokens and SharedAccessSignature=)
_SIGNATURE_PARAMS = frozenset({"sig", "signature", "x-amz-signature", "x-goog-signature", "sharedaccesssignature"})
# tokens known by their shape: Slack (xoxb-, xoxp-, xapp-...), GitHub (ghp_, github_pat_...), GitLab (glpat-),
# Hugging Face (hf_), OpenAI/Anthropic (sk-...), AWS access key ids, a Telegram bot token (<bot id>:<35 chars>)
_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])(?:xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
                    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
                    r"|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|[0-9]{6,12}:[A-Za-z0-9_-]{30,})")
# a Telegram bot's path segment: /bot<id>:<token>
_BOT_SEGMENT = re.compile(r"/bot([0-9]+:[A-Za-z0-9_-]+)")
_ENCODED_URL = re.compile(r"%3A%2F%2F", re.IGNORECASE)
# one name=value pair of a connection string (ADO.NET, ODBC, Azure: "Server=h;User Id=u;Password=p;")
_PAIR = re.compile(r"(?:^|(?<=;))\s*(?P<name>[A-Za-z][\w .-]*?)\s*=(?P<value>[^;]*)")


def _is_webhook(host: str, path: str) -> bool:
    labels = host.lower().split(".")
    return bool(_HOOK_WORDS & set(labels)) or any(seg.lower() in _HOOK_WORDS for seg in path.split("/"))


def _secret_param(name: str, is_secret_name: Callable[[str], bool]) -> bool:
    return is_secret_name(name) or name.lower() in _SIGNATURE_PARAMS


def _spans(text: str, is_secret_name: Callable[[str], bool]) -> list[tuple[int, int]]:
    """The spans of ``text``'s credential parts, in order, none overlapping (a URL inside a connection string:
    ``Endpoint=sb://host/;SharedAccessKey=...``)."""
    found: list[tuple[int, int]] = []
    if "://" in text:
        # every URL, those inside another's query too (``?next=https://user:pass@host``)
        for scheme in _SCHEME.finditer(text):
            m = _URL.match(text, scheme.start())
            if m is None:
                continue
            found += _url_parts(m, is_secret_name)
            found += [(m.start("path") + b.start(1), m.start("path") + b.end(1))
                      for b in _BOT_SEGMENT.finditer(m.group("path"))]
    found += [m.span() for m in _TOKEN.finditer(text)]
    if ";" in text and "=" in text:
        found += [(m.start("value"), m.end("value")) for m in _PAIR.finditer(text)
                  if m.group("value").strip() and _secret_param(m.group("name").strip(), is_secret_name)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _url_parts(m: re.Match[str], is_secret_name: Callable[[str], bool]) -> Iterator[tuple[int, int]]:
    """The spans of a URL's credential parts in the matched text."""
    if m.group("userinfo"):
        user, sep, _password = m.group("userinfo").partition(":")
        start = m.start("userinfo") + (len(user) + 1 if sep else 0)  # user:*** keeps the user; a lone token goes
        if m.end("userinfo") > start:
            yield start, m.end("userinfo")
    path = m.group("path")
    if path and path != "/" and _is_webhook(m.group("host"), path):
        yield m.start("path") + 1, m.end("path")
    if m.group("query"):
        pos = m.start("query") + 1
        for pair in m.group("query")[1:].split("&"):
            name, sep, value = pair.partition("=")
            if sep and value and _secret_param(name, is_secret_name):
                yield pos + len(name) + 1, pos + len(pair)
            pos += len(pair) + 1


def mask(text: str, is_secret_name: Callable[[str], bool]) -> str:
    """``text`` with its credential parts written ``***`` (``is_secret_name`` judges query parameter and pair
    names)."""
    decoded = _decoded(text)
    if decoded is not None and _spans(decoded, is_secret_name):
        text = decoded  # shown decoded, its credentials written over (they cannot be found in the encoded form)
    out, last = [], 0
    for start, end in _spans(text, is_secret_name):
        out += [text[last:start], REDACTED]
        last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def credentials(text: str, is_secret_name: Callable[[str], bool]) -> set[str]:
    """The credential parts of ``text`` (what :func:`mask` writes over); for a percent-encoded URL, both forms."""
    found = {text[start:end] for start, end in _spans(text, is_secret_name) if end > start}
    decoded = _decoded(text)
    if decoded is not None:
        for secret in {decoded[start:end] for start, end in _spans(decoded, is_secret_name) if end > start}:
            found |= {secret, *_encodings(secret)}
    return found


def _decoded(text: str) -> str | None:
    """``text`` percent-decoded, where it holds an encoded URL (``https%3A%2F%2F``), else None."""
    if not _ENCODED_URL.search(text):
        return None
    decoded = text
    for _ in range(3):  # a URL encoded twice (inside a query inside a query)
        decoded = unquote(decoded)
        if not _ENCODED_URL.search(decoded):
            break
    return decoded


def _encodings(secret: str) -> set[str]:
    """The forms a secret takes percent-encoded (``/`` encoded or not, upper or lower case hex)."""
    from urllib.parse import quote

    forms = {quote(secret, safe=""), quote(secret, safe="/"), quote(quote(secret, safe=""), safe="")}
    return forms | {f.replace("%2F", "%2f").replace("%3A", "%3a") for f in forms}
