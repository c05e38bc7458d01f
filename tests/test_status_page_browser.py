"""The agent's landing page, rendered by one headless Chromium (tests/cdp.py: one browser process, a tab per page)
from real `gpuwatch run` agents, one per simulated scenario: every fault scenario's page names the fault, the GPU (or
the node) and what to do, linking the runbook of the alert whose condition it is; the healthy ones read healthy.
Screenshots are kept in pytest's tmp dir (printed with -s) for a person to look at, never committed."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from cdp import Browser, save
from ports import free_port_range


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("chromium is missing: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


def _agent(tmp: Path, scenario: str, port: int, probe_interval: float = 5) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
            *("--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp / f"state-{scenario}"), "--poll-interval", "2"),
            *("--probe-interval", str(probe_interval)),
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


# What each scenario's page must say: (GPU row or "node", the finding's words, the alert whose runbook it links).
EXPECTED: dict[str, list[tuple[int | str, str, str]]] = {
    "mixed": [
        (2, "overheating: ", "GpuOverheating"),
        (5, "power-capped: limit 500 W, default 700 W", "GpuPowerLimitBelowDefault"),
        (6, "% of its baseline", "GpuUnderperforming"),  # slow once its baseline is learnt (5 probes)
    ],
    "overheating": [(2, "overheating: ", "GpuOverheating")],
    "memory_overheating": [(2, "memory hot: ", "GpuMemoryTemperatureHigh")],
    "thermal_throttling": [(2, "thermal throttling", "GpuThermalThrottling")],
    "power_brake": [(2, "power brake", "GpuPowerBrakeSlowdown")],
    "power_limit_low": [(2, "power-capped: limit 450 W, default 700 W", "GpuPowerLimitBelowDefault")],
    "psu_undervoltage": [
        ("node", "rail vout1 (pmbus-i2c-7-58) 11.20 V, below its limit 11.60 V", "HostPsuRailUndervoltage"),
        (0, "power brake", "GpuPowerBrakeSlowdown"),
    ],
    "underperforming": [(2, "% of its baseline", "GpuUnderperforming")],
    "corrupt": [(2, "probe(s) computed a wrong result", "GpuComputeErrors")],
    "fabric_degraded": [(2, "NVLink fabric health: degraded bandwidth, limited capacity", "GpuFabricDegraded")],
    "ib_port_down": [("node", "network port mlx5_2/1 (beside GPU 2) is down", "HostNetworkPortDown")],
    "ib_flapping": [
        ("node", "network port mlx5_2/1 (beside GPU 2) went down", "HostNetworkPortFlapping"),
        ("node", "network port mlx5_2/1 (beside GPU 2) counted", "HostNetworkPortErrors"),
    ],
    "pcie_degraded": [(2, "PCIe link downtrained: gen 3 x8 of gen 5 x16", "GpuPcieLinkDegraded")],
    "xid": [(2, "XID 79 (GPU has fallen off the bus)", "GpuXidCritical")],
    "ecc_uncorrectable": [(2, "uncorrectable ECC errors", "GpuEccUncorrectable")],
    "row_remap_failure": [(2, "row remap failed", "GpuRowRemapFailure")],
    "gpu_lost": [(2, "lost: ", "GpuLost")],
    "backend_down": [("node", "none of the 8 expected NVIDIA GPUs can be read", "GpuBackendDown")],
    "nvml_hang": [
        (
            "node",
            "the nvml call nvmlDeviceGetTemperature on GPU 2 (NVIDIA H100 80GB HBM3, GPU-",
            "GpuwatchVendorCallHung",
        ),
        (2, "not readable: vendor call hung: nvmlDeviceGetTemperature on this GPU", "GpuwatchVendorCallHung"),
    ],
}
HEALTHY = ("healthy", "busy")
# The others run without the probe: 16 agents' probe children on a small CI box.
PROBED = ("mixed", "underperforming", "corrupt")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], str]]]:
    """Every scenario's agent at once (one each), so the module waits for the slowest fault, not for their sum."""
    tmp = tmp_path_factory.mktemp("nodes")
    # Ports reserved together below the ephemeral range: a port picked one at a time could be handed to the next
    # agent too, or taken by a client socket before its agent binds it (an agent then exited 69 under load).
    scenarios = (*EXPECTED, *HEALTHY)
    first = free_port_range(len(scenarios))
    running = {s: _agent(tmp, s, first + i, 5 if s in PROBED else 0) for i, s in enumerate(scenarios)}
    try:
        yield running
    finally:
        for proc, _ in running.values():
            _stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(_chromium())
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


