#!/usr/bin/env python3
"""What it costs a node to run an exporter: scrape latency, response size, series, CPU, memory, threads, fds.

Run by hand, never by the test suite. By default it starts `gpuwatch run` on a simulated 8-GPU node as a child
process, waits for /healthz, scrapes /metrics at a fixed rate the way Prometheus does (a new connection per scrape,
no keep-alive) and measures the child from the outside with psutil, so the numbers are the ones an operator sees.

    python benchmarks/agent_cost.py                                   # simulated 8-GPU mixed node, 60 s at 1/s
    python benchmarks/agent_cost.py -- --backend nvml --poll-interval 1   # the agent on a real GPU node
    python benchmarks/agent_cost.py --target-url http://127.0.0.1:5050/metrics --pid 4242   # a running peer
    python benchmarks/agent_cost.py --exec-per-scrape 'nvidia-smi --query-gpu=... --format=csv'
    python benchmarks/agent_cost.py --compare a.json b.json c.json    # side by side

Everything after `--` goes to `gpuwatch run` and replaces the default agent flags; `--listen` and `--state-dir` are
added (a free local port, a temporary directory) unless given there. Standard library and psutil only.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import gzip
import http.client
import io
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psutil

DEFAULT_AGENT_ARGS = ["--backend", "simulated", "--scenario", "mixed", "--gpus", "8", "--poll-interval", "1"]
MIB = 1024 * 1024
T = TypeVar("T")
# Prometheus prefers OpenMetrics; we ask every exporter for the classic text format, so one parser reads them all.
ACCEPT_TEXT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


class BenchmarkError(Exception):
    """A failure the user must see as one clear message (and exit status 1), not as a traceback."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM to the benchmark: stop measuring, still clean up the child."""


# --------------------------------------------------------------------------------------------------------------------
# The measured process


@dataclass
class ProcSnapshot:
    """One look at a process tree; CPU includes live descendants and reaped children, so a probe child counts."""

    at: float
    cpu_seconds: float
    rss_bytes: int
    rss_tree_bytes: int
    threads: int
    fds: int | None


def snapshot(proc: psutil.Process) -> ProcSnapshot:
    """Read CPU, memory, threads and fds of `proc` and its descendants in one go (raises psutil.Error if gone)."""
    with proc.oneshot():
        times = proc.cpu_times()
        cpu = times.user + times.system + times.children_user + times.children_system
        rss = proc.memory_info().rss
        threads = proc.num_threads()
        try:
            fds: int | None = proc.num_fds()
        except (psutil.AccessDenied, AttributeError):  # another user's process, or not a Unix system
            fds = None
    rss_tree = rss
    for child in _descendants(proc):
        try:
            with child.oneshot():
                child_times = child.cpu_times()
                cpu += child_times.user + child_times.system
                rss_tree += child.memory_info().rss
        except psutil.Error:  # exited between listing and reading: its time moves to children_* of its parent
            continue
    return ProcSnapshot(time.monotonic(), cpu, rss, rss_tree, threads, fds)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


# --------------------------------------------------------------------------------------------------------------------
# The child agent


class Agent:
    """`gpuwatch run` as a child in its own session, output to a file (a full pipe must never stall the agent)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        # Lives as long as the child; closed in stop().
        self._log = tempfile.TemporaryFile(prefix="gpuwatch-bench-")  # noqa: SIM115
        try:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            self._log.close()
            raise BenchmarkError(f"cannot start {shlex.join(argv)}: {exc} (see --agent-cmd)") from None
        self._stopped = False
        self.stop_seconds: float | None = None
        self.exit_status: int | None = None

    def exited(self) -> int | None:
        return self.popen.poll()

    def output(self, limit: int = 8000) -> str:
        """The last `limit` characters the agent printed: the reason it failed, usually."""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        return text[-limit:]

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL to the whole process group after `grace` s; records how long the stop took."""
        if self._stopped:
            return
        self._stopped = True
        if self.popen.poll() is None:
            started = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
                self.stop_seconds = time.monotonic() - started
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        # Anything the agent left behind in its group (a probe child) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.exit_status = self.popen.returncode
        self._log.close()


