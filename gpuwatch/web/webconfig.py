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
that passed are cached (under an HMAC of them), so failed ones can never evict the real scraper's. Failed attempts
are limited per client address (gpuwatch.web.authlimit: 429 once its budget is spent), and a hash whose cost would make
every check take seconds to hours is refused when the file is loaded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from gpuwatch.config.settings import ConfigError
from gpuwatch.files.safefile import read_regular_file
from gpuwatch.files.tomlfile import MAX_TOML_BYTES
from gpuwatch.web.authlimit import FailureLimiter
from gpuwatch.web.tlsreload import TlsReloader

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
    secured = _secure_app(app, web) if web.users or web.headers else app
    return secured, (web.wrap_socket if web.tls is not None else None)


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


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes: constant-time, cached by an HMAC of the credentials."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users
        self._key = secrets.token_bytes(32)
        self._cache: dict[bytes, bool] = {}  # only credentials that passed, oldest first
        self._lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # one bcrypt check at a time: wrong passwords cost one core at most
        # An unknown user still costs one bcrypt check, so timing does not tell which user names exist.
        self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=_rounds(users)))

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None:
            return cached
        hashed = self._dummy
        known = False
        for name, value in self._users.items():
            if hmac.compare_digest(name.encode(), user.encode()):
                hashed, known = value, True
        try:
            with self._bcrypt_lock:
                ok = bcrypt.checkpw(password.encode(), hashed) and known
        except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes: a wrong password, never a 500
            ok = False
        if ok:
            with self._lock:
                if len(self._cache) >= AUTH_CACHE_SIZE:
                    del self._cache[next(iter(self._cache))]
                self._cache[digest] = True
        return ok

    def cached(self, header: str | None) -> bool:
        """True when these credentials passed before (no bcrypt, no rate limit): the real scraper's fast path."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            return digest in self._cache


def _rounds(users: dict[str, bytes]) -> int:
    """The cost of the first configured hash, so an unknown user takes as long as a known one."""
    for hashed in users.values():
        try:
            return int(hashed.split(b"$")[2])
        except (IndexError, ValueError):
            break
    return 10


def _secure_app(app: WsgiApp, web: WebConfig) -> WsgiApp:
    auth = BasicAuth(web.users) if web.users else None
    limiter = FailureLimiter()

    def secured(environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        def with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return (
                start_response(status, [*headers, *web.headers], exc_info)
                if exc_info
                else start_response(status, [*headers, *web.headers])
            )

        header = environ.get("HTTP_AUTHORIZATION")
        client = str(environ.get("REMOTE_ADDR", ""))
        if auth is not None and not auth.cached(header) and not limiter.allowed(client):
            body = b"too many failed logins from this address; retry later\n"
            with_headers(
                "429 Too Many Requests",
                [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Content-Length", str(len(body))),
                    ("Retry-After", str(limiter.retry_after_seconds())),
                ],
            )
            return [body]
        if auth is not None and not auth.check(header):
            if header:  # a request without credentials (a browser's first try) is no failed attempt
                limiter.failed(client)
            body = b"unauthorized\n"
            with_headers(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Content-Length", str(len(body))),
                    ("WWW-Authenticate", f'Basic realm="{REALM}"'),
                ],
            )
            return [body]
        return app(environ, with_headers)

    return secured
