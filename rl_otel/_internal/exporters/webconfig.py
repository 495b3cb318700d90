"""The Prometheus exporter-toolkit web-config file (TLS, mTLS, basic auth), read at init and again when it or a
file it names changes (the endpoint checks once a second, as exporter-toolkit re-reads it: a revoked password
stops working, a renewed certificate is served); a reload that would weaken security is refused
(:func:`weakenings`).

The same YAML file node_exporter takes with ``--web.config.file`` serves rl_otel's endpoint::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file's directory, as in the toolkit
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Python's ``ssl`` cannot request a client certificate without verifying it, so ``RequestClientCert`` and
``RequireAnyClientCert`` are refused with a ConfigurationError (a security setting is never silently weakened);
``cipher_suites`` takes the Go/IANA names of the TLS 1.2 suites and maps them to OpenSSL's. ``http2`` is accepted
and has no effect (the endpoint speaks HTTP/1.1, which every scraper supports).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_otel._internal.checks import read_yaml
from rl_otel.errors import ConfigurationError, install_hint

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                 "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# Go's crypto/tls names (the toolkit's) -> OpenSSL's, for the TLS 1.2 suites Go offers; TLS 1.3 suites are fixed.
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}
# The toolkit allows only these response headers in http_server_config.headers.
_HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
            "Content-Security-Policy")
_TLS_KEYS = {"cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca",
             "client_allowed_sans", "min_version", "max_version", "cipher_suites", "curve_preferences",
             "prefer_server_cipher_suites"}
# Compared against when the user is unknown, so an unknown user costs one bcrypt check like a known one
# (the toolkit does the same): the response time does not tell which user names exist.
_DUMMY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
# bcrypt holds the GIL for its whole check (~65 ms at cost 10): checks of credentials not seen before are rationed
UNCACHED_CHECKS_PER_S = 0.2
UNCACHED_BURST = 4
_DIGEST_KEY = os.urandom(32)  # per process: a cached digest is no offline-crackable hash of a password


class Verdict(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no (usable) Authorization header: nothing was checked
    DENIED = "denied"  # wrong user or password
    THROTTLED = "throttled"  # credentials not seen before while the bcrypt budget is spent: try again later


class TokenBucket:
    """``rate`` events per second on average, ``burst`` at once. Thread-safe."""

    def __init__(self, rate: float, burst: float) -> None:
        self._rate, self._burst = rate, burst
        self._tokens = burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


class BasicAuth:
    """Checks ``Authorization: Basic`` credentials against bcrypt hashes, with bounded caches of verdicts.

    bcrypt costs ~65 ms a check by design and holds the GIL meanwhile; Prometheus sends the same credentials
    every scrape, so verdicts are remembered under a keyed digest of ``(user, password, hash)`` (never a
    password): verified credentials in a cache of their own (``ok_size``) that wrong passwords cannot evict, wrong
    ones in another (``denied_size``). A check of credentials in neither takes a token of ``bucket``
    (``UNCACHED_CHECKS_PER_S``, ``UNCACHED_BURST`` at once); without one the verdict is ``THROTTLED`` and nothing
    is hashed, so a stream of guesses costs the training process at most that many bcrypt checks a second.
    A changed hash in a reloaded file changes the digest: a revoked password stops working at once. Thread-safe.
    """

    def __init__(self, users: Mapping[str, bytes], ok_size: int = 64, denied_size: int = 1024,
                 bucket: TokenBucket | None = None) -> None:
        self._users = dict(users)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._denied: OrderedDict[bytes, None] = OrderedDict()
        self._sizes = (ok_size, denied_size)
        self._bucket = bucket or TokenBucket(UNCACHED_CHECKS_PER_S, UNCACHED_BURST)
        self._lock = threading.Lock()

    def adopt(self, previous: BasicAuth) -> None:
        """Take over ``previous``'s caches and bcrypt budget (a reloaded file): digests name the hash they were
        checked against, so no verdict of a changed or removed user carries over."""
        with previous._lock:
            self._ok, self._denied, self._bucket = previous._ok.copy(), previous._denied.copy(), previous._bucket

    def verify(self, user: str, password: str) -> Verdict:
        import bcrypt

        found = self._users.get(user)
        known = found is not None
        hashed = found if found is not None else _DUMMY_HASH
        key = hashlib.blake2b(b"\0".join((user.encode(), password.encode(), hashed)), key=_DIGEST_KEY).digest()
        with self._lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return Verdict.OK
            if key in self._denied:
                self._denied.move_to_end(key)
                return Verdict.DENIED
        if not self._bucket.take():
            return Verdict.THROTTLED
        try:
            ok = bcrypt.checkpw(password.encode(), hashed) and known
        except ValueError:  # a password longer than bcrypt's 72 bytes
            ok = False
        cache, size = (self._ok, self._sizes[0]) if ok else (self._denied, self._sizes[1])
        with self._lock:
            cache[key] = None
            while len(cache) > size:
                cache.popitem(last=False)
        return Verdict.OK if ok else Verdict.DENIED

    def check(self, user: str, password: str) -> bool:
        """True if ``user:password`` is valid (False also when the check was throttled)."""
        return self.verify(user, password) is Verdict.OK

    def verdict(self, header: str | None) -> Verdict:
        """The verdict on ``header`` (the ``Authorization`` request header)."""
        import base64
        import binascii

        if not header or header[:6].lower() != "basic ":
            return Verdict.MISSING
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Verdict.DENIED
        return self.verify(user, password) if sep else Verdict.DENIED

    def authorized(self, header: str | None) -> bool:
        """True if ``header`` (the ``Authorization`` request header) carries valid credentials."""
        return self.verdict(header) is Verdict.OK


@dataclass(frozen=True)
class WebConfig:
    """A checked web-config file: the TLS context to serve with (None: plain HTTP), the credentials check
    (None: no auth), the response headers, and the client SANs allowed (empty: any verified client)."""

    path: str
    tls: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: tuple[tuple[str, str], ...] = ()
    allowed_sans: frozenset[str] = field(default_factory=frozenset)
    files: tuple[str, ...] = ()  # the file and those it names: a change of any is a reason to read it again

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def stamp(self) -> tuple:
        """What changes when one of :attr:`files` is written, replaced or removed."""
        out: list[tuple[int, ...] | None] = []
        for name in self.files:
            try:
                st = os.stat(name)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns))
        return tuple(out)

    def san_allowed(self, peer_cert: dict[str, Any] | None) -> bool:
        """The toolkit's ``client_allowed_sans``: a verified client must present one of these SANs."""
        if not self.allowed_sans:
            return True
        # UTF-8 bytes: compare_digest refuses str with non-ASCII characters (TypeError); a DirName SAN is a tuple
        sans = {value.encode() for _kind, value in (peer_cert or {}).get("subjectAltName", ())
                if isinstance(value, str)}
        return any(hmac.compare_digest(a, b.encode()) for a in sans for b in self.allowed_sans)


