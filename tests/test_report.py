"""`gpuwatch report`: the case file of GPU 2 of scenario `xid`, from real parts end to end.

A real `gpuwatch run --backend simulated --scenario xid` agent, scraped by a real Prometheus (Debian `prometheus`,
loopback, the shipped scrape job and recording rules), runs until its fault ledger holds GPU 2's XID 79; then it is
stopped and `gpuwatch report` runs in its own process against the state dir it left and against Prometheus. The JSON
twin is checked against what the simulated GPU is (gpuwatch/simulated/physics.py, its node's spec) and against the
ledger; the HTML is opened in a real Chromium and screenshotted; bad input exits 2 or 69 with a message that says
what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdp import Browser, save
from ports import free_port
from processes import stop, wait_until_ready

from gpuwatch.cli.case_history import diag_json
from gpuwatch.core.xid_catalogue import CATALOGUE
from gpuwatch.simulated.physics import NVIDIA_H100
from gpuwatch.simulated.scenarios import SimulatedNode
from gpuwatch.state.ledger import read_ledger

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "prometheus"
GPU = 2
DEADLINE_SECONDS = 120


def _gpuwatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _query(url: str, expr: str) -> list[Any]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
        result: list[Any] = json.loads(r.read())["data"]["result"]
        return result


def _query_at(url: str, expr: str, at: float) -> list[Any]:
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as reply:
        result: list[Any] = json.loads(reply.read())["data"]["result"]
        return result


def _tree(path: Path) -> dict[str, str]:
    """Every file under `path` by name, with a hash of its content and its mtime: what a read-only reader leaves."""
    return {
        str(p.relative_to(path)): f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mtime_ns}"
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class Case:
    state_dir: Path
    prometheus: str
    uuid: str
    document: dict[str, Any]
    html: Path
    run: subprocess.CompletedProcess[str]
    tree_before: dict[str, str]
    tree_after: dict[str, str]


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Case]:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            raise RuntimeError("prometheus is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("report")
    state, agent_port, web_port = tmp / "state", free_port(), free_port()
    targets = tmp / "targets.json"
    targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{agent_port}"], "labels": {"node": "node-000"}}]))
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / "gpuwatch-rules.yml")]  # the recording rules the report queries
    config.pop("alerting", None)
    for job in config["scrape_configs"]:
        job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
        for sd in job.get("file_sd_configs", []):
            sd["files"], sd["refresh_interval"] = [str(targets)], "1s"
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "prometheus.log", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    agent: subprocess.Popen[bytes] | None = None
    url = f"http://127.0.0.1:{web_port}"
    try:
        wait_until_ready(f"{url}/-/ready", prom, "prometheus")
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatch",
                "run",
                "--backend",
                "simulated",
                "--scenario",
                "xid",
                "--state-dir",
                str(state),
                "--listen",
                f"127.0.0.1:{agent_port}",
                "--probe-interval",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "agent.log", "wb"),  # noqa: SIM115
        )
        wait_until_ready(f"http://127.0.0.1:{agent_port}/metrics", agent, "gpuwatch run")
        uuid = SimulatedNode("xid").spec(GPU).uuid
        deadline = time.monotonic() + DEADLINE_SECONDS
        # GPU 2 held in the ledger, and Prometheus holding the fault, its baseline (5 probes) and the fleet's probe
        # median (recording rules).
        while time.monotonic() < deadline:
            held = [f.key for f in read_ledger(state).open_faults(uuid)]
            xid = _query(url, f'gpuwatch_gpu_xid_errors_total{{uuid="{uuid}",xid="79"}}')
            fleet = _query(url, "gpuwatch:probe_flops:fleet_median")
            baseline = _query(url, f'gpuwatch_probe_baseline_flops{{uuid="{uuid}"}}')
            if "XID 79" in held and xid and fleet and baseline:
                break
            assert agent.poll() is None, (tmp / "agent.log").read_text()[-3000:]
            time.sleep(1)
        else:
            raise AssertionError(
                f"GPU {GPU} never held with its history in Prometheus: {(tmp / 'agent.log').read_text()[-3000:]}"
            )
        time.sleep(5)  # a few scrapes after the fault: the plots around it have an after
        stop(agent)
        assert agent.returncode == 0, (tmp / "agent.log").read_text()[-3000:]
        before = _tree(state)
        out = tmp / "out"
        run = _gpuwatch(
            "report", "--gpu", str(GPU), "--backend", "simulated", "--scenario", "xid", "--state-dir", str(state),
            "--out", str(out), "--prometheus", url,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        document = json.loads((out / f"{uuid}.json").read_text())
        yield Case(state, url, uuid, document, out / f"{uuid}.html", run, before, _tree(state))
    finally:
        if agent is not None:
            stop(agent)
        stop(prom)


def test_identity_is_the_simulated_gpus_keyed_as_nvml_names_it(case: Case) -> None:
    """Serial, UUID, VBIOS, board part number, InfoROM and driver, read through the backend at report time: those
    of the simulated node's GPU 2 and its H100 profile (the InfoROM's as the fixture card's nvidia-smi -q says)."""
    spec = SimulatedNode("xid").spec(GPU)
    ident = case.document["identity"]
    assert ident["uuid"] == spec.uuid == case.uuid
    assert ident["serial"] == spec.serial
    assert ident["index"] == GPU
    assert ident["name"] == spec.model == NVIDIA_H100.model
    assert ident["vbios_version"] == spec.vbios_version == NVIDIA_H100.vbios_version
    assert ident["board_part_number"] == spec.board_part_number == NVIDIA_H100.board_part_number
    assert ident["driver_version"] == spec.driver_version == NVIDIA_H100.driver_version
    assert ident["pci_bus_id"] == spec.pci_bus_id
    assert ident["inforom_image_version"] == NVIDIA_H100.inforom_image_version == "G520.0200.00.05"
    assert ident["inforom_oem_object_version"] == NVIDIA_H100.inforom_object_versions["oem"]
    assert ident["inforom_ecc_object_version"] == NVIDIA_H100.inforom_object_versions["ecc"]
    assert ident["inforom_power_object_version"] is None  # the H100 has none: NVML NotSupported
    assert case.document["kind"] == "gpuwatch_case_file" and case.document["scenario"] == "xid"
    assert case.run.stdout.startswith(f"GPU {GPU} ({case.uuid}), serial {spec.serial}:")


