"""The HTTP server under hostile clients, before any authentication: header bytes, connections, threads and time
are bounded, accept() out of descriptors neither spins nor logs tracebacks, plain HTTP on the TLS port gets a 400,
a rotated certificate is served without a restart, and a `name[]` filter naming nothing gpuwatch exports is a 400."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry
from test_webconfig import Pki, _cert, _key, _pem, _write_key, pki  # noqa: F401  (pki: the module's fixture)

from gpuwatch.web import connections
from gpuwatch.web.connections import MAX_HEAD_BYTES, MAX_LINE_BYTES, ConnectionTable
from gpuwatch.web.server import HttpServer, _Server, make_app
from gpuwatch.web.webconfig import apply_web_config


def serve(limit: int | None = None, web_config: Path | None = None) -> HttpServer:
    app = make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: "<html></html>")
    app, wrap = apply_web_config(str(web_config) if web_config else "", app)
    server = HttpServer("127.0.0.1", 0, app, wrap)
    if limit is not None:
        server._server.table = ConnectionTable(limit=limit)
    server.start()
    return server


@pytest.fixture
def server() -> Iterator[HttpServer]:
    srv = serve(limit=16)
    yield srv
    srv.stop()


def exchange(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def get(port: int, path: str = "/healthz") -> bytes:
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def trickle(port: int, n: int) -> list[socket.socket]:
    """Clients that send half a request line and then nothing."""
    out = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metr")
        out.append(sock)
    return out


# --- header bytes ---------------------------------------------------------------------------------------------


def test_a_header_line_over_the_limit_is_431(server: HttpServer) -> None:
    reply = exchange(server.port, b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_LINE_BYTES + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 431")


def test_a_head_over_the_limit_is_431_even_in_small_lines(server: HttpServer) -> None:
    """98 × 65 KB headers per connection took RSS from 37 to 1,873 MiB over 300 connections."""
    lines = b"".join(b"X-%d: %s\r\n" % (n, b"a" * 4000) for n in range(MAX_HEAD_BYTES // 4000 + 2))
    reply = exchange(server.port, b"GET / HTTP/1.1\r\n" + lines + b"\r\n")
    assert reply.startswith(b"HTTP/1.0 431")
    assert get(server.port).startswith(b"HTTP/1.0 200")


def test_big_headers_on_many_connections_leave_memory_bounded() -> None:
    """The agent (in this process): 60 connections offer 40 × 60 KB of headers each; its RSS grows far less."""
    import tempfile

    from reliability_agent import LiveAgent, wait_for

    with tempfile.TemporaryDirectory() as state:
        agent = LiveAgent(Path(state))
        try:
            wait_for(lambda: agent.get("/healthz")[0] == 200, what="healthy agent")
            proc = psutil.Process()  # the agent runs in this process
            before = proc.memory_info().rss
            header = b"X-Big: " + b"a" * 60_000 + b"\r\n"

            def attack() -> None:
                try:
                    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as sock:
                        sock.sendall(b"GET / HTTP/1.1\r\n")
                        for _ in range(40):
                            sock.sendall(header)
                except OSError:
                    pass  # cut off at the limit: what should happen

            threads = [threading.Thread(target=attack) for _ in range(60)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            grown = (proc.memory_info().rss - before) / 2**20
            assert grown < 60, f"RSS grew {grown:.0f} MiB for 144 MB of offered headers"
            assert agent.get("/healthz")[0] == 200
        finally:
            agent.stop()


# --- connections, threads, deadlines --------------------------------------------------------------------------


def test_trickling_clients_hold_no_more_than_the_cap_and_a_scrape_still_gets_through(server: HttpServer) -> None:
    threads_before = threading.active_count()
    clients = trickle(server.port, 60)
    try:
        time.sleep(0.5)
        assert server._server.table.count() <= 16
        assert threading.active_count() - threads_before <= 16 + 2
        started = time.monotonic()
        assert get(server.port).startswith(b"HTTP/1.0 200")  # evicts the oldest unfinished request
        assert time.monotonic() - started < 2.0
    finally:
        for sock in clients:
            sock.close()


def _sleeps(thread: threading.Thread) -> int:
    """How many times the thread has blocked so far: its voluntary context switches (proc(5), /proc/pid/task/tid/
    status). A thread that wakes on a timer, however briefly, adds one per wake."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_an_idle_server_never_wakes_and_still_answers_at_once(server: HttpServer) -> None:
    """socketserver's serve_forever looks for a shutdown request every 0.5 s and the reaper used to tick as often:
    ~4 wakes a second of an idle agent for nothing. Now both block until a client or a deadline comes."""
    threads = (server._thread, server._reaper)
    before = [_sleeps(t) for t in threads]
    for _ in range(25):  # until both are in their waits (a loaded machine may start them late)
        time.sleep(0.2)
        settled, before = before, [_sleeps(t) for t in threads]
        if before == settled:
            break
    time.sleep(1.6)
    assert [_sleeps(t) for t in threads] == before
    started = time.monotonic()
    assert get(server.port).startswith(b"HTTP/1.0 200")
    assert time.monotonic() - started < 2.0


