"""The `nvml_hang` scenario end to end (issue 30): after the agent's first polls, the simulated NVML's temperature
call on GPU 2 never returns. A hung poll must not read as missing or lost GPUs; the first page names the hang, the
call and the GPU, and so do the agent's status page and /health/gpus (every GPU not readable, none lost); /metrics
keeps answering; and SIGTERM still stops the agent at once (README: within 2 s, even while a vendor call hangs). A
real agent process, scraped by a real Prometheus with the shipped rules unchanged."""

from __future__ import annotations

import html
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from processes import stop, wait_until_ready

from gpuwatch.simulated.plans import HANG_AFTER_S

PROM_DIR = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
STUCK = "gpuwatch_vendor_call_stuck_since_timestamp_seconds"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"http://{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return list(json.loads(_get(url))["data"]["result"])


def _value(text: str, name: str) -> str | None:
    return next((line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")), None)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing (apt-get install prometheus)")
def test_a_hung_nvml_call_pages_by_name_and_no_gpu_reads_as_lost(tmp_path: Path) -> None:
    agent_port, prom_port = free_port(), free_port()
    log = (tmp_path / "agent.log").open("wb")  # APScheduler says every skipped poll: a pipe nobody reads would fill
    agent = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", "nvml_hang"),
            *("--listen", f"127.0.0.1:{agent_port}", "--state-dir", str(tmp_path / "state"), "--probe-interval", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROM_DIR / "gpuwatch-rules.yml"), str(PROM_DIR / "gpuwatch-alerts.yml")],
        "scrape_configs": [
            {
                "job_name": "gpuwatch",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"], "labels": {"node": "hung-node"}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    prom = f"127.0.0.1:{prom_port}"
    try:
        wait_until_ready(f"http://127.0.0.1:{agent_port}/healthz", agent, "gpuwatch")
        wait_until_ready(f"http://{prom}/-/ready", prometheus, "prometheus")
        started = time.monotonic()
        seen_stuck: list[str] = []
        firing: list[dict[str, Any]] = []
        pages_checked = False
        while not firing:
            assert time.monotonic() - started < 120, f"GpuwatchVendorCallHung never fired; stuck series: {seen_stuck}"
            before = time.monotonic()
            text = _get(f"http://127.0.0.1:{agent_port}/metrics")
            assert time.monotonic() - before < 2.0, "a scrape must never wait on the hung call"
            assert _value(text, "gpuwatch_gpus_detected") == "8.0", "a hang must not read as missing GPUs"
            seen_stuck = [line for line in text.splitlines() if line.startswith(STUCK + "{")]
            alerts = _query(prom, 'ALERTS{alertname=~"GpuwatchVendorCallHung|GpuLost|GpuCountBelowExpected"}')
            assert not [a for a in alerts if a["metric"]["alertname"] != "GpuwatchVendorCallHung"], alerts
            firing = [a for a in alerts if a["metric"].get("alertstate") == "firing"]
            if seen_stuck and not pages_checked:  # as soon as the hang is known, not only once it pages
                _assert_the_pages_name_the_hang(f"http://127.0.0.1:{agent_port}", seen_stuck[0])
                pages_checked = True
            time.sleep(1.0)
        # The hang began HANG_AFTER_S into the node's life, and pages once it has lasted 30 s.
        assert time.monotonic() - started >= 30 - HANG_AFTER_S - 5
        assert len(seen_stuck) == 1 and 'call="nvmlDeviceGetTemperature"' in seen_stuck[0], seen_stuck
        assert 'gpu="2"' in seen_stuck[0] and 'backend="nvml"' in seen_stuck[0], seen_stuck
        (alert,) = [a for a in _get_alerts(prom) if a["labels"]["alertname"] == "GpuwatchVendorCallHung"]
        summary = alert["annotations"]["summary"]
        assert summary.startswith("hung-node: the nvml call nvmlDeviceGetTemperature on GPU 2 (NVIDIA H100"), summary
        assert "the node's GPU readings are frozen" in summary
        page_when_paged = _assert_the_pages_name_the_hang(f"http://127.0.0.1:{agent_port}", seen_stuck[0])
        lasted = re.search(r"has not returned for (\d+) s", page_when_paged)
        assert lasted is not None and int(lasted.group(1)) >= 30, page_when_paged
        # SIGTERM with a poll thread still inside the hung call: gone at once, exit 0 (the call never returns).
        sent = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        assert time.monotonic() - sent < 2.0
    finally:
        stop(agent)
        stop(prometheus)
        log.close()


def _get_alerts(prometheus: str) -> list[dict[str, Any]]:
    return list(json.loads(_get(f"http://{prometheus}/api/v1/alerts"))["data"]["alerts"])


def _assert_the_pages_name_the_hang(agent: str, stuck_series: str) -> str:
    """The status page's first finding and /health/gpus's first line name the call, the GPU and its UUID (the agent's
    own stuck series says which), with the runbook's remedy; every GPU reads "not readable: vendor call hung", none
    lost or missing. Returns the page."""
    uuid = re.search(r'uuid="([^"]+)"', stuck_series)
    assert uuid is not None, stuck_series
    named = f"the nvml call nvmlDeviceGetTemperature on GPU 2 (NVIDIA H100 80GB HBM3, {uuid.group(1)}) has not returned"

    with pytest.raises(urllib.error.HTTPError) as refused:  # 503: a scheduler puts no job on a GPU it cannot read
        _get(f"{agent}/health/gpus")
    assert refused.value.code == 503
    lines = refused.value.read().decode().splitlines()
    assert lines[0].startswith(f"node: {named} for "), lines
    hung_call = "not readable: vendor call hung: nvmlDeviceGetTemperature"
    for i, line in enumerate(sorted(lines[1:])):  # each GPU the hang froze, the one in the call named as such
        where = "on this GPU for " if i == 2 else "on GPU 2, so no GPU of the node is read; "
        assert line.startswith(f"GPU {i}: {hung_call} {where}"), lines
    assert len(lines) == 9 and {line.split(":", 1)[0] for line in lines[1:]} == {f"GPU {i}" for i in range(8)}, lines
    assert not [line for line in lines if "lost" in line or "expected GPUs detected" in line], lines

    page = html.unescape(_get(f"{agent}/"))
    summary = re.search(r'<p class="summary" id="summary">(.*?)</p>', page)
    assert summary is not None and summary.group(1).startswith(
        "<b>GPU readings frozen: the nvml call nvmlDeviceGetTemperature on GPU 2 hangs</b>"
    ), page
    first = re.search(r'<ul class="findings" id="node"><li>(.*?)</li>', page)
    assert first is not None, page
    assert f'<span class="flag bad">{named} for ' in first.group(1), first.group(1)
    remedy = first.group(1)
    for words in (
        "what to do: the driver is stuck",
        "nvidia-smi (it will likely hang too)",
        "dmesg for XIDs",
        "nvidia-smi -r -i 2",
        "else reboot the node",
        'href="./runbooks#gpuwatchvendorcallhung"',
    ):
        assert words in remedy, (words, remedy)
    rows = dict(re.findall(r'<tr class="row-(?:bad|warn)" id="gpu-(\d)">(.*?)</tr>', page))
    assert sorted(rows) == [str(i) for i in range(8)], page
    assert all("not readable: vendor call hung: nvmlDeviceGetTemperature" in row for row in rows.values()), rows
    assert "on this GPU for " in rows["2"] and 'class="row-bad" id="gpu-2"' in page, rows["2"]
    assert "lost: " not in page and "runbooks#gpulost" not in page and "expected GPUs detected" not in page
    return page