def test_the_ledger_and_the_xids(case: Case) -> None:
    """The ledger's faults as the agent left them (open XID 79: reboot_node, its boot and driver); each XID once,
    as {"xid": 79, …} with NVIDIA's catalogue's words; XID 13 known from Prometheus alone (never held)."""
    record = read_ledger(case.state_dir).record(case.uuid)
    assert record is not None
    faults = case.document["ledger"]["faults"]
    assert [f["key"] for f in faults] == [f.key for f in record.faults]
    xid79 = next(f for f in faults if f["key"] == "XID 79")
    kept = record.last("XID 79")
    assert kept is not None
    assert xid79["open"] and xid79["action"] == "reboot_node" and xid79["closed"] is None
    assert xid79["boots"] == list(kept.boots) and xid79["driver_version"] == kept.driver == NVIDIA_H100.driver_version
    assert xid79["at"] == kept.at and xid79["evidence"] == kept.evidence
    xids = {x["xid"]: x for x in case.document["xids"]}
    assert set(xids) == {13, 79}
    mnemonic, description, bucket = CATALOGUE[79]
    assert xids[79]["mnemonic"] == mnemonic and xids[79]["description"] == description
    assert xids[79]["catalogue_action"] == bucket == "RESTART_BM"
    assert xids[79]["action"] == "reboot_node" and xids[79]["alert_class"] == "critical"
    assert xids[79]["sources"] == ["fault ledger", "prometheus"] and xids[79]["count"] == 1
    assert xids[79]["last_timestamp"] == pytest.approx(kept.at, abs=1.0)
    assert xids[13]["sources"] == ["prometheus"] and xids[13]["action"] == "restart_app"
    assert xids[13]["mnemonic"] == CATALOGUE[13][0]
    verdict = case.document["verdict"]
    assert (verdict["state"], verdict["action"]) == ("unhealthy", "reboot_node")
    assert any("held until repaired" in line for line in verdict["evidence"])


