#!/usr/bin/env python3
"""The exporter under HTTP abuse: bursts of concurrent scrapes, with and without slow clients holding connections.

Run by hand, never by the test suite (tests/test_reliability_http.py checks the behaviour with loose bounds). It starts
`gpuwatch run` on a simulated 8-GPU node as a child process, then fires `--concurrency` scrapes at once (a fresh
connection each, as Prometheus does), `--rounds` times, and reports the latency percentiles; then the same while
`--slow-clients` connections trickle one byte a second (slowloris). Exit 1 when a scrape failed or the p99 of a phase
exceeds `--target-p99` (issue #9: 200 concurrent scrapes all answered with p99 under 1 s).

    python benchmarks/http_abuse.py                       # 200 concurrent × 5 rounds, then with 50 slow clients
    python benchmarks/http_abuse.py --json                # machine-readable
    python benchmarks/http_abuse.py --concurrency 500 --target-p99 2
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int, path: str = "/metrics") -> tuple[bool, float]:
    started = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        ok = response.status == 200 and len(response.read()) > 0
        conn.close()
    except OSError:
        ok = False
    return ok, time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def burst_phase(port: int, concurrency: int, rounds: int) -> dict[str, float]:
    latencies: list[float] = []
    failures = 0
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for _ in range(rounds):
            for ok, seconds in pool.map(lambda _: scrape(port), range(concurrency)):
                failures += not ok
                latencies.append(seconds)
            time.sleep(0.5)
    return {
        "scrapes": len(latencies),
        "failed": failures,
        "p50_s": statistics.median(latencies),
        "p90_s": percentile(latencies, 0.90),
        "p99_s": percentile(latencies, 0.99),
        "max_s": max(latencies),
    }


class Slowloris:
    """`count` connections that send a request one byte a second and never finish it."""

    def __init__(self, port: int, count: int) -> None:
        self._socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        for byte in request:
            if self._stop.wait(1.0):
                return
            for sock in list(self._socks):
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    self._socks.remove(sock)  # the server cut it off (its client timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self._socks:
            sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slow-clients", type=int, default=50)
    parser.add_argument("--target-p99", type=float, default=1.0, help="seconds (default 1)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as state, tempfile.NamedTemporaryFile("w", suffix=".toml") as config:
        config.write(f'[simulated]\nscenario = "mixed"\ngpus = {args.gpus}\n')
        config.flush()
        argv = [sys.executable, "-m", "gpuwatch", "run", "--config", config.name, "--backend", "simulated"]
        argv += ["--listen", f"127.0.0.1:{port}", "--state-dir", state, "--log-level", "warning"]
        agent = subprocess.Popen(argv, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not scrape(port, "/healthz")[0]:
                if agent.poll() is not None or time.monotonic() > deadline:
                    print("the agent did not become healthy", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            time.sleep(2.0)
            results = {"burst": burst_phase(port, args.concurrency, args.rounds)}
            slow = Slowloris(port, args.slow_clients)
            try:
                results["burst_with_slow_clients"] = burst_phase(port, args.concurrency, args.rounds)
            finally:
                slow.close()
        finally:
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(timeout=10)
    results["setup"] = {
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "slow_clients": args.slow_clients,
        "gpus": args.gpus,
        "cpus": os.cpu_count() or 0,
        "target_p99_s": args.target_p99,
    }
    passed = all(r["failed"] == 0 and r["p99_s"] <= args.target_p99 for k, r in results.items() if k != "setup")
    if args.json:
        print(json.dumps({**results, "passed": passed}, indent=2))
    else:
        for name, r in results.items():
            if name == "setup":
                continue
            print(
                f"{name:>24}: {r['scrapes']:.0f} scrapes, {r['failed']:.0f} failed, p50 {r['p50_s'] * 1000:.0f} ms, "
                f"p90 {r['p90_s'] * 1000:.0f} ms, p99 {r['p99_s'] * 1000:.0f} ms, max {r['max_s'] * 1000:.0f} ms"
            )
        print(f"target p99 <= {args.target_p99:g} s: {'met' if passed else 'MISSED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