def weakenings(old: WebConfig, new: WebConfig) -> list[str]:
    """What reading ``new`` in place of ``old`` would switch off or loosen (empty: nothing). A file being written
    (empty, truncated) or a mistaken edit reads as a valid, weaker one; the endpoint refuses such a reload and keeps
    ``old``: loosening security takes a restart, as switching TLS on or off does."""
    out = []
    if old.auth is not None and new.auth is None:
        out.append("it has no basic_auth_users")
    if old.tls is not None and new.tls is not None:
        if _VERIFY_STRENGTH[new.tls.verify_mode] < _VERIFY_STRENGTH[old.tls.verify_mode]:
            out.append("its client_auth_type verifies fewer clients")
        if new.tls.minimum_version < old.tls.minimum_version:
            out.append(f"its min_version is {new.tls.minimum_version.name}, below {old.tls.minimum_version.name}")
        if old.allowed_sans and not new.allowed_sans:
            out.append("it has no client_allowed_sans")
    return out


_VERIFY_STRENGTH = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 2}


def _mapping(where: str, value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"web config: {where} must be a mapping, got {value!r}")
    return value


def _file(base: Path, where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"web config: {where} must be a file name, got {value!r}")
    path = base / os.path.expanduser(value)
    if not path.is_file():
        raise ConfigurationError(f"web config: {where} {str(path)!r} does not exist")
    return str(path)