def test_memory_probe_and_diag(case: Case) -> None:
    """Row remaps and ECC from a fresh reading; the probe baseline the agent established and the samples it keeps;
    no diag run recorded (the state dir has none)."""
    memory = case.document["memory"]
    assert memory["ecc_enabled"] is True and memory["row_remap_failed"] is False
    assert memory["remapped_rows_total"] == {"correctable": 0, "uncorrectable": 0}
    own = case.document["probe"]["own"]
    baselines = json.loads((case.state_dir / "probe_baselines.json").read_text())["gpus"][case.uuid]
    assert own["baseline_flops"] == baselines["flops"] and own["samples_flops"] == baselines["samples"]
    assert own["key"]["engine"] == "simulated"
    assert case.document["diag"] == {"status": "none", "note": "no diag run recorded", "tests": []}


def test_history_from_prometheus_against_the_fleet_and_around_the_fault(case: Case) -> None:
    """The recording rules the dashboards use: this GPU's fresh throughput, its baseline and the median of its
    peers of the same model; temperature, power and clocks from before to after the XID 79."""
    fleet = case.document["probe"]["fleet"]
    assert fleet["fleet_model"] == NVIDIA_H100.model
    assert fleet["fleet_gpus"] >= 3
    for name in ("probe_flops", "baseline_flops", "fleet_median_flops", "ratio_to_fleet_median"):
        assert fleet["series"][name], name
    ratios = [v for _, v in fleet["series"]["ratio_to_fleet_median"]]
    assert all(0.9 < r < 1.1 for r in ratios), ratios  # GPU 2 computes as fast as its peers
    plots = case.document["around_faults"]["faults"]
    at = read_ledger(case.state_dir).open_faults(case.uuid)[0].at
    plot = next(p for p in plots if p["fault"] == "XID 79")
    assert plot["at"] == at and plot["start"] < at <= plot["end"]
    # Before the fault wherever Prometheus had scraped the agent a plot step before it (the XID comes 5 s after the
    # agent starts: a scrape may or may not have come first), and after it.
    before = f'gpuwatch_gpu_power_watts{{uuid="{case.uuid}"}}'
    scraped_before = bool(_query_at(case.prometheus, before, at - plot["step_seconds"]))
    for name in ("temperature_core_celsius", "power_watts", "sm_clock_hertz"):
        points = plot["series"][name]
        assert any(t < at for t, _ in points) or not scraped_before, name
        assert any(t > at for t, _ in points), name
    assert all(20 < v < 100 for _, v in plot["series"]["temperature_core_celsius"])


def test_the_state_dir_is_read_only(case: Case) -> None:
    assert case.tree_after == case.tree_before


