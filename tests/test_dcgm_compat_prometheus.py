"""dcgm-exporter's own Grafana dashboard keeps working on gpuwatch with `[compat] dcgm = true`: every query of it
(tests/fixtures/dcgm-exporter-dashboard-queries.json, from NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json at
the commit it names) returns data from a real Prometheus (Debian `prometheus`, on loopback) scraping a real
`gpuwatch run` over the simulated node, through the shipped scrape config.

Its template variables are resolved as Grafana does (label_values(metric, label): the label's values on that metric)
and every panel's query runs with them, the GPM ones (DCGM_FI_PROF_*) included. On a node with a MIG GPU (scenario
`mig`) every panel answers too, that GPU once per GPU instance under GPU_I_PROFILE and GPU_I_ID (issue #35).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from processes import stop, wait_until_ready

REPO = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((REPO / "tests" / "fixtures" / "dcgm-exporter-dashboard-queries.json").read_text())
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
# The GPM families the gpm branch adds (issue 17): a DCGM field read from one of them is absent until it is merged.
DEADLINE_SECONDS = 90


def _http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    reply = _http_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert reply["status"] == "success", f"{expr}: {reply}"
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _node_and_prometheus(tmp_path_factory.mktemp("dcgm-compat"), "mixed")


@pytest.fixture(scope="module")
def mig_prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A node running scenario `mig`: GPU 2 split into a 3g.40gb (GPU instance 1, a job in it) and two 2g.20gb."""
    yield from _node_and_prometheus(tmp_path_factory.mktemp("dcgm-compat-mig"), "mig")


def _node_and_prometheus(tmp: Path, scenario: str) -> Iterator[str]:
    """A real `gpuwatch run` over the simulated node with [compat] dcgm, scraped by a real Prometheus: its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            raise RuntimeError("prometheus is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    (tmp / "gpuwatch.toml").write_text('[compat]\ndcgm = true\ndcgm_hostname = "gpu-node-01"\n')
    port = free_port()
    agent = _start(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario, "--gpus", "8"),
            *("--config", str(tmp / "gpuwatch.toml"), "--listen", f"127.0.0.1:{port}", "--poll-interval", "1"),
            *("--probe-interval", "0", "--state-dir", str(tmp / "state"), "--disable-collector", "ipmi"),
        ],
        tmp / "agent.log",
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/healthz", agent, "gpuwatch")
        targets = tmp / "targets.json"
        targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"node": "gpu-node-01"}}]))
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config.pop("rule_files", None)
        config.pop("alerting", None)
        for job in config["scrape_configs"]:
            job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
            for sd in job.get("file_sd_configs", []):
                sd["files"], sd["refresh_interval"] = [str(targets)], "1s"
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        web_port = free_port()
        prom = _start(
            [
                *(binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}"),
                *(f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"),
            ],
            tmp / "prometheus.log",
        )
        url = f"http://127.0.0.1:{web_port}"
        wait_until_ready(f"{url}/-/ready", prom, "prometheus")
        deadline = time.monotonic() + DEADLINE_SECONDS  # the first scrapes of the node
        while time.monotonic() < deadline and not _query(url, "DCGM_FI_DEV_GPU_TEMP"):
            time.sleep(1)
        yield url
    finally:
        if prom is not None:
            stop(prom)
        stop(agent)


def _label_values(url: str, query: str) -> list[str]:
    """Grafana's label_values(metric, label): the values of `label` on the series of `metric`."""
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert match, f"not a label_values() query: {query}"
    metric, label = match.groups()
    params = urllib.parse.urlencode({"match[]": metric})
    values: list[str] = _http_json(f"{url}/api/v1/label/{label}/values?{params}")["data"]
    return values


def _variables(url: str) -> dict[str, str]:
    """Each template variable as Grafana fills all of its values into a regex matcher: regex-escaped, the escapes
    doubled inside PromQL's double-quoted string."""

    def escape(value: str) -> str:
        return re.escape(value).replace("\\", "\\\\")

    return {v["name"]: "|".join(escape(x) for x in _label_values(url, v["query"])) for v in FIXTURE["variables"]}