class Page(HTMLParser):
    """The node findings (<ul id="node">) and each GPU row's class and text, from the DOM Chromium rendered."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, tuple[str, str]] = {}
        self.node = ""
        self.runbooks: list[str] = []
        self.summary = ""
        self._where: str | int | None = None
        self._cls = ""
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        ident = a.get("id") or ""
        if tag == "tr" and ident.startswith("gpu-"):
            self._where, self._cls, self._text = int(ident[4:]), a.get("class") or "", []
        elif tag in ("ul", "p") and ident in ("node", "summary"):
            self._where, self._text = ident, []
        if tag == "a" and "runbooks#" in (a.get("href") or ""):
            self.runbooks.append(a.get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        text = " ".join(self._text)
        if tag == "tr" and isinstance(self._where, int):
            self.rows[self._where] = (self._cls, text)
            self._where = None
        elif tag == "ul" and self._where == "node":
            self.node, self._where = text, None
        elif tag == "p" and self._where == "summary":
            self.summary, self._where = text, None

    def handle_data(self, data: str) -> None:
        if self._where is not None and data.strip():
            self._text.append(data.strip())


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_every_fault_scenario_names_the_fault_the_gpu_and_the_remedy(
    scenario: str, nodes: dict[str, tuple[subprocess.Popen[bytes], str]], browser: Browser, shots: Path
) -> None:
    proc, url = nodes[scenario]
    for _, words, _ in EXPECTED[scenario]:
        _page_when(url, proc, html.escape(words, quote=False), timeout=90)
    dom, png = browser.page(url)
    shot = save(shots / f"{scenario}.png", png)
    print(f"\nscreenshot: {shot}")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    page = Page()
    page.feed(dom)
    for where, words, alert in EXPECTED[scenario]:
        text = page.node if where == "node" else page.rows[int(where)][1]
        assert words in text, (where, text)
        # the remedy right after it, and the runbook of the alert whose condition it is
        after = text[text.index(words) :]
        assert "what to do:" in after and f"runbook: {alert}" in after, (where, after)
        # relative to the page, so it works behind any host, port, TLS or path prefix; the agent itself serves it
        href = next((h for h in page.runbooks if h.endswith(f"runbooks#{alert.lower()}")), None)
        assert href == f"./runbooks#{alert.lower()}", page.runbooks
        with urllib.request.urlopen(urllib.parse.urljoin(url, href), timeout=10) as reply:
            assert f'<h2 id="{alert.lower()}">{alert}</h2>' in reply.read().decode()
        if isinstance(where, int):
            assert page.rows[where][0] in ("row-bad", "row-warn"), page.rows[where]
    assert "healthy" not in page.summary.split(";")[0] or scenario == "mixed", page.summary
    if scenario == "mixed":
        for healthy in (0, 1, 3, 4, 7):
            cls, text = page.rows[healthy]
            assert cls == "" and "ok" in text.split(), (healthy, text)
        assert "3 of 8 GPUs need attention" in page.summary, page.summary
    if scenario == "backend_down":
        assert "no GPU seen of 8 expected" in page.summary, page.summary
    if scenario == "nvml_hang":  # the hang first; every GPU frozen by it, none lost
        assert page.summary.startswith("GPU readings frozen: the nvml call nvmlDeviceGetTemperature on GPU 2 hangs")
        assert page.node.startswith("the nvml call nvmlDeviceGetTemperature on GPU 2 ("), page.node
        assert all("not readable: vendor call hung" in text for _, text in page.rows.values()), page.rows
        assert "lost: " not in dom and "runbooks#gpulost" not in dom
    if scenario == "psu_undervoltage":  # the host's rails against their limits, the sagging one marked
        assert re.search(r'<tr class="row-bad"><td class="l">vout1 .*?11\.20 V', dom), dom


@pytest.mark.parametrize(("width", "media"), [(1280, "screen"), (1000, "print")])
def test_the_page_fits_a_laptop_screen_and_a_printed_page(
    width: int, media: str, nodes: dict[str, tuple[subprocess.Popen[bytes], str]], browser: Browser, shots: Path
) -> None:
    """The mixed node's page (three GPUs with findings, probe results) needs no horizontal scrolling in a 1,280 px
    window, and printed (landscape A4 at 96 dpi, less the page's margins: about 1,000 CSS px) nothing is cut off:
    every column of the GPU table is on the page."""
    proc, url = nodes["mixed"]
    _page_when(url, proc, "3 of 8 GPUs need attention", timeout=90)
    _, png = browser.page(url, width=width, media=media)
    print(f"\nscreenshot: {save(shots / f'mixed-{width}-{media}.png', png)}")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    measured = _measure(browser, url, width, media)
    assert measured["page"] <= measured["window"], measured
    assert all(right <= measured["window"] for right in measured["columns"]), measured


def _measure(browser: Browser, url: str, width: int, media: str) -> dict[str, Any]:
    """The document's scroll width, the window's width and the right edge of every GPU table header cell."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        browser.call("Emulation.setDeviceMetricsOverride", metrics, session)
        browser.call("Emulation.setEmulatedMedia", {"media": media}, session)
        browser.call("Page.navigate", {"url": url}, session)
        expression = (
            "document.readyState === 'complete' && document.querySelector('table') ? JSON.stringify({"
            "page: document.documentElement.scrollWidth, window: window.innerWidth, columns: "
            "[...document.querySelector('table').rows[0].cells].map(c => c.getBoundingClientRect().right)}) : null"
        )
        deadline = time.monotonic() + 30
        while True:
            value = browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
            found = value["result"].get("value")
            if isinstance(found, str):
                return dict(json.loads(found))
            assert time.monotonic() < deadline, f"{url} never loaded at {width} px"
            time.sleep(0.1)
    finally:
        browser.call("Target.closeTarget", {"targetId": target})


@pytest.mark.parametrize("scenario", HEALTHY)
def test_healthy_nodes_read_healthy(
    scenario: str, nodes: dict[str, tuple[subprocess.Popen[bytes], str]], browser: Browser, shots: Path
) -> None:
    proc, url = nodes[scenario]
    _page_when(url, proc, "GPUs healthy")
    dom, png = browser.page(url)
    save(shots / f"{scenario}.png", png)
    page = Page()
    page.feed(dom)
    assert page.summary == "All 8 GPUs healthy.", page.summary
    assert sorted(page.rows) == list(range(8)) and all(cls == "" for cls, _ in page.rows.values()), page.rows
    assert page.node == "" and "/metrics" in dom


# --- health flags, without a browser -----------------------------------------------------------------------------


def _view(probe_age_s: float | None, ecc_uncorrected: int = 0) -> object:
    import dataclasses

    from gpuwatch.core.model import GpuIdentity, GpuSample
    from gpuwatch.judge.findings import GpuView
    from gpuwatch.state.probebook import ProbeOutcome, ProbeView, WorkerResult
    from gpuwatch.state.store import SampleStore

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
    from gpuwatch.judge.findings import health_flags

    fresh = [f.text for f in health_flags(_view(probe_age_s=300))]  # type: ignore[arg-type]
    assert any(t.startswith("slow probe: 80%") for t in fresh), fresh
    # a GPU too busy to be probed for hours keeps its old slow result: it judges nothing any more
    stale = [f.text for f in health_flags(_view(probe_age_s=3 * 600))]  # type: ignore[arg-type]
    assert not any("slow probe" in t for t in stale), stale


def test_a_lifetime_count_of_uncorrectable_ecc_errors_is_a_warning() -> None:
    from gpuwatch.judge.findings import health_flags

    flags = health_flags(_view(probe_age_s=None, ecc_uncorrected=3))  # type: ignore[arg-type]
    ecc = [f for f in flags if "ECC" in f.text]
    assert [(f.level, f.text) for f in ecc] == [("warn", "3 uncorrectable ECC errors (lifetime count)")]


def test_the_runbooks_page_opens_at_its_alert_and_leads_back(
    nodes: dict[str, tuple[subprocess.Popen[bytes], str]], browser: Browser, shots: Path
) -> None:
    """A runbook link as the on-call follows it: Chromium opens the agent's /runbooks at the alert's section (every
    alert has one, default and opt-in), under the page's Content-Security-Policy, with the way back to the status
    page."""
    from promrules import every_alert_rule

    _, url = nodes["healthy"]
    dom, png = browser.page(url + "runbooks#gpuoverheating")
    save(shots / "runbooks.png", png)
    ids = set(re.findall(r'<h2 id="([^"]+)"', dom))
    assert {rule["alert"].lower() for _, rule in every_alert_rule()} <= ids, sorted(ids)
    assert '<a href="./">' in dom and "<script" not in dom
