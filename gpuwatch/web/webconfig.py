"""TLS, client certificates and basic auth for the HTTP server, from a `web-config.yml` in the exporter-toolkit format.

The file Prometheus users already write for node_exporter (`--web.config.file`) works here unchanged:

    tls_server_config:
      cert_file: server.crt            # relative paths are read beside the web-config file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hash: htpasswd -nBC 12 "" | tr -d ':\\n'

Every problem is a ConfigError naming the file and the key (exit 78). The TLS handshake runs in the connection's own
thread with a timeout, so a slow or broken client never blocks another scrape; a rotated certificate or key is loaded
at the first handshake after its files change (gpuwatch.web.tlsreload). Passwords are checked with bcrypt
(constant-time) one at a time, as exporter-toolkit does, so wrong passwords cost at most one core; only credentials
that passed are cached (under an HMAC of them), so failed ones can never evict the real scraper's, and the real
scraper's cached credentials never wait for a check. Each check takes one of its client address's budget before it
runs, and at most a few checks may wait (gpuwatch.web.authlimit: 429 at once beyond either). A hash whose cost would
make every check take seconds to hours is refused when the file is loaded. basic_auth_users and the headers are read
again when the file changes (LiveWebConfig), so a revoked password stops working at the next request.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import logging
import os
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from gpuwatch.config.settings import ConfigError
from gpuwatch.files.safefile import read_regular_file
from gpuwatch.files.tomlfile import MAX_TOML_BYTES
from gpuwatch.web.authlimit import MAX_PENDING_CHECKS, CheckQueue, FailureLimiter
from gpuwatch.web.tlsreload import TlsReloader

log = logging.getLogger(__name__)

Environ = dict[str, Any]
WsgiApp = Callable[..., Iterable[bytes]]
SocketWrapper = Callable[[socket.socket], socket.socket]

HANDSHAKE_TIMEOUT_SECONDS = 10.0
AUTH_CACHE_SIZE = 1024  # credentials that passed; a node has a handful of scrapers
# bcrypt cost: each step doubles the time. Cost 12 (htpasswd's recommendation) takes ~0.2 s on a current core, 14
# ~0.8 s, and 31 ~28 hours: one check at start-up or by `gpuwatch check` would hang it. 14 is the most that keeps the
# first scrape with new credentials well inside Prometheus' default 10 s scrape timeout.
MAX_BCRYPT_COST = 14
MIN_BCRYPT_COST = 4
REALM = "gpuwatch"
BUSY_REPORT_SECONDS = 60.0

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go accepts these two, but they take a certificate without verifying it; Python's ssl cannot, and an unverified
# certificate proves nothing, so the file is refused with the nearest verified type named.
UNVERIFIED_CLIENT_AUTH = {
    "RequestClientCert": "VerifyClientCertIfGiven",
    "RequireAnyClientCert": "RequireAndVerifyClientCert",
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names for the TLS 1.2 suites it supports, and OpenSSL's names for them.
GO_CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3 suites are not configurable (in Go either): accepted, and they leave TLS 1.3 as it is.
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
GO_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# exporter-toolkit allows exactly these response headers.
ALLOWED_HEADERS = {
    "strict-transport-security",
    "x-content-type-options",
    "x-frame-options",
    "x-xss-protection",
    "content-security-policy",
}
TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
HTTP_KEYS = {"http2", "headers"}
TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What the server enforces: a TLS context (None: plain HTTP), allowed client SANs, users, extra headers."""

    source: str
    tls: ssl.SSLContext | None = None
    client_allowed_sans: tuple[str, ...] = ()
    users: dict[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()
    tls_reload: TlsReloader | None = None  # rebuilds `tls` when the certificate or key files change

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """TLS handshake on an accepted connection, in its own thread, bounded in time; raises on a rejected peer."""
        assert self.tls is not None
        context = self.tls_reload.context() if self.tls_reload is not None else self.tls
        sock.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        tls = context.wrap_socket(sock, server_side=True)
        if self.client_allowed_sans and not _peer_san_allowed(tls.getpeercert(), self.client_allowed_sans):
            tls.close()
            raise ssl.SSLError("client certificate has none of tls_server_config.client_allowed_sans")
        tls.settimeout(None)
        return tls


def apply_web_config(path: str, app: WsgiApp) -> tuple[WsgiApp, SocketWrapper | None]:
    """The app wrapped with auth and headers, and the socket wrapper for TLS; unchanged app when path is empty."""
    if not path:
        return app, None
    web = load_web_config(Path(path))
    return _secure_app(app, LiveWebConfig(Path(path), web)), (web.wrap_socket if web.tls is not None else None)


def load_web_config(path: Path) -> WebConfig:
    source = str(path)
    try:  # a regular file of at most a MiB, never a FIFO or /dev/zero (gpuwatch.files.safefile)
        raw = yaml.safe_load(read_regular_file(path, max_bytes=MAX_TOML_BYTES, follow_links=True).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            source, "", "web config file not found; create it or fix agent.web_config/--web-config"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read the web config: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"not valid YAML: {exc}") from None
    raw = {} if raw is None else raw
    top = _mapping(source, "", raw, TOP_KEYS)
    base = path.parent
    tls_raw = top.get("tls_server_config")
    tls, sans = (None, ()) if tls_raw is None else _tls(source, base, tls_raw)
    reload = None
    if tls is not None and isinstance(tls_raw, dict):
        tls_cfg: dict[str, Any] = tls_raw
        files = [str(base / tls_cfg[k]) for k in ("cert_file", "key_file", "client_ca_file") if k in tls_cfg]
        reload = TlsReloader(tls, files, lambda: _tls(source, base, tls_cfg)[0])
    http = _mapping(source, "http_server_config", top.get("http_server_config") or {}, HTTP_KEYS)
    if "http2" in http and not isinstance(http["http2"], bool):
        raise ConfigError(source, "http_server_config.http2", "must be true or false")
    return WebConfig(
        source,
        tls=tls,
        client_allowed_sans=sans,
        users=_users(source, top.get("basic_auth_users") or {}),
        headers=_headers(source, http.get("headers") or {}),
        tls_reload=reload,
    )


def _mapping(source: str, key: str, value: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(source, key or "(top level)", f"must be a mapping, got {type(value).__name__}")
    for name in value:
        if name not in allowed:
            where = f"{key}.{name}" if key else str(name)
            raise ConfigError(source, where, f"unknown key; known: {', '.join(sorted(allowed))}")
    return value


def _string(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, key, "must be a non-empty string")
    return value


def _string_list(source: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(source, key, "must be a list of strings")
    return value


def _file(source: str, base: Path, key: str, value: Any) -> str:
    path = base / _string(source, key, value)
    if not path.is_file():
        raise ConfigError(source, key, f"{path} does not exist or is not a file")
    return str(path)


def _tls(source: str, base: Path, raw: Any) -> tuple[ssl.SSLContext, tuple[str, ...]]:
    k = "tls_server_config"
    cfg = _mapping(source, k, raw, TLS_KEYS)
    for required in ("cert_file", "key_file"):
        if required not in cfg:
            raise ConfigError(source, f"{k}.{required}", "must be set when tls_server_config is present")
    cert = _file(source, base, f"{k}.cert_file", cfg["cert_file"])
    key = _file(source, base, f"{k}.key_file", cfg["key_file"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(source, f"{k}.cert_file", f"cannot load the certificate and key: {exc}") from None
    ctx.minimum_version = _version(source, f"{k}.min_version", cfg.get("min_version", "TLS12"))
    if "max_version" in cfg:
        ctx.maximum_version = _version(source, f"{k}.max_version", cfg["max_version"])
    auth = cfg.get("client_auth_type", "NoClientCert")
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise ConfigError(
            source,
            f"{k}.client_auth_type",
            f"{auth} accepts unverified certificates, which gpuwatch does not; use {UNVERIFIED_CLIENT_AUTH[auth]}",
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(source, f"{k}.client_auth_type", f"must be one of {', '.join(CLIENT_AUTH_TYPES)}")
    ctx.verify_mode = CLIENT_AUTH_TYPES[auth]
    if "client_ca_file" in cfg:
        ca = _file(source, base, f"{k}.client_ca_file", cfg["client_ca_file"])
        try:
            ctx.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(source, f"{k}.client_ca_file", f"cannot load the CA certificates: {exc}") from None
    elif auth != "NoClientCert":
        raise ConfigError(source, f"{k}.client_ca_file", f"must be set with client_auth_type {auth}")
    if "cipher_suites" in cfg:
        _ciphers(source, ctx, _string_list(source, f"{k}.cipher_suites", cfg["cipher_suites"]))
    if cfg.get("prefer_server_cipher_suites", True):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if "curve_preferences" in cfg:
        curves = _string_list(source, f"{k}.curve_preferences", cfg["curve_preferences"])
        unknown = [c for c in curves if c not in GO_CURVES]
        if unknown or not curves:
            raise ConfigError(source, f"{k}.curve_preferences", f"unknown curve(s) {unknown}; known: {list(GO_CURVES)}")
        ctx.set_ecdh_curve(GO_CURVES[curves[0]])  # Python's ssl takes one curve: the most preferred
    sans = tuple(_string_list(source, f"{k}.client_allowed_sans", cfg.get("client_allowed_sans", [])))
    if sans and ctx.verify_mode != ssl.CERT_REQUIRED:
        raise ConfigError(source, f"{k}.client_allowed_sans", "needs client_auth_type RequireAndVerifyClientCert")
    return ctx, sans


def _version(source: str, key: str, value: Any) -> ssl.TLSVersion:
    if value not in TLS_VERSIONS:
        raise ConfigError(source, key, f"must be one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[value]


def _ciphers(source: str, ctx: ssl.SSLContext, names: list[str]) -> None:
    key = "tls_server_config.cipher_suites"
    unknown = [n for n in names if n not in GO_CIPHER_SUITES and n not in TLS13_SUITES]
    if unknown:
        raise ConfigError(source, key, f"unknown or insecure suite(s) {unknown}; known: {', '.join(GO_CIPHER_SUITES)}")
    openssl = [GO_CIPHER_SUITES[n] for n in names if n in GO_CIPHER_SUITES]
    if openssl:
        try:
            ctx.set_ciphers(":".join(openssl))
        except ssl.SSLError as exc:
            raise ConfigError(source, key, f"this OpenSSL offers none of them: {exc}") from None


def _users(source: str, raw: Any) -> dict[str, bytes]:
    if not isinstance(raw, dict):
        raise ConfigError(source, "basic_auth_users", "must be a mapping of user name to bcrypt hash")
    users = {}
    for user, hashed in raw.items():
        key = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(source, key, "user names must be non-empty strings without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(source, key, "must be a bcrypt hash ($2b$...); make one with: htpasswd -nBC 12 '' ")
        cost = hashed[4:6]
        if not (cost.isascii() and cost.isdigit() and MIN_BCRYPT_COST <= int(cost) <= MAX_BCRYPT_COST):
            raise ConfigError(
                source,
                key,
                f"bcrypt cost {cost!r} is outside {MIN_BCRYPT_COST}..{MAX_BCRYPT_COST}: each step doubles the time of "
                f"every check (cost 12 ~0.2 s, 31 ~28 hours); make one with: htpasswd -nBC 12 ''",
            )
        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise ConfigError(source, key, "is not a valid bcrypt hash") from None
        users[user] = hashed.encode()
    return users


def _headers(source: str, raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ConfigError(source, "http_server_config.headers", "must be a mapping of header name to value")
    out = []
    for name, value in raw.items():
        key = f"http_server_config.headers.{name}"
        if not isinstance(name, str) or name.lower() not in ALLOWED_HEADERS:
            raise ConfigError(source, key, f"not an allowed header; allowed: {', '.join(sorted(ALLOWED_HEADERS))}")
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise ConfigError(source, key, "must be a one-line string")
        out.append((name, value))
    return tuple(out)


def _peer_san_allowed(cert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    names = {value for kind, value in (cert or {}).get("subjectAltName", ()) if isinstance(value, str)}
    return any(name in allowed for name in names)


class Checked(enum.Enum):
    """What a password check came to."""

    PASSED = "passed"
    FAILED = "failed"
    BUSY = "busy"  # no check ran: MAX_PENDING_CHECKS were already running or waiting (gpuwatch.web.authlimit)


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes: constant-time, cached by an HMAC of the credentials.

    The users can be replaced while serving (the web config's file changed): a cached credential is kept only while
    its user still has the hash it passed against, so a removed user or a changed password stops working at once."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users  # replaced whole, never changed in place
        self._key = secrets.token_bytes(32)
        self._cache: dict[bytes, tuple[str, bytes]] = {}  # credentials that passed -> (user, hash), oldest first
        self._lock = threading.Lock()
        self._queue = CheckQueue()  # one bcrypt check at a time, a bounded number waiting
        # An unknown user still costs one bcrypt check, so timing does not tell which user names exist.
        self._dummy = _dummy_hash(_rounds(users))

    @property
    def users(self) -> dict[str, bytes]:
        return self._users

    def replace_users(self, users: dict[str, bytes]) -> None:
        """New users and hashes; cached credentials of a user removed or given another hash are forgotten."""
        dummy = self._dummy if _rounds(users) == _rounds(self._users) else _dummy_hash(_rounds(users))
        with self._lock:
            self._users, self._dummy = users, dummy
            for digest, (user, hashed) in list(self._cache.items()):
                if users.get(user) != hashed:
                    del self._cache[digest]

    def check(self, header: str | None) -> Checked:
        """PASSED or FAILED after at most one bcrypt check; BUSY at once when too many checks wait already."""
        credentials = _credentials(header)
        if credentials is None:
            return Checked.FAILED
        user, password = credentials
        digest = self._digest(user, password)
        with self._lock:
            users, dummy = self._users, self._dummy
            if digest in self._cache:
                return Checked.PASSED
        hashed, known = dummy, False
        for name, value in users.items():
            if hmac.compare_digest(name.encode(), user.encode()):
                hashed, known = value, True
        ok = self._queue.run(lambda: _checkpw(password, hashed))
        if ok is None:
            return Checked.BUSY
        if not (ok and known):
            return Checked.FAILED
        with self._lock:
            if self._users.get(user) != hashed:  # replaced while this check ran: not these credentials' any more
                return Checked.FAILED
            if len(self._cache) >= AUTH_CACHE_SIZE:
                del self._cache[next(iter(self._cache))]
            self._cache[digest] = (user, hashed)
        return Checked.PASSED

    def cached(self, header: str | None) -> bool:
        """True when these credentials passed before (no bcrypt, no rate limit): the real scraper's fast path."""
        credentials = _credentials(header)
        if credentials is None:
            return False
        digest = self._digest(*credentials)
        with self._lock:
            return digest in self._cache

    def pending_checks(self) -> int:
        return self._queue.pending()

    def _digest(self, user: str, password: str) -> bytes:
        return hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()


def _credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) from `Basic base64(user:password)`; None when there is no such header."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def _checkpw(password: str, hashed: bytes) -> bool:
    try:
        return bool(bcrypt.checkpw(password.encode(), hashed))
    except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes: a wrong password, never a 500
        return False


def _dummy_hash(rounds: int) -> bytes:
    return bytes(bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=rounds)))


def _rounds(users: dict[str, bytes]) -> int:
    """The cost of the first configured hash, so an unknown user takes as long as a known one."""
    for hashed in users.values():
        try:
            return int(hashed.split(b"$")[2])
        except (IndexError, ValueError):
            break
    return 10


class LiveWebConfig:
    """The web config's users and headers as its file says now, re-read when the file changed.

    exporter-toolkit reads its file on every request, so its users expect an edit (a revoked password) to take effect
    without a restart or a SIGHUP. A request here costs one stat() of the file instead (device, inode, size,
    modification and change times: an edit in place, a rename over it or a Kubernetes secret's symlink swap all change
    them), and the file is read only when they changed. A file that no longer loads keeps the users and headers in
    use, with one error naming the key, until it changes again. tls_server_config is read at start only (its
    certificate and key files are reloaded when they change: gpuwatch.web.tlsreload)."""

    def __init__(self, path: Path, web: WebConfig) -> None:
        self._path = path
        self._seen = _file_signature(path)
        self._reload_lock = threading.Lock()
        self.auth = BasicAuth(web.users)
        self.headers = web.headers

    def refresh(self) -> None:
        """Read the file again if it changed since it was last read (or found broken)."""
        if _file_signature(self._path) == self._seen:
            return
        with self._reload_lock:  # one reader; the others wait, so none checks a password against revoked users
            seen = _file_signature(self._path)
            if seen == self._seen:
                return
            self._seen = seen
            try:
                web = load_web_config(self._path)
            except ConfigError as exc:
                log.error(
                    "web config not re-read, keeping its users and headers in use: %s (the file is read again when "
                    "it changes)",
                    exc,
                )
                return
            removed = sorted(set(self.auth.users) - set(web.users))
            self.auth.replace_users(web.users)
            self.headers = web.headers
        if web.users:
            log.info(
                "web config %s re-read: basic auth for %d user(s)%s",
                self._path,
                len(web.users),
                f"; removed: {', '.join(removed)}" if removed else "",
            )
        else:
            log.warning("web config %s re-read: it has no basic_auth_users, so basic auth is now off", self._path)


def _file_signature(path: Path) -> tuple[int, ...] | None:
    """What changes when the file is edited, replaced or swapped by a symlink (followed); None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _BusyReport:
    """Says at most once a minute that password checks were turned away, with how many (a guessing flood)."""

    def __init__(self) -> None:
        self._last = float("-inf")
        self._count = 0
        self._lock = threading.Lock()

    def turned_away(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._count += 1
            if now - self._last < BUSY_REPORT_SECONDS:
                return
            count, self._last, self._count = self._count, now, 0
        log.warning(
            "%d request(s) with new credentials answered 429: %d password checks were already waiting (a password "
            "guessing flood?); credentials that passed before are still served",
            count,
            MAX_PENDING_CHECKS,
        )


def _secure_app(app: WsgiApp, live: LiveWebConfig) -> WsgiApp:
    """Auth and headers before the app. Credentials that passed before cost no check; a request without credentials
    costs none either (a browser's first try); any other takes one check of its address's budget before bcrypt,
    given back when the credentials pass or no check ran."""
    limiter = FailureLimiter()
    busy = _BusyReport()

    def secured(environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        live.refresh()
        auth, extra = live.auth, live.headers

        def with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return (
                start_response(status, [*headers, *extra], exc_info)
                if exc_info
                else start_response(status, [*headers, *extra])
            )

        header = environ.get("HTTP_AUTHORIZATION")
        if not auth.users or auth.cached(header):
            return app(environ, with_headers)
        if not header:
            return _unauthorized(with_headers)
        client = str(environ.get("REMOTE_ADDR", ""))
        if not limiter.take(client):
            body = "too many failed logins from this address; retry later\n"
            return _too_many(with_headers, body, limiter.retry_after_seconds())
        checked = auth.check(header)
        if checked is not Checked.FAILED:
            limiter.refund(client)
        if checked is Checked.BUSY:
            busy.turned_away()
            return _too_many(with_headers, "too many password checks waiting; retry shortly\n", 1)
        if checked is Checked.FAILED:
            return _unauthorized(with_headers)
        return app(environ, with_headers)

    return secured


def _unauthorized(start_response: Callable[..., Any]) -> list[bytes]:
    body = b"unauthorized\n"
    start_response(
        "401 Unauthorized",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("WWW-Authenticate", f'Basic realm="{REALM}"'),
        ],
    )
    return [body]


def _too_many(start_response: Callable[..., Any], text: str, retry_after: int) -> list[bytes]:
    body = text.encode()
    start_response(
        "429 Too Many Requests",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Retry-After", str(retry_after)),
        ],
    )
    return [body]
