"""TLS, client certificates and basic auth from an exporter-toolkit web-config.yml, tested with real TLS clients
against the real HTTP server; certificates are made in the test (a CA, a server, a good and a foreign client)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from ports import free_port
from prometheus_client import CollectorRegistry

from gpuwatch.config.settings import ConfigError
from gpuwatch.web.server import HttpServer, make_app
from gpuwatch.web.webconfig import apply_web_config, load_web_config

PASSWORD = "s3cret scrape"


@dataclass
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    foreign_cert: Path
    foreign_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer if issuer else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key, foreign_ca_key = _key(), _key()
    ca = _cert("gpuwatch test CA", ca_key, None, ca=True)
    foreign_ca = _cert("someone else's CA", foreign_ca_key, None, ca=True)
    server_key, client_key, foreign_key = _key(), _key(), _key()
    server = _cert(
        "gpuwatch",
        server_key,
        (ca.subject, ca_key),
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = _cert("prometheus", client_key, (ca.subject, ca_key), sans=[x509.DNSName("prometheus.example")])
    foreign = _cert("prometheus", foreign_key, (foreign_ca.subject, foreign_ca_key))
    for name, key in (("server", server_key), ("client", client_key), ("foreign", foreign_key)):
        _write_key(d / f"{name}.key", key)
    return Pki(
        d,
        _pem(d / "ca.crt", ca),
        _pem(d / "server.crt", server),
        d / "server.key",
        _pem(d / "client.crt", client),
        d / "client.key",
        _pem(d / "foreign.crt", foreign),
        d / "foreign.key",
    )


class Served:
    def __init__(self, web_config: Path) -> None:
        app = make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: "<html></html>")
        app, wrap = apply_web_config(str(web_config), app)
        self.server = HttpServer("127.0.0.1", 0, app, wrap)
        self.server.start()
        self.port = self.server.port

    def get(
        self, path: str = "/metrics", *, tls: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None
    ) -> tuple[int, dict[str, str]]:
        scheme = "https" if tls else "http"
        request = urllib.request.Request(f"{scheme}://127.0.0.1:{self.port}{path}")
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10, context=tls) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)


@pytest.fixture
def serve() -> Iterator[type[Served]]:
    started: list[Served] = []

    class Tracked(Served):
        def __init__(self, web_config: Path) -> None:
            super().__init__(web_config)
            started.append(self)

    yield Tracked
    for s in started:
        s.server.stop()


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert and key:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_basic_auth_accepts_the_right_password_only(tmp_path: Path, serve: type[Served]) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    server = serve(write(tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{hashed}'\n"))
    status, headers = server.get()
    assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="gpuwatch"'
    assert server.get(auth=("prometheus", "wrong"))[0] == 401
    assert server.get(auth=("grafana", PASSWORD))[0] == 401  # unknown user, right password
    assert server.get(auth=("prometheus", PASSWORD))[0] == 200
    assert server.get(auth=("prometheus", PASSWORD))[0] == 200  # the cached path gives the same answer
    assert server.get(auth=("prometheus", "wrong"))[0] == 401
    assert server.get("/healthz", auth=("prometheus", PASSWORD))[0] == 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # HEAD: no body, 401 included
        sock.sendall(b"HEAD /metrics HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 401 ") and b"WWW-Authenticate" in head and body == b""


def test_a_password_over_72_bytes_is_refused_with_401_not_a_500(tmp_path: Path, serve: type[Served]) -> None:
    """bcrypt 5 raises ValueError for passwords over 72 bytes; any unauthenticated client could send one."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    server = serve(write(tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{hashed}'\n"))
    long_password = PASSWORD + "x" * 100
    assert len(long_password.encode()) > 72
    assert server.get(auth=("prometheus", long_password))[0] == 401
    assert server.get(auth=("prometheus", long_password))[0] == 401  # the cached path too
    assert server.get(auth=("nobody", "é" * 80))[0] == 401  # unknown user: the dummy hash check
    assert server.get(auth=("prometheus", PASSWORD))[0] == 200


def test_tls_with_required_client_certificates(tmp_path: Path, pki: Pki, serve: type[Served]) -> None:
    config = write(
        tmp_path / "web.yml",
        f"""tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca}
  min_version: TLS12
http_server_config:
  headers:
    Strict-Transport-Security: max-age=31536000
""",
    )
    server = serve(config)
    status, headers = server.get(tls=client_context(pki, pki.client_cert, pki.client_key))
    assert status == 200 and headers["Strict-Transport-Security"] == "max-age=31536000"
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        server.get(tls=client_context(pki))  # no client certificate
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        server.get(tls=client_context(pki, pki.foreign_cert, pki.foreign_key))  # signed by another CA
    assert server.get()[0] == 400  # plain HTTP to a TLS port: told so, as Go's net/http does
    assert server.get(tls=client_context(pki, pki.client_cert, pki.client_key))[0] == 200  # still serving