def _tls_context(tls: Mapping[str, Any], base: Path) -> tuple[ssl.SSLContext, frozenset[str], tuple[str, ...]]:
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise ConfigurationError(f"web config: unknown tls_server_config option(s) {sorted(unknown)}")
    for inline in ("cert", "key", "client_ca"):
        if tls.get(inline):
            raise ConfigurationError(f"web config: inline tls_server_config.{inline} is not supported by rl_otel; "
                                     f"use {inline}_file")
    if tls.get("curve_preferences"):
        raise ConfigurationError("web config: tls_server_config.curve_preferences is not supported by rl_otel "
                                 "(Python's ssl picks the curves)")
    cert = _file(base, "tls_server_config.cert_file", tls.get("cert_file"))
    key = _file(base, "tls_server_config.key_file", tls.get("key_file"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigurationError(f"web config: cannot load cert_file {cert!r} / key_file {key!r}: {exc}") from exc
    for bound, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = tls.get(bound) or default
        if name not in _TLS_VERSIONS:
            raise ConfigurationError(f"web config: tls_server_config.{bound} must be one of {list(_TLS_VERSIONS)}, "
                                     f"got {name!r}")
        setattr(ctx, "minimum_version" if bound == "min_version" else "maximum_version", _TLS_VERSIONS[name])
    auth_type = tls.get("client_auth_type") or "NoClientCert"
    if auth_type in _UNSUPPORTED_CLIENT_AUTH:
        raise ConfigurationError(f"web config: client_auth_type {auth_type!r} (a client certificate taken without "
                                 "verification) is not supported by Python's ssl; use VerifyClientCertIfGiven or "
                                 "RequireAndVerifyClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise ConfigurationError(f"web config: client_auth_type must be one of "
                                 f"{list(_CLIENT_AUTH) + list(_UNSUPPORTED_CLIENT_AUTH)}, got {auth_type!r}")
    ca = tls.get("client_ca_file")
    if ca and auth_type == "NoClientCert":
        raise ConfigurationError("web config: client_ca_file is set but client_auth_type is NoClientCert; set "
                                 "client_auth_type (e.g. RequireAndVerifyClientCert)")
    ca_path = ""
    if auth_type != "NoClientCert":
        if not ca:
            raise ConfigurationError(f"web config: client_auth_type {auth_type!r} needs client_ca_file")
        ca_path = _file(base, "tls_server_config.client_ca_file", ca)
        try:
            ctx.load_verify_locations(cafile=ca_path)
        except ssl.SSLError as exc:
            raise ConfigurationError(f"web config: cannot load client_ca_file {ca_path!r}: {exc}") from exc
    files = (cert, key) if auth_type == "NoClientCert" else (cert, key, ca_path)
    ctx.verify_mode = _CLIENT_AUTH[auth_type]
    suites = tls.get("cipher_suites")
    if suites:
        if not isinstance(suites, list) or any(s not in _CIPHERS for s in suites):
            raise ConfigurationError(f"web config: cipher_suites must be a list of {sorted(_CIPHERS)}, got {suites!r}")
        ctx.set_ciphers(":".join(_CIPHERS[s] for s in suites))
    if tls.get("prefer_server_cipher_suites", True):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    sans = tls.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise ConfigurationError(f"web config: client_allowed_sans must be a list of names, got {sans!r}")
    if sans and auth_type == "NoClientCert":
        raise ConfigurationError("web config: client_allowed_sans needs a client_auth_type that verifies clients")
    return ctx, frozenset(sans), files


def _users(users: Mapping[str, Any]) -> dict[str, bytes]:
    checked = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigurationError(f"web config: basic_auth_users names must be non-empty str without ':', "
                                     f"got {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
            raise ConfigurationError(f"web config: basic_auth_users[{user!r}] must be a bcrypt hash ($2y$...); "
                                     "plain-text passwords are refused")
        checked[user] = hashed.encode()
    return checked


def load_web_config(path: str | os.PathLike) -> WebConfig:
    """Read and check an exporter-toolkit web-config file; raise ConfigurationError naming what is wrong."""
    file = Path(os.fspath(path)).expanduser()
    raw = read_yaml("prometheus web_config_file", file)
    doc = _mapping("the file", raw)
    unknown = set(doc) - {"tls_server_config", "http_server_config", "basic_auth_users"}
    if unknown:
        raise ConfigurationError(f"web config {str(file)!r}: unknown section(s) {sorted(unknown)}")
    base = file.parent
    tls_section = _mapping("tls_server_config", doc.get("tls_server_config"))
    tls, sans, files = _tls_context(tls_section, base) if tls_section else (None, frozenset(), ())
    http = _mapping("http_server_config", doc.get("http_server_config"))
    unknown_http = set(http) - {"http2", "headers"}
    if unknown_http:
        raise ConfigurationError(f"web config: unknown http_server_config option(s) {sorted(unknown_http)}")
    headers = _mapping("http_server_config.headers", http.get("headers"))
    bad = [h for h in headers if h not in _HEADERS]
    if bad:
        raise ConfigurationError(f"web config: http_server_config.headers may set only {list(_HEADERS)}, got {bad}")
    users = _users(_mapping("basic_auth_users", doc.get("basic_auth_users")))
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(f"web config basic_auth_users needs bcrypt: {install_hint('security')}") \
                from exc
    return WebConfig(path=str(file), tls=tls, auth=BasicAuth(users) if users else None,
                     headers=tuple((k, str(v)) for k, v in headers.items()), allowed_sans=sans,
                     files=(str(file), *files))
