"""The agent's landing page, rendered by headless Chromium from a real `gpuwatch run` over the simulated `mixed` node:
the overheating GPU 2 and the power-capped GPU 5 are flagged with their reasons, the healthy GPUs read ok, and the
page links to /metrics. The screenshot is kept in the test's tmp dir for a person to look at."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import free_port

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class Rows(HTMLParser):
    """Collects each GPU row's class and text (rows carry id="gpu-N"), and the page's links."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, tuple[str, str]] = {}
        self.links: list[str] = []
        self._current: int | None = None
        self._text: list[str] = []
        self._cls = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and (a.get("id") or "").startswith("gpu-"):
            self._current, self._cls, self._text = int((a["id"] or "")[4:]), a.get("class") or "", []
        if tag == "a" and a.get("href"):
            self.links.append(a["href"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._current is not None:
            self.rows[self._current] = (self._cls, " ".join(self._text))
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is not None and data.strip():
            self._text.append(data.strip())


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("chromium is missing: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


def _agent(tmp: Path, scenario: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
            *("--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp / f"state-{scenario}"), "--poll-interval", "1"),
            *("--probe-interval", "5"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"http://127.0.0.1:{port}/"


def _page_when(url: str, proc: subprocess.Popen[bytes], ready: str, timeout: float = 60) -> str:
    """The page once it shows `ready` (scenario faults develop over the first seconds)."""
    deadline, page = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"agent exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                page = reply.read().decode()
            if ready in page:
                return page
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"page never showed {ready!r}; last page:\n{page}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def mixed_node(tmp_path: Path) -> Iterator[str]:
    proc, url = _agent(tmp_path, "mixed")
    try:
        _page_when(url, proc, "throttling: hw")  # GPU 2 past its slowdown threshold (flag words, not the legend's)
        _page_when(url, proc, "power-capped: limit")
        yield url
    finally:
        _stop(proc)


def test_mixed_node_in_headless_chromium(mixed_node: str, tmp_path: Path) -> None:
    chromium = _chromium()
    profile = tmp_path / "profile"
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", mixed_node], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    rows = Rows()
    rows.feed(dom)
    assert sorted(rows.rows) == list(range(8)), dom
    cls2, text2 = rows.rows[2]
    assert cls2 == "row-bad" and "hot:" in text2 and "slowdown at 89 °C" in text2 and "throttling" in text2, text2
    assert "hw thermal" in text2  # the reason, in words
    cls5, text5 = rows.rows[5]
    assert cls5 == "row-warn" and "power-capped: limit 500 W, default 700 W" in text5, text5
    for healthy in (0, 1, 3, 4, 7):
        cls, text = rows.rows[healthy]
        assert cls == "" and "ok" in text.split(), (healthy, text)
    assert "/metrics" in rows.links
    assert "GPUs need attention" in dom

    shot = tmp_path / "status.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1400,900", f"--screenshot={shot}", mixed_node],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print(f"\nscreenshot: {shot}")


def test_slow_gpu_is_flagged_once_the_probe_reports(mixed_node: str) -> None:
    """GPU 6 of `mixed` probes 20 % slow; the page says so once the probe has run (against its baseline or peers)."""
    deadline, page = time.monotonic() + 90, ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(mixed_node, timeout=5) as reply:
            page = reply.read().decode()
        if re.search(r"slow probe: \d+%", page):  # a flag's words, not the legend's
            break
        time.sleep(1)
    rows = Rows()
    rows.feed(page)
    _, text6 = rows.rows[6]
    if "off" in text6.split() or "not yet" in text6:
        pytest.xfail(f"the agent serves no probe result yet (issue #4); GPU 6 row reads: {text6}")
    assert "slow probe" in text6, text6


def test_lost_gpu_is_flagged(tmp_path: Path) -> None:
    proc, url = _agent(tmp_path, "gpu_lost")
    try:
        page = _page_when(url, proc, "lost: ")
    finally:
        _stop(proc)
    rows = Rows()
    rows.feed(page)
    cls, text = rows.rows[2]
    assert cls == "row-bad" and "lost:" in text and "no readings" in text, text
    assert all(rows.rows[i][0] == "" for i in (0, 1, 3)), rows.rows


# --- health flags, without a browser -----------------------------------------------------------------------------


def _view(probe_age_s: float | None, ecc_uncorrected: int = 0) -> object:
    import dataclasses

    from gpuwatch.model import GpuIdentity, GpuSample
    from gpuwatch.probebook import ProbeOutcome, ProbeView, WorkerResult
    from gpuwatch.status_page import GpuView
    from gpuwatch.store import SampleStore

    now = 1_000_000.0
    identity = GpuIdentity("GPU-6", "nvidia", 6, model="H100")
    sample = GpuSample("GPU-6", now, ecc_errors_total={"uncorrected": ecc_uncorrected} if ecc_uncorrected else {})
    measured = WorkerResult(
        "torch", "2.5", "12", "bf16", "8192", 5.6e14, 5.5e14, 5.7e14, 0.01, 10, 1.0, False, None, None, "", "cuda:6"
    )
    last_ok = {}
    if probe_age_s is not None:
        last_ok["GPU-6"] = ProbeOutcome(
            "GPU-6", 6, "ok", timestamp=now - probe_age_s, measured=measured, baseline_flops=7e14
        )
    snap = dataclasses.replace(
        SampleStore(poll_interval_seconds=1.0, clock=lambda: now).snapshot(),
        probe=ProbeView(enabled=True, interval_seconds=600.0, last_ok=last_ok),
    )
    return GpuView(identity, sample, "", None, snap)


def test_slow_probe_is_judged_on_fresh_results_only() -> None:
    from gpuwatch.status_page import health_flags

    fresh = [f.text for f in health_flags(_view(probe_age_s=300))]  # type: ignore[arg-type]
    assert any(t.startswith("slow probe: 80%") for t in fresh), fresh
    # a GPU too busy to be probed for hours keeps its old slow result: it judges nothing any more
    stale = [f.text for f in health_flags(_view(probe_age_s=3 * 600))]  # type: ignore[arg-type]
    assert not any("slow probe" in t for t in stale), stale


def test_a_lifetime_count_of_uncorrectable_ecc_errors_is_a_warning() -> None:
    from gpuwatch.status_page import health_flags

    flags = health_flags(_view(probe_age_s=None, ecc_uncorrected=3))  # type: ignore[arg-type]
    ecc = [f for f in flags if "ECC" in f.text]
    assert [(f.level, f.text) for f in ecc] == [("warn", "3 uncorrectable ECC errors (lifetime count)")]
