"""Credentials carried inside a string, whatever the name of the option that holds it.

A URL can hold its credential itself: the userinfo (``postgres://user:pass@host/db``, ``https://ghp_x@github.com``),
a query parameter with a secret's name (``?token=...``, ``?X-Amz-Signature=...``), or the path of a webhook, whose
path is the secret (``https://hooks.slack.com/services/T0/B0/XXXX``, ``https://discord.com/api/webhooks/1/abc``). A
connection string holds it as a ``name=value;`` pair (``AccountKey=...``, ``Password=...``). :func:`mask` writes
``***`` over those parts and keeps the rest (scheme, host, the user of a user:password pair, the other pairs);
:func:`credentials` returns them, for scrubbing messages. Text with neither ``://`` nor ``;`` is returned at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

REDACTED = "***"

# scheme://[userinfo@]host[path][?query][#fragment]; the userinfo runs to the authority's last "@" (a password with an
# unescaped "@" stays whole)
_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?:(?P<userinfo>[^/\s?#]*)@)?(?P<host>[^/\s?#@]*)"
                  r"(?P<path>[^\s?#]*)(?P<query>\?[^\s#]*)?")
# a webhook's URL: a host or a path segment naming one (Slack hooks.slack.com, Discord /api/webhooks/, Teams
# *.webhook.office.com/webhookb2/, Mattermost and Gitea /hooks/)
_HOOK_WORDS = frozenset({"hooks", "hook", "webhook", "webhooks", "webhookb2"})
# query parameters and connection-string keys that carry a signature rather than a secret-named value (S3/GCS
# presigned URLs, Azure SAS tokens and SharedAccessSignature=)
_SIGNATURE_PARAMS = frozenset({"sig", "signature", "x-amz-signature", "x-goog-signature", "sharedaccesssignature"})
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
        for m in _URL.finditer(text):
            found += _url_parts(m, is_secret_name)
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
    out, last = [], 0
    for start, end in _spans(text, is_secret_name):
        out += [text[last:start], REDACTED]
        last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def credentials(text: str, is_secret_name: Callable[[str], bool]) -> set[str]:
    """The credential parts of ``text`` (what :func:`mask` writes over)."""
    return {text[start:end] for start, end in _spans(text, is_secret_name) if end > start}