def test_stop_is_prompt_frees_the_port_and_works_before_start() -> None:
    """SIGTERM must not wait for a poll interval: the accept loop and the reaper are woken to stop."""
    srv = serve()
    port = srv.port
    assert get(port).startswith(b"HTTP/1.0 200")
    started = time.monotonic()
    srv.stop()
    assert time.monotonic() - started < 0.9  # each thread gets STOP_WAIT_SECONDS (1.0) before stop moves on
    assert not srv._thread.is_alive() and not srv._reaper.is_alive()
    again = HttpServer("127.0.0.1", port, make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: ""))
    again.stop()  # never started: returns, closes the socket and its stop pipe
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_when_every_slot_is_being_answered_a_newcomer_gets_503(server: HttpServer) -> None:
    table = server._server.table
    clients = trickle(server.port, 16)
    try:
        time.sleep(0.3)
        for conn in list(table._open.values()):
            table.head_done(conn)  # as if each were being answered
        reply = get(server.port)
        assert reply.startswith(b"HTTP/1.0 503")
    finally:
        for sock in clients:
            sock.close()


def test_a_request_head_has_a_total_deadline_not_one_per_read(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "HEAD_DEADLINE_SECONDS", 1.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        started = time.monotonic()
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":  # one byte every 0.2 s: each read is quick
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            closed_after = None
        except OSError:
            closed_after = time.monotonic() - started
        if closed_after is None:
            assert sock.recv(100) == b""  # closed by the server
            closed_after = time.monotonic() - started
    assert closed_after < 4.0


def test_a_thread_that_cannot_start_is_a_503_without_a_traceback(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "http-conn":
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    caplog.set_level(logging.DEBUG)
    for _ in range(5):
        assert get(server.port).startswith(b"HTTP/1.0 503")
    assert not [r for r in caplog.records if r.exc_info]
    assert sum("cannot start a thread" in r.getMessage() for r in caplog.records) == 1  # said once, not per refusal


def test_the_listen_backlog_takes_200_simultaneous_connects() -> None:
    assert _Server.request_queue_size >= 200


EMFILE_AGENT = textwrap.dedent("""
    import resource, sys, time
    from prometheus_client import CollectorRegistry
    from gpuwatch.web.server import HttpServer, make_app
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    server = HttpServer("127.0.0.1", 0, make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: ""))
    server.start()
    print(server.port, flush=True)
    time.sleep(60)
""")


def test_out_of_descriptors_in_accept_neither_spins_nor_logs_tracebacks() -> None:
    """With LimitNOFILE 1024, 1,100 clients put the agent in a 100 % CPU accept() EMFILE loop."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EMFILE_AGENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    clients: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(100):  # more than its 64 descriptors
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                clients[-1].sendall(b"GET /")
            except OSError:
                break
        agent = psutil.Process(proc.pid)
        agent.cpu_percent()
        time.sleep(2.0)
        assert agent.cpu_percent() < 50.0
        assert get(port).startswith(b"HTTP/1.0 200")  # the oldest unfinished request made room
    finally:
        for sock in clients:
            sock.close()
        proc.kill()
        _, stderr = proc.communicate(timeout=10)
    assert "Traceback" not in stderr


# --- TLS port: plain HTTP, rotated certificates ---------------------------------------------------------------


def _tls_config(tmp_path: Path, cert: Path, key: Path) -> Path:
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return config


def _serial(port: int) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_plain_http_on_the_tls_port_gets_a_400_saying_so(tmp_path: Path, pki: Pki) -> None:  # noqa: F811
    srv = serve(web_config=_tls_config(tmp_path, pki.server_cert, pki.server_key))
    try:
        reply = get(srv.port)
        assert reply.startswith(b"HTTP/1.0 400") and b"HTTP request to an HTTPS server" in reply
    finally:
        srv.stop()


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    cert, key = tmp_path / "node.crt", tmp_path / "node.key"
    old_key = _key()
    _write_key(key, old_key)
    _pem(cert, old := _cert("node", old_key, None))
    srv = serve(web_config=_tls_config(tmp_path, cert, key))
    try:
        assert _serial(srv.port) == old.serial_number
        new_key = _key()
        _write_key(key, new_key)
        _pem(cert, new := _cert("node", new_key, None))
        time.sleep(1.1)
        assert _serial(srv.port) == new.serial_number
        cert.write_text("garbage")  # half-rotated: the last good one keeps serving
        time.sleep(1.1)
        assert _serial(srv.port) == new.serial_number
    finally:
        srv.stop()


# --- name[] ---------------------------------------------------------------------------------------------------


def test_a_name_filter_naming_nothing_gpuwatch_exports_is_a_400() -> None:
    import tempfile

    from reliability_agent import LiveAgent, wait_for

    with tempfile.TemporaryDirectory() as state:
        agent = LiveAgent(Path(state))
        try:
            wait_for(lambda: agent.get("/healthz")[0] == 200, what="healthy agent")
            status, body, _ = agent.get("/metrics?name[]=x")
            assert status == 400 and "no metric named x" in body
            status, body, _ = agent.get("/metrics?name[]=gpuwatch_gpu_up&name[]=x")
            assert status == 200 and "gpuwatch_gpu_up{" in body and "gpuwatch_gpu_temperature" not in body
        finally:
            agent.stop()
