"""Every dashboard query against a real Prometheus (Debian `prometheus`, on loopback) that scrapes a real
`gpuwatch simulate-fleet` through the shipped scrape config and evaluates the shipped rules: each query runs without
error and returns data — except the few listed in ALLOWED_EMPTY, each with the reason its data cannot exist here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from dashboard_queries import ALLOWED_EMPTY, REPO, PanelQuery, dashboards, panels, queries, substitute
from ports import free_port, free_port_range
from processes import stop, wait_until_ready

DEPLOY = REPO / "deploy" / "prometheus"
NODES = 3
# node-000 is the demo node (GPU 2 hot, GPU 5 power-capped, GPU 6 slow); node-001 GPU 3 logs XIDs 13 and 79;
# node-002 is busy: every GPU has a compute process, in the Slurm job, pod, container, unit or process its simulated
# procfs gives it (gpuwatch/simulated/procfs.py); its GPU 4 is busy but starved of input (utilization 100 %, SM
# active ~13 %: the real-utilization panels). node-001 is an HGX node (NVSwitches, a NIC per GPU) for the network and
# fabric panels: the NIC beside its GPU 5 flaps, its GPU 6's NVLink fabric runs degraded. node-001 runs scenario mig
# besides (its GPU 2 split into a 3g.40gb with a training job and two 2g.20gb) for the MIG instances row.
FAULTS = [
    "0=mixed",
    "1=mig",
    "1/3=xid",
    "1/5=ib_flapping",
    "1/6=fabric_degraded",
    "2=busy",
    "2/4=dataloader_starved",
]

DEADLINE_SECONDS = 240  # rates need two scrapes; the XID alert fires at its first evaluation after the event


def _http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            raise RuntimeError("prometheus is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("dash-e2e")
    targets = tmp / "targets.json"
    port_base = free_port_range(NODES)
    # Probes often enough to learn baselines within the test; a configured limit so its panel has data; each SM pipe
    # (opt-in detail) so the pipes' panel has data.
    fleet_config = tmp / "fleet.toml"
    fleet_config.write_text(
        "[probe]\ninterval_seconds = 3.0\n[gpus]\npower_limit_watts = 700\n[nvml]\ngpm_per_pipe = true\n"
    )
    fleet = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", str(NODES), "--gpus", "8"]
        + ["--port-base", str(port_base), "--targets", str(targets), "--poll-interval", "1"]
        + ["--state-dir", str(tmp / "state"), "--config", str(fleet_config)]
        + [arg for f in FAULTS for arg in ("--fault", f)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "fleet.log", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while not targets.exists() and time.monotonic() < deadline and fleet.poll() is None:
            time.sleep(0.2)
        assert targets.exists(), f"simulate-fleet wrote no targets file: {(tmp / 'fleet.log').read_text()}"
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
        config.pop("alerting", None)  # no Alertmanager here: ALERTS is Prometheus' own series
        for job in config["scrape_configs"]:
            job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
            for sd in job.get("file_sd_configs", []):
                sd["files"], sd["refresh_interval"] = [str(targets)], "1s"
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        web_port = free_port()
        prom = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "prometheus.log", "wb"),  # noqa: SIM115
        )
        url = f"http://127.0.0.1:{web_port}"
        wait_until_ready(f"{url}/-/ready", prom, "prometheus")
        yield url
    finally:
        if prom is not None:
            stop(prom)
        stop(fleet)


def _query(url: str, expr: str) -> list[Any]:
    reply = _http_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert reply["status"] == "success", reply
    result: list[Any] = reply["data"]["result"]
    return result


def test_node_variable_lists_every_node(prometheus_url: str) -> None:
    """The dashboards' node variable is label_values(gpuwatch_gpu_info, node): the relabelled `node` of each target."""
    deadline = time.monotonic() + 60
    nodes: list[str] = []
    while time.monotonic() < deadline:
        match = urllib.parse.urlencode({"match[]": "gpuwatch_gpu_info"})
        nodes = _http_json(f"{prometheus_url}/api/v1/label/node/values?{match}")["data"]
        if len(nodes) == NODES:
            break
        time.sleep(1)
    assert nodes == [f"node-{i:03d}" for i in range(NODES)]