def test_client_allowed_sans(tmp_path: Path, pki: Pki, serve: type[Served]) -> None:
    base = """tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
"""
    # Relative paths are read beside the web-config file, as exporter-toolkit does.
    good = serve(write(pki.dir / "web-good.yml", base + "  client_allowed_sans: [prometheus.example]\n"))
    assert good.get(tls=client_context(pki, pki.client_cert, pki.client_key))[0] == 200
    bad = serve(write(pki.dir / "web-bad.yml", base + "  client_allowed_sans: [other.example]\n"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        bad.get(tls=client_context(pki, pki.client_cert, pki.client_key))


def test_tls_and_basic_auth_together(tmp_path: Path, pki: Pki, serve: type[Served]) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    server = serve(
        write(
            tmp_path / "web.yml",
            f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
            f"basic_auth_users:\n  prometheus: {hashed}\n",
        )
    )
    tls = client_context(pki)
    assert server.get(tls=tls)[0] == 401
    assert server.get(tls=tls, auth=("prometheus", "nope"))[0] == 401
    assert server.get(tls=tls, auth=("prometheus", PASSWORD))[0] == 200


def test_a_stalled_tls_client_does_not_block_other_scrapes(tmp_path: Path, pki: Pki, serve: type[Served]) -> None:
    server = serve(
        write(
            tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        )
    )
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]  # connect, never say hello
    half = socket.create_connection(("127.0.0.1", server.port))
    half.sendall(b"\x16\x03\x01\x00")  # the first bytes of a ClientHello, then silence
    try:
        for _ in range(3):
            assert server.get(tls=client_context(pki))[0] == 200
    finally:
        for sock in [*stalled, half]:
            sock.close()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("tls_server_config:\n  key_file: x\n", "tls_server_config.cert_file"),
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "cert_file"),
        ("basic_auth_users:\n  prometheus: plaintext\n", "basic_auth_users.prometheus"),
        ("basic_auth_users:\n  prometheus: $2b$10$tooshort\n", "basic_auth_users.prometheus"),
        ("tls_server_confg: {}\n", "tls_server_confg"),
        ("http_server_config:\n  headers:\n    Server: gpuwatch\n", "http_server_config.headers.Server"),
        ("- a list\n", "(top level)"),
        ("basic_auth_users: [\n", ""),
    ],
)
def test_bad_web_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_web_config(write(tmp_path / "web.yml", text))
    assert key in info.value.key