def free_port() -> int:
    """A port nobody listens on now (the agent binds it a moment later; a race we accept for a bench tool)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def agent_argv(agent_cmd: str, agent_args: list[str], state_dir: str) -> tuple[list[str], str, bool]:
    """The child's argv, the base URL it will serve on, and whether it is gpuwatch (so has /healthz).

    A command with `{port}` in it is some other exporter (nvitop-exporter): we fill in a free port, add no flags of
    ours, and take its first 200 on /metrics as ready. Otherwise it is gpuwatch and gets `--listen` and `--state-dir`.
    """
    cmd_text = agent_cmd.replace("{python}", shlex.quote(sys.executable))
    if "{port}" in cmd_text:
        port = free_port()
        cmd = shlex.split(cmd_text.replace("{port}", str(port)))
        return [*cmd, *agent_args], f"http://127.0.0.1:{port}", False
    args = list(agent_args) if agent_args else list(DEFAULT_AGENT_ARGS)
    listen = _flag_value(args, "--listen")
    if listen is None:
        listen = f"127.0.0.1:{free_port()}"
        args += ["--listen", listen]
    if not _has_flag(args, "--state-dir"):
        args += ["--state-dir", state_dir]
    host, _, port_text = listen.rpartition(":")
    if port_text == "0":
        raise BenchmarkError("--listen with port 0: the benchmark cannot learn the port; give a real one")
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    netloc = f"[{host}]:{port_text}" if ":" in host else f"{host}:{port_text}"
    return [*shlex.split(cmd_text), *args], f"http://{netloc}", True


# --------------------------------------------------------------------------------------------------------------------
# Scraping


@dataclass
class Target:
    """Where and how to scrape: parsed once, so each scrape only opens a connection."""

    url: str
    gzip: bool
    timeout: float

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchmarkError(f"{self.url!r} is not an http(s) URL")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Connection": "close", "Accept": ACCEPT_TEXT, "User-Agent": "gpuwatch-agent-cost/1"}
        self.headers["Accept-Encoding"] = "gzip" if self.gzip else "identity"
        if parts.username is not None:
            token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()

    def with_path(self, path: str) -> Target:
        parts = urllib.parse.urlsplit(self.url)
        return Target(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")), self.gzip, self.timeout)


@dataclass
class Scrape:
    """One request: wall time from connect to last body byte, what came back, and any failure."""

    started: float
    seconds: float
    status: int | None
    wire_bytes: int
    body: bytes | None
    error: str | None


def scrape(target: Target) -> Scrape:
    """GET once on a fresh connection (Connection: close), read the whole body, like a Prometheus scrape."""
    conn_class = http.client.HTTPSConnection if target.https else http.client.HTTPConnection
    conn = conn_class(target.host, target.port, timeout=target.timeout)
    started = time.perf_counter()
    try:
        conn.request("GET", target.path, headers=target.headers)
        resp = conn.getresponse()
        raw = resp.read()
        seconds = time.perf_counter() - started
        body = gzip.decompress(raw) if resp.getheader("Content-Encoding", "") == "gzip" else raw
        error = None if resp.status == 200 else f"HTTP {resp.status}: {body[:200].decode(errors='replace').strip()}"
        return Scrape(started, seconds, resp.status, len(raw), body, error)
    except (OSError, http.client.HTTPException, EOFError) as exc:
        return Scrape(started, time.perf_counter() - started, None, 0, None, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


class Scraper(threading.Thread):
    """Scrapes on a fixed schedule t0 + i/rate (no drift); a scrape that overruns skips the slots it missed."""

    def __init__(self, target: Target, t0: float, rate: float, until: float, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="scraper")
        self.target, self.t0, self.rate, self.until, self.stop_event = target, t0, rate, until, stop
        self.results: list[Scrape] = []
        self.first_body: bytes | None = None
        self.last_body: bytes | None = None
        self.skipped = 0

    def run(self) -> None:
        period = 1.0 / self.rate if self.rate > 0 else 0.0
        slot = 0
        while not self.stop_event.is_set():
            due = self.t0 + slot * period
            now = time.perf_counter()
            if due >= self.until or (period == 0 and now >= self.until):
                return
            if due > now and self.stop_event.wait(due - now):
                return
            result = scrape(self.target)
            if result.body is not None and result.status == 200:
                if self.first_body is None:
                    self.first_body = result.body
                self.last_body = result.body
            result.body = None  # keep only two bodies in memory
            self.results.append(result)
            slot += 1
            if period:
                behind = math.floor((time.perf_counter() - self.t0) / period) + 1 - slot
                if behind > 0:
                    self.skipped += behind
                    slot += behind


def wait_ready(url_target: Target, agent: Agent | None, timeout: float, allow_unhealthy: bool) -> float:
    """Poll until the URL answers 200 (any HTTP answer with allow_unhealthy); returns seconds waited."""
    started = time.monotonic()
    last = "no answer yet"
    while True:
        if agent is not None and agent.exited() is not None:
            raise BenchmarkError(
                f"the agent exited with status {agent.exited()} before it was ready.\n"
                f"command: {shlex.join(agent.argv)}\n--- its output ---\n{agent.output()}"
            )
        result = scrape(url_target)
        if result.status == 200 or (allow_unhealthy and result.status is not None):
            return time.monotonic() - started
        last = result.error or "?"
        if time.monotonic() - started > timeout:
            extra = f"\n--- agent output ---\n{agent.output()}" if agent is not None else ""
            hint = " (pass --allow-unhealthy for a scenario that keeps /healthz at 503)" if result.status else ""
            raise BenchmarkError(f"{url_target.url} not ready after {timeout:.0f} s: {last}{hint}{extra}")
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------------------------------
# Command per scrape (the nvidia-smi baseline)


def _peak_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Follow VmHWM (the kernel's high-water RSS of the exec'ed image) until the command exits.

    ru_maxrss cannot be used: it carries the RSS of the forking Python across exec, so every command would look as big
    as the benchmark itself.
    """
    path = f"/proc/{pid}/status"
    while not done.is_set():
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
                        break
        except OSError:
            return
        done.wait(0.005)


