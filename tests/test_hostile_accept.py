"""/metrics under hostile Accept headers, over real HTTP: a version that is not dotted numbers was a 500 with a
20-line traceback per request (prometheus_client's choose_encoder compared 'x' with 0), and any other version was
echoed into the Content-Type and became a cache key of its own, so a few clients cycling spellings made the poll
thread re-render every one of them. Unknown versions are skipped as Prometheus's own negotiation skips them
(prometheus/common expfmt Negotiate; text 0.0.4 when nothing is left), said once in the log, and the cache holds only
the variants known versions make."""

from __future__ import annotations

import gzip
import http.client
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent
from test_agent_process import get

from gpuwatch.exposition.cache import KNOWN_VERSIONS, CachedExposition, cached_metrics_app, negotiate
from gpuwatch.web.server import HttpServer, make_app

TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
NOTICE = "a version Prometheus does not define"
MALFORMED = [
    "text/plain; version=x",
    "application/openmetrics-text; version=a.b",
    "text/plain; version=-1.0.0",
    "application/openmetrics-text; version=1.0.0junk",
    "application/openmetrics-text; version=1..0",
    "text/plain; version=1.0.0.0.0.0.0.0.0.0",
]
# What Prometheus 2.x and 3.x send by default: their answers must stay what they were.
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
    "version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def fetch(port: int, accept: str, *, gzip_ok: bool = False) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Accept": accept, **({"Accept-Encoding": "gzip"} if gzip_ok else {})}
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        body = response.read()
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return response.status, response.getheader("Content-Type") or "", body
    finally:
        conn.close()


def known_content_types() -> set[str]:
    """Every Content-Type a known version and escaping can give (with unknown escapings, which the library maps to
    underscores)."""
    out = {negotiate(None)[1]}
    for media, versions in KNOWN_VERSIONS.items():
        for version in versions:
            for escaping in ("", "underscores", "dots", "values", "allow-utf-8", "bogus"):
                offer = (
                    media + (f"; version={version}" if version else "") + (f"; escaping={escaping}" if escaping else "")
                )
                out.add(negotiate(offer)[1])
    return out


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    port = free_port()
    log_path = tmp_path / "agent.log"
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--poll-interval", "0.5", "--probe-interval", "0"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if get(f"http://127.0.0.1:{port}/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield port, proc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_malformed_accept_version_gets_text_0_0_4_and_one_log_line(
    agent: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    port, proc, log_path = agent
    for n in range(300):
        status, content_type, body = fetch(port, MALFORMED[n % len(MALFORMED)], gzip_ok=n % 2 == 1)
        assert (status, content_type) == (200, TEXT_004), (MALFORMED[n % len(MALFORMED)], status, body[:300])
        assert any(f.name == "gpuwatch_gpu_up" for f in text_string_to_metric_families(body.decode()))
    # only the bad offer is passed over: a good one after it is still served
    status, content_type, body = fetch(port, "text/plain; version=x, application/openmetrics-text; version=1.0.0")
    assert status == 200 and content_type.startswith("application/openmetrics-text; version=1.0.0;")
    assert any(f.name == "gpuwatch_gpu_up" for f in openmetrics_families(body.decode()))
    # Prometheus's own headers are answered as before
    assert (
        fetch(port, PROMETHEUS_2)[1]
        == "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
    )
    assert (
        fetch(port, PROMETHEUS_3)[1]
        == "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"
    )
    proc.terminate()
    proc.wait(timeout=10)
    log = log_path.read_text()
    assert log.count(NOTICE) == 1, log  # 300 bad requests, one line: the journal's burst stays for real warnings
    assert "Traceback" not in log and "500" not in log, log


def test_cycling_version_spellings_never_grows_the_render_cache(tmp_path: Path) -> None:
    """A thousand spellings of a version, over HTTP: every answer carries a known Content-Type, and after the next
    poll the agent renders only the known variants that were served, never one per spelling."""
    sim = SimAgent(tmp_path, scenario="mixed", gpus=8)
    cache = CachedExposition(sim.agent.store)
    app = make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: "", cached_metrics_app(cache, lambda e, s: []))
    server = HttpServer("127.0.0.1", 0, app, None)
    server.start()
    try:
        sim.run(2.0)
        spellings = [
            *(f"application/openmetrics-text; version=1.0.{n}" for n in range(300)),
            *(f"text/plain; version=1.{n}" for n in range(300)),
            *(f"application/openmetrics-text; version={n}.0.0" for n in range(2, 300)),
            *(f"text/plain; version=1.0.0; escaping=e{n}" for n in range(100)),
        ]
        served: set[tuple[str, bool]] = set()
        for n, accept in enumerate(spellings):
            status, content_type, _ = fetch(server.port, accept, gzip_ok=n % 2 == 0)
            assert status == 200
            served.add((content_type, n % 2 == 0))
        # only the known versions among the spellings (1.0.0, the unknown escapings as underscores) and text 0.0.4
        assert {content_type for content_type, _ in served} == {
            TEXT_004,
            "text/plain; version=1.0.0; charset=utf-8; escaping=underscores",
            "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores",
        }
        assert len(known_content_types()) == 10
        sim.run(2.0)  # polls changed the store: the poll thread's prerender runs
        rendered = []
        real = cache._body_locked

        def counting(*args: object, **kwargs: object) -> bytes:
            rendered.append(args[2])
            return real(*args, **kwargs)  # type: ignore[arg-type]

        cache._body_locked = counting  # type: ignore[method-assign]
        cache.prerender()
        assert len(rendered) == len(served) <= 6, rendered  # the variants served, not one per spelling
    finally:
        server.stop()
        sim.close()