def test_bad_tls_settings_name_the_key(tmp_path: Path, pki: Pki) -> None:
    head = f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    for extra, key in (
        ("  client_auth_type: RequireAndVerifyClientCert\n", "client_ca_file"),
        ("  client_auth_type: RequireAnyClientCert\n", "client_auth_type"),
        ("  min_version: TLS14\n", "min_version"),
        ("  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "cipher_suites"),
        ("  curve_preferences: [CurveP999]\n", "curve_preferences"),
        (f"  key_file: {pki.client_key}\n", "cert_file"),  # key does not match the certificate
    ):
        text = head.replace(f"  key_file: {pki.server_key}\n", "") if "key_file" in extra else head
        with pytest.raises(ConfigError) as info:
            load_web_config(write(tmp_path / "web.yml", text + extra))
        assert info.value.key.endswith(key), (extra, info.value)
    ok = load_web_config(
        write(
            tmp_path / "web.yml",
            head + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
            "  curve_preferences: [X25519, CurveP256]\n  max_version: TLS13\n",
        )
    )
    assert ok.tls is not None


def test_the_agent_exits_78_naming_the_key(tmp_path: Path) -> None:
    web = write(tmp_path / "web.yml", "basic_auth_users:\n  prometheus: hunter2\n")
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--web-config", str(web)]
    cmd += ["--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 78, result.stderr
    assert f"{web}: basic_auth_users.prometheus" in result.stderr


def test_check_validates_the_web_config_as_the_agent_would(tmp_path: Path, pki: Pki) -> None:
    def check(*flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gpuwatch", "check", "--backend", "simulated", *flags]
        cmd += ["--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state")]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    plain_hash = "basic_auth_users:\n  prometheus: hunter2\n"  # a password where a bcrypt hash belongs
    bad = check("--web-config", str(write(tmp_path / "bad.yml", plain_hash)))
    assert bad.returncode == 78, bad.stdout + bad.stderr  # as `gpuwatch run` would exit on that file
    assert f"[FAIL] web config {tmp_path / 'bad.yml'}: " in bad.stdout and "basic_auth_users.prometheus" in bad.stdout
    assert "Traceback" not in bad.stderr

    missing_key = check(
        "--web-config", str(write(tmp_path / "tls.yml", f"tls_server_config:\n  cert_file: {pki.server_cert}\n"))
    )
    assert missing_key.returncode == 78 and "tls_server_config.key_file" in missing_key.stdout

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    good_text = f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    good_text += f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    good = check("--web-config", str(write(tmp_path / "good.yml", good_text)))
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"[ok] web config {tmp_path / 'good.yml'}: TLS, basic auth for 1 user(s)" in good.stdout

    none = check()
    assert none.returncode == 0 and "[ok] web config: none" in none.stdout


def test_the_agent_serves_tls_from_the_config_file(tmp_path: Path, pki: Pki) -> None:
    web = write(
        tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    )
    config = write(tmp_path / "config.toml", f'[agent]\nweb_config = "{web}"\n')
    port = free_port()
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--config", str(config), "--backend", "simulated"]
    cmd += ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), "--poll-interval", "0.2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/metrics", timeout=5, context=client_context(pki)
                ) as r:
                    assert b"gpuwatch_gpu_up" in r.read()
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the agent never served TLS"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_revoked_password_stops_working_at_the_next_request_and_a_bad_edit_keeps_the_users(tmp_path: Path) -> None:
    """SIGHUP said "configuration reloaded" yet a revoked password kept working until a restart; exporter-toolkit
    re-reads its file on every request, so its users expect an edit to take effect. The agent re-reads the users when
    the file changed (no SIGHUP needed), forgets the cached credentials of a removed user or a changed password, and
    keeps the users in use, with an error naming the key, when the edited file is broken. Cost-4 hashes: this tests
    the re-read, not bcrypt's cost."""

    def hashed(password: str) -> str:
        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()

    def replace(text: str) -> None:  # as an editor or Ansible writes it: a new file renamed over the old one
        (tmp_path / "web.yml.new").write_text(text)
        (tmp_path / "web.yml.new").rename(web)

    web = write(
        tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{hashed('old')}'\n  grafana: '{hashed('g')}'\n"
    )
    port = free_port()
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--web-config", str(web)]
    cmd += ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), "--poll-interval", "0.2"]
    log = (tmp_path / "agent.log").open("w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)

    def status(user: str, password: str) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz")
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            try:
                if status("prometheus", "old") == 200:
                    break
            except urllib.error.URLError:
                pass
            assert time.monotonic() < deadline, "the agent never served"
            time.sleep(0.2)
        assert status("grafana", "g") == 200  # both cached now

        replace(f"basic_auth_users:\n  prometheus: '{hashed('new')}'\n")  # grafana removed, prometheus' changed
        assert status("prometheus", "old") == 401
        assert status("grafana", "g") == 401
        assert status("prometheus", "new") == 200

        web.write_text("basic_auth_users:\n  prometheus: hunter2\n")  # a bad edit, in place
        assert status("prometheus", "new") == 200  # the users in use are kept
        assert status("prometheus", "hunter2") == 401
        assert status("prometheus", "new") == 200  # and the broken file is not read again at every request

        web.write_text(f"basic_auth_users:\n  prometheus: '{hashed('fixed')}'\n")
        assert status("prometheus", "fixed") == 200
        assert status("prometheus", "new") == 401
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    text = (tmp_path / "agent.log").read_text()
    assert f"web config {web} re-read: basic auth for 1 user(s); removed: grafana" in text, text
    errors = [line for line in text.splitlines() if "web config not re-read" in line]
    assert len(errors) == 1, text
    assert f"{web}: basic_auth_users.prometheus: must be a bcrypt hash" in errors[0], errors
    assert "keeping its users and headers in use" in errors[0]
    assert "Traceback" not in text


def test_users_added_to_a_file_without_them_turn_auth_on_and_removing_all_turns_it_off(
    tmp_path: Path, serve: type[Served], caplog: pytest.LogCaptureFixture
) -> None:
    """The server re-reads the users whatever the file held at start: a file with only headers is watched too."""
    web = write(tmp_path / "web.yml", "http_server_config:\n  headers: {X-Frame-Options: deny}\n")
    server = serve(web)
    status, headers = server.get()
    assert status == 200 and headers["X-Frame-Options"] == "deny"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    write(web, f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    status, headers = server.get()
    assert status == 401 and "X-Frame-Options" not in headers  # the headers went with the edit
    assert server.get(auth=("prometheus", PASSWORD))[0] == 200
    with caplog.at_level("WARNING", logger="gpuwatch.web.webconfig"):
        write(web, "basic_auth_users: {}\n")
        assert server.get()[0] == 200
    assert any("has no basic_auth_users, so basic auth is now off" in r.getMessage() for r in caplog.records)