def exec_once(argv: list[str], timeout: float) -> tuple[Scrape, int]:
    """Run the command once, timed; returns what it printed and its peak RSS (bytes, 0 if unknown)."""
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise BenchmarkError(f"cannot run {shlex.join(argv)}: {exc}") from None
    done = threading.Event()
    peak = [0]
    watcher = threading.Thread(target=_peak_rss, args=(proc.pid, done, peak), daemon=True)
    watcher.start()
    error: str | None = None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        error = f"timed out after {timeout} s"
    finally:
        done.set()
    seconds = time.perf_counter() - started
    watcher.join()
    if proc.returncode and error is None:
        error = f"exit {proc.returncode}" + (f": {err[:200].decode(errors='replace').strip()}" if err.strip() else "")
    return Scrape(started, seconds, 200 if error is None else None, len(out), out, error), peak[0]


def run_exec(argv: list[str], duration: float, rate: float, timeout: float, stop: threading.Event) -> dict[str, Any]:
    """Run `argv` once per scrape slot for `duration` s; CPU from the kernel's rusage of the reaped children."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    period = 1.0 / rate if rate > 0 else 0.0
    t0 = time.perf_counter()
    until = t0 + duration
    results: list[Scrape] = []
    first: bytes | None = None
    last: bytes | None = None
    slot = 0
    skipped = 0
    maxrss = 0
    while not stop.is_set():
        due = t0 + slot * period
        now = time.perf_counter()
        if due >= until or (period == 0 and now >= until):
            break
        if due > now and stop.wait(due - now):
            break
        result, rss = exec_once(argv, timeout)
        maxrss = max(maxrss, rss)
        if result.error is None:
            first = first if first is not None else result.body
            last = result.body
        result.body = None
        results.append(result)
        slot += 1
        if period:
            behind = math.floor((time.perf_counter() - t0) / period) + 1 - slot
            if behind > 0:
                skipped += behind
                slot += behind
    # The window is the whole duration, as in the HTTP modes.
    if not stop.is_set() and time.perf_counter() < until:
        stop.wait(until - time.perf_counter())
    window = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "results": results,
        "first": first,
        "last": last,
        "skipped": skipped,
        "window": window,
        "cpu": cpu,
        "maxrss": maxrss,
    }


# --------------------------------------------------------------------------------------------------------------------
# Report


@dataclass
class Report:
    """Everything one run measured; `--json` prints it, `--compare` reads it back."""

    label: str
    mode: str
    command: str | None
    url: str | None
    duration_s: float
    rate_per_s: float
    scrapers: int
    gzip: bool
    startup_s: float | None = None
    scrapes: int = 0
    errors: int = 0
    skipped_slots: int = 0
    first_errors: list[str] = field(default_factory=list)
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    response_bytes: int | None = None
    response_wire_bytes: int | None = None
    series: int | None = None
    series_first: int | None = None
    families: int | None = None
    pid: int | None = None
    window_s: float | None = None
    cpu_seconds: float | None = None
    cpu_seconds_per_minute: float | None = None
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    rss_growth_mib: float | None = None
    rss_max_mib: float | None = None
    rss_tree_end_mib: float | None = None
    threads_start: int | None = None
    threads_end: int | None = None
    fds_start: int | None = None
    fds_end: int | None = None
    stop_s: float | None = None
    exit_status: int | None = None
    notes: list[str] = field(default_factory=list)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), so p99 of 60 samples is not just the max."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def count_series(body: bytes) -> tuple[int, int]:
    """(series, families) of a Prometheus text exposition, counted by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(body.decode()))
    return sum(len(f.samples) for f in families), len(families)


