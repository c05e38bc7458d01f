"""HTTP abuse on a running agent: concurrent scrapes, slow clients, huge and malformed requests, unknown paths and
methods. The server stays up and /metrics stays correct. Speed targets live in benchmarks/http_abuse.py; the bounds
here are loose enough for a loaded 2-core CI machine."""

from __future__ import annotations

import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families
from reliability_agent import LiveAgent, wait_for

SCRAPES = 200


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAgent]:
    agent = LiveAgent(tmp_path_factory.mktemp("state"))
    wait_for(lambda: agent.get("/healthz")[0] == 200, what="healthy agent")
    yield agent
    agent.stop()


def assert_metrics_correct(live: LiveAgent, promtool: str | None = None) -> None:
    status, text, _ = live.get("/metrics")
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "gpuwatch_gpu_up" in names and "gpuwatch_gpu_temperature_celsius" in names
    assert set(live.up().values()) == {1.0} and len(live.up()) == 8
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def raw_exchange(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes as they are and read what the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # nothing more comes: an unfinished request ends at EOF, not the timeout
        except OSError:
            pass  # the server may refuse and close (or reset) before reading everything
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
        return b"".join(chunks)


def test_200_concurrent_scrapes_are_all_answered(live: LiveAgent, promtool: str) -> None:
    def scrape(_: int) -> tuple[int, str, float]:
        return live.get("/metrics", timeout=60)

    with ThreadPoolExecutor(max_workers=SCRAPES) as pool:
        results = list(pool.map(scrape, range(SCRAPES)))
    assert [status for status, _, _ in results] == [200] * SCRAPES
    for _, text, _ in results[:: SCRAPES // 10]:  # a sample of the bodies: complete, parseable expositions
        assert sum(1 for _ in text_string_to_metric_families(text)) > 20
    seconds = sorted(elapsed for _, _, elapsed in results)
    p99 = seconds[int(0.99 * len(seconds)) - 1]
    print(f"200 concurrent scrapes: p50 {statistics.median(seconds):.3f} s, p99 {p99:.3f} s")
    assert p99 < 10.0  # generous: the 1 s target is measured by benchmarks/http_abuse.py
    assert_metrics_correct(live, promtool)


def test_slow_clients_do_not_block_scrapes(live: LiveAgent) -> None:
    slow = []
    try:
        for _ in range(50):  # slowloris: half-open requests that trickle one byte at a time
            sock = socket.create_connection(("127.0.0.1", live.port), timeout=5)
            sock.sendall(b"G")
            slow.append(sock)
        for second in range(3):
            for sock in slow:
                sock.sendall(b"ET /metrics HTTP/1.1\r\n"[second : second + 1])
            status, _, elapsed = live.get("/metrics", timeout=20)
            assert status == 200
            assert elapsed < 5.0, f"a scrape took {elapsed:.1f} s while 50 slow clients hang"
            time.sleep(1.0)
    finally:
        for sock in slow:
            sock.close()
    assert_metrics_correct(live)


def test_huge_request_line_is_refused_and_the_server_stays_up(live: LiveAgent) -> None:
    answer = raw_exchange(live.port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 414") or answer == b"", answer[:200]
    assert_metrics_correct(live)


def test_huge_headers_are_refused_and_the_server_stays_up(live: LiveAgent) -> None:
    one_long = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"b" * 100_000 + b"\r\n\r\n"
    assert raw_exchange(live.port, one_long).split(b"\r\n")[0].split(b" ")[1] in (b"400", b"431")
    many = b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(500)) + b"\r\n"
    assert raw_exchange(live.port, many).split(b"\r\n")[0].split(b" ")[1] in (b"400", b"431")
    assert_metrics_correct(live)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\xff\xfe\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x",  # an unfinished request
    ],
)
def test_malformed_requests_are_answered_or_dropped(live: LiveAgent, payload: bytes) -> None:
    answer = raw_exchange(live.port, payload, timeout=35)
    # A status line, or (no usable HTTP version: answered as HTTP/0.9) the bare error page, or a closed connection.
    assert answer == b"" or answer.startswith(b"HTTP/") or b"Error code: " in answer, answer[:200]
    assert_metrics_correct(live)


def test_unknown_paths_and_wrong_methods(live: LiveAgent) -> None:
    for path in ("/nope", "/metrics/../etc/passwd", "/%00", "/" + "x" * 4000, "/metrics?x=" + "%" * 100):
        status, _, _ = live.get(path)
        assert status in (200, 400, 404), (path, status)
    assert live.get("/nope")[0] == 404
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"):
        assert live.get("/metrics", method=method)[0] in (405, 501), method
    assert_metrics_correct(live)


def test_head_answers_with_the_headers_of_get_and_no_body(live: LiveAgent) -> None:
    def exchange(method: str, path: str) -> tuple[bytes, dict[bytes, bytes], bytes]:
        answer = raw_exchange(live.port, f"{method} {path} HTTP/1.0\r\n\r\n".encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        return lines[0].split(b" ")[1], headers, body

    for path, content_type in (("/healthz", b"text/plain"), ("/", b"text/html"), ("/metrics", b"text/plain")):
        status, headers, body = exchange("HEAD", path)
        assert status == b"200" and body == b"", (path, status, body[:100])
        assert headers[b"content-type"].startswith(content_type), (path, headers)
        assert int(headers[b"content-length"]) > 0, (path, headers)  # GET's length, not the empty body's
    _, headers, _ = exchange("HEAD", "/healthz")
    assert int(headers[b"content-length"]) == len(exchange("GET", "/healthz")[2])  # the one body that never changes
    assert_metrics_correct(live)


def test_clients_that_disconnect_mid_response(live: LiveAgent, capfd: pytest.CaptureFixture[str]) -> None:
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_metrics_correct(live)
    time.sleep(0.5)  # let the server threads finish writing into closed connections
    assert "Traceback" not in capfd.readouterr().err  # a reset client is routine, not a traceback per connection


def test_a_stalled_client_is_cut_off_at_the_timeout_quietly(
    live: LiveAgent, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from gpuwatch.web import server as web

    monkeypatch.setattr(web._QuietHandler, "timeout", 0.5)  # the 30 s client timeout, shortened
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(b"GET /metr")
        assert sock.recv(100) == b""  # the server gave up on it and closed the connection
    assert_metrics_correct(live)
    assert "Traceback" not in capfd.readouterr().err  # routine, so no traceback per stalled connection