def test_every_query_returns_data(prometheus_url: str) -> None:
    pending: dict[str, tuple[PanelQuery, str]] = {q.key: (q, substitute(q.expr)) for q in queries()}
    allowed = {f"{d} / {p} / {r}": why for (d, p, r), why in ALLOWED_EMPTY.items()}
    unknown_allowed = set(allowed) - set(pending)
    assert not unknown_allowed, f"ALLOWED_EMPTY names queries that no longer exist: {unknown_allowed}"
    answered: dict[str, int] = {}
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        for key, (_, expr) in list(pending.items()):
            reply = _http_json(f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
            assert reply["status"] == "success", f"{key}: {expr}\n{reply}"
            if reply["data"]["result"]:
                answered[key] = len(reply["data"]["result"])
                del pending[key]
        if set(pending) <= set(allowed):
            break
        time.sleep(2)
    missing = {key: expr for key, (_, expr) in pending.items() if key not in allowed}
    assert not missing, "queries without data:\n" + "\n".join(f"{k}: {e}" for k, e in missing.items())
    assert len(answered) >= 40
    print("\nallowed empty and empty:", *(f"  {k}: {allowed[k]}" for k in pending), sep="\n")
    print("allowed empty but answered:", [k for k in allowed if k in answered])


def test_fleet_table_finds_the_faulted_gpus(prometheus_url: str) -> None:
    """The fleet panels single out node-000's hot GPU 2 and power-capped GPU 5, and nothing on the healthy node."""
    by_title = {q.panel: q for q in queries() if q.dashboard == "gpuwatch-fleet.json"}
    deadline = time.monotonic() + 90
    capped: set[tuple[str, str]] = set()
    throttled: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        capped = {
            (r["metric"]["node"], r["metric"]["gpu"])
            for r in _query(prometheus_url, substitute(by_title["Power-capped below default"].expr))
        }
        throttled = {
            (r["metric"]["node"], r["metric"]["gpu"])
            for r in _query(prometheus_url, substitute(by_title["Throttling now (reasons that matter)"].expr))
        }
        if capped and throttled:
            break
        time.sleep(1)
    assert capped == {("node-000", "5")}
    assert throttled == {("node-000", "2")}
    closest = _query(prometheus_url, substitute(by_title["Closest to slowdown (top $topn)"].expr))
    worst = min(closest, key=lambda r: float(r["value"][1]))
    assert (worst["metric"]["node"], worst["metric"]["gpu"]) == ("node-000", "2")
    assert float(worst["value"][1]) <= 0  # at or past its own slowdown threshold


def test_every_query_of_a_table_returns_the_same_labels(prometheus_url: str) -> None:
    """A table merges its queries on their labels: a query whose rows lack one (say `model`) is not joined but
    shown as rows of its own — each GPU twice. So every query of one table must return one and the same label set."""
    tables: dict[tuple[str, str], list[PanelQuery]] = {}
    for board_name, board in dashboards().items():
        for panel in panels(board):
            if panel.get("type") == "table" and len(panel.get("targets", [])) > 1:
                tables[(board_name, panel["title"])] = [
                    PanelQuery(board_name, panel["title"], t["refId"], t["expr"]) for t in panel["targets"]
                ]
    assert tables, "no table merges several queries: this test would prove nothing"
    for (board_name, title), table_queries in tables.items():
        labels: dict[str, set[frozenset[str]]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            labels = {
                q.ref_id: {frozenset(r["metric"]) - {"__name__"} for r in _query(prometheus_url, substitute(q.expr))}
                for q in table_queries
            }
            if all(labels.values()):
                break
            time.sleep(2)
        every = {names for sets in labels.values() for names in sets}
        assert len(every) == 1, f"{board_name} / {title}: the queries return different labels: {labels}"


def test_real_utilization_finds_the_starved_gpu(prometheus_url: str) -> None:
    """Every GPU of the fleet that runs a kernel reads utilization 100 %; the "Busy but barely working" panels single
    out node-002's GPU 4, starved of input (SM active ~13 %), and no other (issue 17's data-loader-starved case)."""
    by_title = {q.panel: q for q in queries() if q.dashboard == "gpuwatch-fleet.json"}
    deadline = time.monotonic() + 90
    starved: set[tuple[str, str]] = set()
    while time.monotonic() < deadline and not starved:
        rows = _query(prometheus_url, substitute(by_title["Busy but barely working (top $topn)"].expr))
        starved = {(r["metric"]["node"], r["metric"]["gpu"]) for r in rows}
        time.sleep(0 if starved else 1)
    assert starved == {("node-002", "4")}
    count = _query(prometheus_url, substitute(by_title["Busy but barely working"].expr))
    assert [float(r["value"][1]) for r in count] == [1.0]
    utilization = _query(prometheus_url, 'gpuwatch_gpu_utilization_ratio{node="node-002", gpu="4"}')
    assert float(utilization[0]["value"][1]) == 1.0