def count_csv_values(body: bytes) -> tuple[int, int]:
    """(values, columns) of a CSV with a header row: what a per-scrape nvidia-smi would turn into series."""
    rows = [r for r in csv.reader(io.StringIO(body.decode(errors="replace"))) if r]
    if len(rows) < 2:
        return 0, len(rows[0]) if rows else 0
    return sum(len(r) for r in rows[1:]), len(rows[0])


def fill_scrapes(
    report: Report, results: list[Scrape], first: bytes | None, last: bytes | None, csv_body: bool
) -> None:
    """Latency percentiles over successful scrapes, sizes and series counts from the first and last bodies."""
    report.scrapes = len(results)
    failed = [r for r in results if r.error is not None]
    report.errors = len(failed)
    report.first_errors = sorted({r.error for r in failed if r.error})[:5]
    ok = sorted(r.seconds * 1000 for r in results if r.error is None)
    if ok:
        report.latency_ms = {
            "p50": round(percentile(ok, 0.50), 3),
            "p90": round(percentile(ok, 0.90), 3),
            "p99": round(percentile(ok, 0.99), 3),
            "max": round(ok[-1], 3),
            "mean": round(sum(ok) / len(ok), 3),
        }
        report.response_wire_bytes = next(r.wire_bytes for r in reversed(results) if r.error is None)
    if last is not None:
        report.response_bytes = len(last)
        try:
            if csv_body:
                report.series, report.families = count_csv_values(last)
                report.series_first = count_csv_values(first)[0] if first is not None else None
            else:
                report.series, report.families = count_series(last)
                report.series_first = count_series(first)[0] if first is not None else None
        except Exception as exc:  # a malformed exposition is a finding, not a crash
            report.notes.append(f"could not parse the response: {type(exc).__name__}: {exc}")
    if report.series_first is not None and report.series_first != report.series:
        report.notes.append(f"series changed during the run: {report.series_first} -> {report.series}")


def fill_process(report: Report, start: ProcSnapshot, end: ProcSnapshot, rss_max: int) -> None:
    window = end.at - start.at
    report.window_s = round(window, 3)
    report.cpu_seconds = round(end.cpu_seconds - start.cpu_seconds, 4)
    report.cpu_seconds_per_minute = round(report.cpu_seconds / window * 60, 4) if window > 0 else None
    report.rss_start_mib = round(start.rss_bytes / MIB, 2)
    report.rss_end_mib = round(end.rss_bytes / MIB, 2)
    report.rss_growth_mib = round((end.rss_bytes - start.rss_bytes) / MIB, 2)
    report.rss_max_mib = round(max(rss_max, end.rss_bytes) / MIB, 2)
    report.rss_tree_end_mib = round(end.rss_tree_bytes / MIB, 2)
    report.threads_start, report.threads_end = start.threads, end.threads
    report.fds_start, report.fds_end = start.fds, end.fds


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("mode", lambda r: r["mode"]),
    ("scrapes (errors)", lambda r: f"{r['scrapes']} ({r['errors']})"),
    ("startup to ready (s)", lambda r: _fmt(r.get("startup_s"))),
    ("latency p50 (ms)", lambda r: _fmt(r["latency_ms"].get("p50"))),
    ("latency p90 (ms)", lambda r: _fmt(r["latency_ms"].get("p90"))),
    ("latency p99 (ms)", lambda r: _fmt(r["latency_ms"].get("p99"))),
    ("latency max (ms)", lambda r: _fmt(r["latency_ms"].get("max"))),
    ("response (bytes)", lambda r: _fmt(r["response_bytes"])),
    ("on the wire (bytes)", lambda r: _fmt(r["response_wire_bytes"])),
    ("series", lambda r: _fmt(r["series"])),
    ("families / columns", lambda r: _fmt(r["families"])),
    ("CPU s per minute", lambda r: _fmt(r["cpu_seconds_per_minute"], 3)),
    ("RSS start (MiB)", lambda r: _fmt(r["rss_start_mib"], 1)),
    ("RSS end (MiB)", lambda r: _fmt(r["rss_end_mib"], 1)),
    ("RSS growth (MiB)", lambda r: _fmt(r["rss_growth_mib"], 2)),
    ("RSS max (MiB)", lambda r: _fmt(r["rss_max_mib"], 1)),
    ("RSS with children (MiB)", lambda r: _fmt(r["rss_tree_end_mib"], 1)),
    ("threads start / end", lambda r: f"{_fmt(r['threads_start'])} / {_fmt(r['threads_end'])}"),
    ("open fds start / end", lambda r: f"{_fmt(r['fds_start'])} / {_fmt(r['fds_end'])}"),
    ("stop after SIGTERM (s)", lambda r: _fmt(r.get("stop_s"))),
]