def _panel_result(url: str, panel: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The panel's query as the dashboard runs it with every instance and GPU selected, and its (non-empty) result,
    waited for a few scrapes."""
    expr = panel["expr"]
    for name, regex in _variables(url).items():
        expr = expr.replace(f"${name}", regex)
    deadline = time.monotonic() + 10
    result = _query(url, expr)
    while not result and time.monotonic() < deadline:
        time.sleep(1)
        result = _query(url, expr)
    assert result, f"{panel['panel']}: no data for {expr}"
    return expr, result


@pytest.mark.parametrize("variable", FIXTURE["variables"], ids=[v["name"] for v in FIXTURE["variables"]])
def test_every_template_variable_lists_values(prometheus_url: str, variable: dict[str, str]) -> None:
    values = _label_values(prometheus_url, variable["query"])
    expected = {"instance": 1, "gpu": 8}[variable["name"]]
    assert len(values) == expected, f"{variable['query']}: {values}"


@pytest.mark.parametrize("panel", FIXTURE["panels"], ids=[panel["panel"] for panel in FIXTURE["panels"]])
def test_every_panel_query_returns_data(prometheus_url: str, panel: dict[str, Any]) -> None:
    """The query as the dashboard runs it with every instance and GPU selected; a per-GPU panel gets all 8 GPUs,
    each with the `gpu` label its legend ("GPU {{gpu}}") shows."""
    _expr, result = _panel_result(prometheus_url, panel)
    if "{{gpu}}" in panel["legendFormat"]:
        assert sorted(int(r["metric"]["gpu"]) for r in result) == list(range(8))


# dcgm-exporter's published dashboard has no panel of its own for MIG (none at the fixture's commit, nor at d5e5f51):
# on a MIG node its panels show each GPU instance as a series of the GPU, under GPU_I_PROFILE and GPU_I_ID, as
# dcgm-exporter's flex mode serves them (gpuwatch/exposition/dcgm_compat.py). Fields NVML does not answer for a GPU in
# MIG mode (its utilization) have no series for that GPU, as DCGM has none.
MIG_GPU, MIG_INSTANCES = "2", {"1": "3g.40gb", "5": "2g.20gb", "6": "2g.20gb"}
NOT_FOR_A_MIG_GPU = {"DCGM_FI_DEV_GPU_UTIL"}


@pytest.mark.parametrize("panel", FIXTURE["panels"], ids=[panel["panel"] for panel in FIXTURE["panels"]])
def test_every_panel_answers_on_a_mig_node_one_series_per_gpu_instance(
    mig_prometheus_url: str, panel: dict[str, Any]
) -> None:
    expr, result = _panel_result(mig_prometheus_url, panel)
    if "{{gpu}}" not in panel["legendFormat"]:
        return
    whole = [r["metric"] for r in result if r["metric"]["gpu"] != MIG_GPU]
    assert sorted(int(m["gpu"]) for m in whole) == [0, 1, 3, 4, 5, 6, 7] and not any("GPU_I_ID" in m for m in whole)
    instances = {r["metric"]["GPU_I_ID"]: r["metric"]["GPU_I_PROFILE"] for r in result if r["metric"]["gpu"] == MIG_GPU}
    if any(field in expr for field in NOT_FOR_A_MIG_GPU):
        assert instances == {}, f"{panel['panel']}: {instances}"
    else:
        assert instances == MIG_INSTANCES, f"{panel['panel']}: {instances}"


def test_a_mig_instance_s_framebuffer_is_its_own(mig_prometheus_url: str) -> None:
    """FB_USED and FB_TOTAL per GPU instance are the instance's (dcgm-exporter issue #512), in MiB."""
    totals = {
        r["metric"]["GPU_I_ID"]: float(r["value"][1])
        for r in _query(mig_prometheus_url, f'DCGM_FI_DEV_FB_TOTAL{{gpu="{MIG_GPU}"}}')
    }
    assert set(totals) == set(MIG_INSTANCES)
    assert 39 * 1024 < totals["1"] < 40 * 1024 and all(19 * 1024 < totals[gi] < 20 * 1024 for gi in ("5", "6"))
    used = {
        r["metric"]["GPU_I_ID"]: float(r["value"][1])
        for r in _query(mig_prometheus_url, f'DCGM_FI_DEV_FB_USED{{gpu="{MIG_GPU}"}}')
    }
    assert used["1"] > 30 * 1024 and used["5"] == used["6"] == 0.0  # the job's instance, and two idle ones


def test_units_match_the_dashboards_axes(prometheus_url: str) -> None:
    """The panels' units hold: "GPU SM Clocks" multiplies DCGM's MHz by 1e6 for its hertz axis (dashboard line 404),
    so it must equal gpuwatch's own hertz; FB in MiB ("decmbytes"), GPU_UTIL in percent 0-100 ("percent")."""
    pairs = {  # DCGM expression -> (gpuwatch's own, the largest difference its rounding leaves)
        "DCGM_FI_DEV_SM_CLOCK * 1000000": ('gpuwatch_gpu_clock_hertz{clock="sm"}', 0),
        "DCGM_FI_DEV_FB_USED * 1048576": ("gpuwatch_gpu_memory_used_bytes", 1048575),  # whole MiB, rounded down
        "DCGM_FI_DEV_GPU_UTIL / 100": ("gpuwatch_gpu_utilization_ratio", 1e-9),
        "DCGM_FI_DEV_POWER_USAGE": ("gpuwatch_gpu_power_watts", 0),
        "DCGM_FI_DEV_GPU_TEMP": ('gpuwatch_gpu_temperature_celsius{sensor="core"}', 0),
    }
    for dcgm, (own, tolerance) in pairs.items():
        # one evaluation, one scrape: joined on the GPU (UUID is dcgm-exporter's name for gpuwatch's uuid)
        expr = f'abs(label_replace({dcgm}, "uuid", "$1", "UUID", "(.*)") - on(uuid) {own})'
        result = _query(prometheus_url, expr)
        assert len(result) == 8, f"{expr}: {result}"
        worst = max(float(r["value"][1]) for r in result)
        assert worst <= tolerance, f"{expr}: differs by {worst}"


def test_labels_are_dcgm_exporters(prometheus_url: str) -> None:
    """The labels dcgm-exporter's rules group by (render_metrics.go:47 at 4.5.3-4.8.2), on every DCGM series."""
    for series in _query(prometheus_url, "DCGM_FI_DEV_GPU_TEMP"):
        labels = series["metric"]
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["Hostname"] == "gpu-node-01"
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert re.fullmatch(r"GPU-[0-9a-f-]{36}", labels["UUID"])
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", labels["pci_bus_id"])
        assert labels["DCGM_FI_DRIVER_VERSION"]