def test_the_case_file_in_chromium(case: Case, tmp_path: Path) -> None:
    """Opened in a real Chromium from the file: the serial, XID 79 with the catalogue's words, the ledger's fault
    held until repaired, and the plots as SVG; nothing outside the file is loaded, no script needed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            raise RuntimeError("chromium is missing: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium not installed (apt-get install chromium)")
    source = case.html.read_text()
    assert "<script" not in source and "<link" not in source and " src=" not in source
    browser = Browser(chromium)
    try:
        dom, png = browser.page(case.html.as_uri())
    finally:
        browser.close()
    shot = save(tmp_path / f"case-file-{case.uuid}.png", png)
    print(f"\nscreenshot: {shot}")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    serial = case.document["identity"]["serial"]
    for text in (serial, "XID 79", CATALOGUE[79][0], "open: held until repaired", "G520.0200.00.05", "reboot_node"):
        assert text in dom, text
    assert dom.count("<svg") >= 4  # the probe against the fleet, and temperature, power, clocks around the fault
    assert "no diag run recorded" in dom


def test_without_prometheus_it_says_what_needs_it(case: Case, tmp_path: Path) -> None:
    run = _gpuwatch(
        "report", "--gpu", case.uuid, "--backend", "simulated", "--scenario", "xid",
        "--state-dir", str(case.state_dir), "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    document = json.loads((tmp_path / f"{case.uuid}.json").read_text())
    assert "around each fault need --prometheus URL" in document["around_faults"]["note"]
    assert "needs --prometheus URL" in document["probe"]["fleet"]["note"]
    assert [x["xid"] for x in document["xids"]] == [79]  # the ledger's; XID 13 was never held
    assert document["reading"]["temperature_celsius"]["core"] > 0  # the current reading instead
    page = (tmp_path / f"{case.uuid}.html").read_text()
    assert "The current reading" in page


def test_an_unknown_gpu_exits_2_naming_the_gpus_there_are(case: Case, tmp_path: Path) -> None:
    for gpu in ("9", "GPU-00000000-0000-0000-0000-000000000000"):
        run = _gpuwatch(
            "report", "--gpu", gpu, "--backend", "simulated", "--scenario", "xid", "--state-dir", str(case.state_dir),
            "--out", str(tmp_path),
        )  # fmt: skip
        assert run.returncode == 2, run
        assert f"--gpu {gpu}: no such GPU on this node" in run.stderr and case.uuid in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_out_exits_69(case: Case, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = _gpuwatch(
        "report", "--gpu", str(GPU), "--backend", "simulated", "--scenario", "xid",
        "--state-dir", str(case.state_dir), "--out", str(blocker / "cases"),
    )  # fmt: skip
    assert run.returncode == 69, run
    assert f"cannot make --out {blocker / 'cases'}" in run.stderr and "choose a directory you can write" in run.stderr


def test_bad_or_silent_prometheus(case: Case, tmp_path: Path) -> None:
    """A URL that is not one exits 2 before anything is read; a Prometheus that does not answer exits 69 with the
    case file written all the same, saying so where the history would be."""
    args = [
        "report",
        "--gpu",
        str(GPU),
        "--backend",
        "simulated",
        "--scenario",
        "xid",
        "--state-dir",
        str(case.state_dir),
    ]
    run = _gpuwatch(*args, "--out", str(tmp_path), "--prometheus", "localhost:9090")
    assert run.returncode == 2 and "give Prometheus' base URL, http(s)://HOST:PORT" in run.stderr
    silent = f"http://127.0.0.1:{free_port()}"
    run = _gpuwatch(*args, "--out", str(tmp_path), "--prometheus", silent)
    assert run.returncode == 69 and f"cannot reach Prometheus at {silent}" in run.stderr
    document = json.loads((tmp_path / f"{case.uuid}.json").read_text())
    assert f"cannot reach Prometheus at {silent}" in document["around_faults"]["note"]


def test_diag_results_are_read_as_gpuwatch_diag_wrote_them(tmp_path: Path) -> None:
    """The last `gpuwatch diag` run of each test, from the diag_results.json a real `gpuwatch diag` wrote (GPU 2 of
    the simulated node); a missing or unusable file is said, never an error, and left as it is."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    assert diag_json(state, "GPU-aaaa", 2)["note"] == "no diag run recorded"
    run = _gpuwatch("diag", "--backend", "simulated", "--scenario", "healthy", "--state-dir", str(state), "--gpu", "2")
    assert run.returncode == 0, run.stderr
    uuid = json.loads((state / "diag_results.json").read_text())["gpus"].popitem()[0]
    diag = diag_json(state, uuid, 2)
    assert diag["status"] == "recorded" and diag["level"] == 1 and diag["note"] is None
    results = {t["name"]: t["result"] for t in diag["tests"]}
    assert {results["hbm"], results["pcie"], results["sustained"]} == {"pass"}, diag
    assert diag_json(state, "GPU-cccc", 3)["status"] == "none"
    (state / "diag_results.json").write_text("{not json")
    assert diag_json(state, uuid, 2)["status"] == "unreadable"
    assert (state / "diag_results.json").read_text() == "{not json"  # a reader changes nothing


def test_a_gpu_only_the_ledger_knows_still_gets_its_case_file(case: Case, tmp_path: Path) -> None:
    """GPU 2 gone from the node (a 2-GPU node reads GPUs 0 and 1): its case file comes from what the state dir keeps,
    and says that nothing was read now."""
    run = _gpuwatch(
        "report", "--gpu", str(GPU), "--backend", "simulated", "--scenario", "xid", "--gpus", "2",
        "--state-dir", str(case.state_dir), "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    document = json.loads((tmp_path / f"{case.uuid}.json").read_text())
    spec = SimulatedNode("xid").spec(GPU)
    assert (document["identity"]["uuid"], document["identity"]["serial"]) == (spec.uuid, spec.serial)
    assert document["identity"]["board_part_number"] is None  # only the library knows it
    assert "identity from the fault ledger" in document["reading"]["error"]
    assert [f["key"] for f in document["ledger"]["faults"]] == ["XID 79"]
    assert document["verdict"]["action"] == "reboot_node"
    assert "no reading now" in (tmp_path / f"{case.uuid}.html").read_text()