def table(reports: list[dict[str, Any]]) -> str:
    """A plain text table, one column per run, so runs read side by side."""
    head = ["", *[r["label"] for r in reports]]
    body = [[name, *[str(get(r)) for r in reports]] for name, get in ROWS]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in reports:
        what = r.get("command") or r.get("url")
        lines.append(
            f"\n{r['label']}: {what}\n  {r['duration_s']:.0f} s at {r['rate_per_s']:g}/s x {r['scrapers']} scraper(s), "
            f"gzip {'on' if r['gzip'] else 'off'}, measured window {_fmt(r.get('window_s'))} s, pid {_fmt(r['pid'])}"
        )
        lines += [f"  note: {n}" for n in r.get("notes", [])]
        lines += [f"  error: {e}" for e in r.get("first_errors", [])]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Orchestration


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM to the benchmark behaves like Ctrl-C: raise in the main thread, so every `finally` runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_guarded(prog: str, stopped: str, work: Callable[[], T]) -> T:
    """`work()` with SIGTERM as Ctrl-C; an error or an interrupt ends the script with one line and its exit status
    (1, or 128 + the signal), never a traceback. `stopped` says what was cleaned up (the `finally`s ran)."""
    try:
        with interrupts_as_exceptions():
            return work()
    except BenchmarkError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"{prog}: interrupted; {stopped}", file=sys.stderr)
        raise SystemExit(128 + (exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT)) from None


def measure(
    args: argparse.Namespace, target: Target, proc: psutil.Process | None, agent: Agent | None, report: Report
) -> None:
    """The measured window: scrapers on their schedule, the process sampled each second for peak RSS and liveness."""
    stop = threading.Event()
    start = snapshot(proc) if proc is not None else None
    rss_max = start.rss_bytes if start else 0
    t0 = time.perf_counter() + 0.05
    until = t0 + args.duration
    scrapers = [Scraper(target, t0, args.rate, until, stop) for _ in range(args.scrapers)]
    try:
        for s in scrapers:
            s.start()
        # The window is the whole duration, not up to the last scrape: CPU per minute must not be inflated.
        while any(s.is_alive() for s in scrapers) or time.perf_counter() < until:
            if agent is not None and agent.exited() is not None:
                raise BenchmarkError(
                    f"the agent exited with status {agent.exited()} during the measurement.\n"
                    f"--- its output ---\n{agent.output()}"
                )
            if proc is not None:
                try:
                    rss_max = max(rss_max, proc.memory_info().rss)
                except psutil.Error as exc:
                    raise BenchmarkError(f"process {proc.pid} went away during the measurement: {exc}") from None
            time.sleep(min(0.25, max(0.01, until - time.perf_counter())))
    finally:
        stop.set()
        for s in scrapers:
            s.join(timeout=args.scrape_timeout + 1)
    end = snapshot(proc) if proc is not None else None
    results = sorted((r for s in scrapers for r in s.results), key=lambda r: r.started)
    first = next((s.first_body for s in scrapers if s.first_body is not None), None)
    last = next((s.last_body for s in reversed(scrapers) if s.last_body is not None), None)
    report.skipped_slots = sum(s.skipped for s in scrapers)
    fill_scrapes(report, results, first, last, csv_body=False)
    if start is not None and end is not None:
        fill_process(report, start, end, rss_max)
    if report.skipped_slots:
        report.notes.append(f"{report.skipped_slots} scrape slot(s) skipped: a scrape took longer than the period")


def _default_label(agent_cmd: str) -> str:
    if "gpuwatch" in agent_cmd:
        return "gpuwatch"
    return Path(shlex.split(agent_cmd.replace("{python}", "python"))[0]).name


def run_http(args: argparse.Namespace) -> Report:
    """Start the agent (or attach to a target), wait until ready, warm up, measure, always stop the child."""
    agent: Agent | None = None
    state_dir: tempfile.TemporaryDirectory[str] | None = None
    try:
        if args.target_url:
            url = args.target_url
            if urllib.parse.urlsplit(url).path in ("", "/"):
                url = url.rstrip("/") + "/metrics"
            target = Target(url, args.gzip, args.scrape_timeout)
            ready_target = target
            command = None
        else:
            state_dir = tempfile.TemporaryDirectory(prefix="gpuwatch-bench-state-")
            argv, base, is_gpuwatch = agent_argv(args.agent_cmd, args.agent_args, state_dir.name)
            command = shlex.join(argv)
            target = Target(base + "/metrics", args.gzip, args.scrape_timeout)
            ready_target = target.with_path("/healthz") if is_gpuwatch else target
            print(f"starting: {command}", file=sys.stderr)
            agent = Agent(argv)
        report = Report(
            label=args.label or ("target" if args.target_url else _default_label(args.agent_cmd)),
            mode="attach" if args.target_url else "child",
            command=command,
            url=target.url,
            duration_s=args.duration,
            rate_per_s=args.rate,
            scrapers=args.scrapers,
            gzip=args.gzip,
        )
        pid = agent.popen.pid if agent is not None else args.pid
        proc: psutil.Process | None = None
        if pid is not None:
            try:
                proc = psutil.Process(pid)
            except psutil.Error as exc:
                raise BenchmarkError(f"cannot watch pid {pid}: {exc}") from None
        report.pid = pid
        if proc is None:
            report.notes.append("no --pid given: CPU, memory, threads and fds not measured")
        startup = wait_ready(ready_target, agent, args.ready_timeout, args.allow_unhealthy)
        report.startup_s = round(startup, 3) if agent is not None else None
        print(
            f"ready after {startup:.2f} s; warming up {args.warmup:g} s, then measuring {args.duration:g} s",
            file=sys.stderr,
        )
        if args.warmup > 0:
            deadline = time.monotonic() + args.warmup
            while time.monotonic() < deadline:
                if agent is not None and agent.exited() is not None:
                    raise BenchmarkError(
                        f"the agent exited with status {agent.exited()} while warming up.\n"
                        f"--- its output ---\n{agent.output()}"
                    )
                scrape(target)  # warm the code paths a scrape takes, as a live Prometheus would have
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        measure(args, target, proc, agent, report)
        if agent is not None:
            agent.stop(args.stop_grace)
            report.stop_s = round(agent.stop_seconds, 3) if agent.stop_seconds is not None else None
            report.exit_status = agent.exit_status
            if agent.stop_seconds is None:
                report.notes.append(f"the agent ignored SIGTERM for {args.stop_grace:g} s and was killed")
            elif agent.exit_status not in (0, -signal.SIGTERM):
                report.notes.append(f"the agent exited with status {agent.exit_status} on SIGTERM")
        return report
    finally:
        if agent is not None:
            agent.stop(args.stop_grace)
        if state_dir is not None:
            state_dir.cleanup()


def run_exec_mode(args: argparse.Namespace) -> Report:
    """The baseline with no exporter at all: one command (nvidia-smi) per scrape, its cost taken from rusage."""
    argv = shlex.split(args.exec_per_scrape)
    report = Report(
        label=args.label or Path(argv[0]).name,
        mode="exec per scrape",
        command=shlex.join(argv),
        url=None,
        duration_s=args.duration,
        rate_per_s=args.rate,
        scrapers=1,
        gzip=False,
    )
    exec_once(argv, args.scrape_timeout)  # warm: the first run pays the page cache and, without persistence, the GPU
    stop = threading.Event()
    out = run_exec(argv, args.duration, args.rate, args.scrape_timeout, stop)
    fill_scrapes(report, out["results"], out["first"], out["last"], csv_body=args.exec_csv)
    report.window_s = round(out["window"], 3)
    report.cpu_seconds = round(out["cpu"], 4)
    report.cpu_seconds_per_minute = round(out["cpu"] / out["window"] * 60, 4) if out["window"] > 0 else None
    report.rss_max_mib = round(out["maxrss"] / MIB, 2)
    report.skipped_slots = out["skipped"]
    report.notes.append("CPU is the commands' own user+system time; RSS max is the largest VmHWM of one command")
    if report.skipped_slots:
        report.notes.append(f"{report.skipped_slots} scrape slot(s) skipped: a command took longer than the period")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent_cost.py",
        description="Measure what an exporter costs: scrape latency, size, series, CPU, RSS, threads, fds.",
        epilog="Arguments after `--` go to `gpuwatch run` (default: " + " ".join(DEFAULT_AGENT_ARGS) + ").",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--target-url", metavar="URL", help="measure an exporter already running (its /metrics URL)")
    what.add_argument("--exec-per-scrape", metavar="CMD", help="run CMD once per scrape instead (nvidia-smi baseline)")
    what.add_argument("--compare", nargs="+", metavar="JSON", type=Path, help="print saved runs side by side, exit")
    parser.add_argument("--pid", type=int, help="with --target-url: the process to charge CPU and memory to")
    parser.add_argument(
        "--agent-cmd",
        default="{python} -m gpuwatch run",
        help="how to start the agent (%(default)s); with {port} in it, any exporter, e.g. "
        "'nvitop-exporter --port {port} --interval 1', ready on its first /metrics 200",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (default %(default)s)")
    parser.add_argument("--rate", type=float, default=1.0, help="scrapes per second per scraper; 0 = back to back")
    parser.add_argument(
        "--scrapers",
        "--burst",
        type=int,
        default=1,
        metavar="N",
        help="concurrent scrapers firing together each tick (burst mode; default 1)",
    )
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after ready before measuring (default 5)")
    parser.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for ready (default 60)")
    parser.add_argument("--allow-unhealthy", action="store_true", help="treat /healthz 503 as ready (fault scenarios)")
    parser.add_argument("--scrape-timeout", type=float, default=10.0, help="per scrape (default 10 s)")
    parser.add_argument("--stop-grace", type=float, default=5.0, help="SIGTERM to SIGKILL (default 5 s)")
    parser.add_argument("--gzip", action="store_true", help="ask for gzip like Prometheus does (default identity)")
    parser.add_argument("--exec-csv", action="store_true", help="with --exec-per-scrape: count CSV values as series")
    parser.add_argument("--label", help="column name in the table and in --compare")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--save", type=Path, metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument("agent_args", nargs="*", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Split at `--` ourselves so agent flags never collide with ours."""
    argv = list(argv)
    agent_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, agent_args = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.agent_args:
        parser.error(f"unexpected arguments {args.agent_args}; agent flags go after `--`")
    args.agent_args = agent_args
    if agent_args and (args.target_url or args.exec_per_scrape):
        parser.error("agent flags after `--` make no sense with --target-url or --exec-per-scrape")
    if args.pid is not None and not args.target_url:
        parser.error("--pid goes with --target-url (a child agent is watched by its own pid)")
    if args.duration <= 0 or args.rate < 0 or args.scrapers < 1:
        parser.error("--duration must be > 0, --rate >= 0 and --scrapers >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        try:
            reports = [json.loads(p.read_text()) for p in args.compare]
        except (OSError, ValueError) as exc:
            print(f"agent_cost: cannot read a report: {exc}", file=sys.stderr)
            return 1
        print(table(reports))
        return 0
    report = run_guarded(
        "agent_cost", "the agent was stopped", lambda: run_exec_mode(args) if args.exec_per_scrape else run_http(args)
    )
    data = asdict(report)
    if args.save:
        args.save.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2) if args.json else table([data]))
    return 1 if report.scrapes == 0 or report.errors == report.scrapes else 0


if __name__ == "__main__":
    sys.exit(main())
