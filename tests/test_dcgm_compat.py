"""`[compat] dcgm`: dcgm-exporter's values, units and labels, held against what the real pynvml reads from the same
simulated GPUs at the same moment, the way DCGM reads them (DCGM's dcgm_fields.h, as vendored by NVIDIA/go-dcgm
b7fa315 pkg/dcgm/dcgm_fields.h; dcgm-exporter 4.5.3-4.8.2 etc/default-counters.csv). Off by default: then not one
DCGM_ name is served.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ports import free_port
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent
from test_exposition_fast import ACCEPTS, library_and_fast

from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import CompatSection, ConfigError
from gpuwatch.exposition.cache import CachedExposition
from gpuwatch.exposition.dcgm_compat import NAMES, dcgm_extension
from gpuwatch.exposition.dcgm_fields import FIELDS
from gpuwatch.exposition.exporter import SnapshotExporter
from gpuwatch.simulated.bindings import simulated_pynvml

Series = dict[tuple[str, str], tuple[dict[str, str], float]]  # (DCGM name, gpu) -> (labels, value)
MIB_SHIFT = 20


# The agents run with [compat] dcgm on, as a node serving DCGM's names does: it serves whole what the mapping reads
# (gpuwatch.core.metric_spec.ExportDetail.dcgm; tests/test_dcgm_compat_budget.py holds it to before the budget).
DCGM_ON: dict[str, dict[str, object]] = {"compat": {"dcgm": True}}


def _compat(**kwargs: Any) -> CompatSection:
    return CompatSection(dcgm=True, **kwargs)


def dcgm_series(sim: SimAgent, accept: str = "") -> Series:
    """One scrape of the DCGM families through the agent's exposition cache, as /metrics serves them."""
    extension = dcgm_extension(_compat(), environ={}, gethostname=lambda: "gpu-node-07")
    _, body = CachedExposition(sim.agent.store, extension, NAMES).render(accept, False)
    out: Series = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name.startswith("DCGM_"):
                out[(sample.name, sample.labels["gpu"])] = (sample.labels, sample.value)
    return out


@pytest.fixture
def sim_and_nvml(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[SimAgent, ModuleType]]:
    """A SimAgent of the scenario `request.param` after 12 polls (every tier every poll), and the real pynvml over
    the same simulated node, read at the moment of the last poll."""
    sim = SimAgent(
        tmp_path,
        scenario=request.param,
        probe={"interval_seconds": 0},
        sections=DCGM_ON,
        slow_poll_interval_seconds=1.0,
    )
    try:
        sim.run(12.0)
        nvml = simulated_pynvml(sim.node)
        nvml.nvmlInit()
        yield sim, nvml
        nvml.nvmlShutdown()
    finally:
        sim.close()


@pytest.mark.parametrize("sim_and_nvml", ["busy", "mixed", "pcie_degraded", "ecc_uncorrectable"], indirect=True)
def test_values_and_units_are_what_dcgm_reads_from_nvml(sim_and_nvml: tuple[SimAgent, ModuleType]) -> None:
    """Each field in DCGM's unit (dcgm_fields.h), the value DCGM reads from NVML: clocks MHz (h:558, h:564),
    temperature °C (h:630), power W (h:650), energy mJ (h:656), GPU/memory utilization in percent 0-100
    (default-counters.csv:23-24), framebuffer MiB (h:884-899; nvmlMemory_v2 as nvidia-smi), PCIe replays and link
    (h:783, h:824-839), the enforced limit W (h:696), aggregate ECC counts (h:948-954), the clock-event bitmask
    (h:587, bits h:107-154 = nvmlClocksEventReason*), power violation time in ns (h:844)."""
    sim, nvml = sim_and_nvml
    series = dcgm_series(sim)
    for index in range(8):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        supported = nvml.nvmlDeviceGetSupportedClocksEventReasons(handle)
        expected: dict[str, float] = {
            "DCGM_FI_DEV_SM_CLOCK": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "DCGM_FI_DEV_MEM_CLOCK": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "DCGM_FI_DEV_GPU_TEMP": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "DCGM_FI_DEV_POWER_USAGE": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            "DCGM_FI_DEV_GPU_UTIL": rates.gpu,
            "DCGM_FI_DEV_MEM_COPY_UTIL": rates.memory,
            "DCGM_FI_DEV_FB_USED": memory.used >> MIB_SHIFT,
            "DCGM_FI_DEV_FB_TOTAL": memory.total >> MIB_SHIFT,
            "DCGM_FI_DEV_FB_FREE": (memory.total - memory.used) >> MIB_SHIFT,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": nvml.nvmlDeviceGetPcieReplayCounter(handle),
            "DCGM_FI_DEV_PCIE_LINK_GEN": nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": nvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC
            ),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & supported & 0x1FF,
            # h:844: ns, NVML's violation time of the power policy (nvmlDeviceGetViolationStatus)
            "DCGM_FI_DEV_POWER_VIOLATION": nvml.nvmlDeviceGetViolationStatus(
                handle, nvml.NVML_PERF_POLICY_POWER
            ).violationTime,
            # DCGM reads NVML_FI_DEV_PERF_POLICY_THERMAL (75) for it (dcgmlib/src/dcgm_fields.cpp 2383-2388,
            # DCGM 4.6.0): the thermal policy's violation time, ns, since the driver loaded
            "DCGM_FI_DEV_THERMAL_VIOLATION": nvml.nvmlDeviceGetViolationStatus(
                handle, nvml.NVML_PERF_POLICY_THERMAL
            ).violationTime,
        }
        for name, value in expected.items():
            assert (name, str(index)) in series, f"{name} of GPU {index} missing"
            # gpuwatch sums the violation counter's deltas from its own start, in float seconds: 1 µs is plenty
            tolerance = 1000 if name.endswith("_VIOLATION") else 1e-9
            assert series[(name, str(index))][1] == pytest.approx(value, abs=tolerance), f"{name} of GPU {index}"


@pytest.mark.parametrize("sim_and_nvml", ["mixed"], indirect=True)
def test_labels_are_what_dcgm_exporter_writes(sim_and_nvml: tuple[SimAgent, ModuleType]) -> None:
    """render_metrics.go:47 (4.5.3-4.8.2): gpu, UUID, pci_bus_id (NVML's busId), device ("nvidia" + gpu,
    gpu_collector.go:341), modelName (the device name), Hostname, and DCGM_FI_DRIVER_VERSION
    (default-counters.csv:77, a label on every field)."""
    sim, nvml = sim_and_nvml
    series = dcgm_series(sim)
    driver = nvml.nvmlSystemGetDriverVersion()
    for index in range(8):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        labels, _ = series[("DCGM_FI_DEV_GPU_TEMP", str(index))]
        assert labels == {
            "gpu": str(index),
            "UUID": nvml.nvmlDeviceGetUUID(handle),
            "pci_bus_id": nvml.nvmlDeviceGetPciInfo(handle).busId,
            "device": f"nvidia{index}",
            "modelName": nvml.nvmlDeviceGetName(handle),
            "Hostname": "gpu-node-07",
            "DCGM_FI_DRIVER_VERSION": driver,
        }
    # GPU 2 overheats (hw_thermal, sw_thermal) and GPU 5 runs at its 500 W cap: their bits, and nothing elsewhere
    reasons = {int(gpu): int(v) for (name, gpu), (_, v) in series.items() if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
    assert reasons[2] & 0x40 and not reasons[0] & ~0x1  # HW_THERMAL (h:145); GPU 0 at most idle


def test_xid_gauge_is_the_last_xid_with_its_code(tmp_path: Path) -> None:
    """DCGM_FI_DEV_XID_ERRORS' value is the code of the last XID, not a count (h:819, "The value is the specific
    XID error"), with err_code/err_msg (gpu_collector.go:324-332); absent on a GPU that has had none (DCGM:
    "No data is available", NVIDIA/DCGM#141). The xid scenario: GPU 2 logs XID 13 at 2 s, then 79 at 5 s."""
    sim = SimAgent(tmp_path, scenario="xid", probe={"interval_seconds": 0}, sections=DCGM_ON)
    try:
        sim.run(3.0)
        first = dcgm_series(sim)
        sim.run(5.0)
        later = dcgm_series(sim)
    finally:
        sim.close()
    xids = {gpu: (labels, v) for (name, gpu), (labels, v) in later.items() if name == "DCGM_FI_DEV_XID_ERRORS"}
    assert set(xids) == {"2"}
    labels, value = xids["2"]
    assert value == 79 and labels["err_code"] == "79" and labels["err_msg"] == "GPU has fallen off the bus"
    assert first[("DCGM_FI_DEV_XID_ERRORS", "2")][1] == 13


def test_compat_renders_byte_for_byte_as_the_library(tmp_path: Path) -> None:
    """The DCGM counters are `unknown` families (untyped in text): the fast encoder writes them as the library."""
    sim = SimAgent(tmp_path, scenario="mixed", probe={"interval_seconds": 0}, sections=DCGM_ON)
    try:
        sim.run(4.0)
        collector = SnapshotExporter(sim.agent.store, dcgm_extension(_compat(), environ={}, gethostname=str))
        for what, accept in ACCEPTS.items():
            library, fast = library_and_fast(collector, accept)
            assert b"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION " in library
            assert fast == library, what
    finally:
        sim.close()


def test_series_per_gpu_of_a_healthy_node(tmp_path: Path) -> None:
    """The cost docs/cost-and-sizing.md states: 42 DCGM series per healthy GPU without GPM data (no XID yet); the 11
    GPM fields add 11 where GPM data is exported (53: measured on this branch merged with branch gpm)."""
    sim = SimAgent(tmp_path, scenario="healthy", probe={"interval_seconds": 0}, sections=DCGM_ON)
    try:
        sim.run(4.0)
        series = dcgm_series(sim)
    finally:
        sim.close()
    gpm = {f.name for f in FIELDS if f.name.startswith("DCGM_FI_PROF_")}
    assert len(gpm) == 11
    assert len([key for key in series if key[0] not in gpm]) == 42 * 8
    assert len([key for key in series if key[0] in gpm]) in (0, 11 * 8)  # all GPM fields on every GPU, or none
    text = (Path(__file__).parent.parent / "docs" / "cost-and-sizing.md").read_text()
    assert "**42 series per GPU**" in text and "**53**" in text


def test_hostname_as_dcgm_exporter_finds_it() -> None:
    """hostname.go: $NODE_NAME, else the machine's name; the config wins over both; the label can be renamed
    ("hostname", dcgm-exporter after #655) or left out (its --no-hostname)."""

    def labels(compat: CompatSection, environ: dict[str, str]) -> dict[str, str]:
        extension = dcgm_extension(compat, environ=environ, gethostname=lambda: "machine")
        assert extension is not None
        family = GaugeMetricFamily(
            "gpuwatch_gpu_info",
            "",
            labels=["gpu", "uuid", "vendor", "model", "serial", "pci_bus_id", "driver_version", "vbios_version"],
        )
        family.add_metric(["0", "GPU-x", "nvidia", "H100", "1", "00000000:18:00.0", "580", "96"], 1)
        power = GaugeMetricFamily("gpuwatch_gpu_power_watts", "", labels=["gpu", "uuid"])
        power.add_metric(["0", "GPU-x"], 1)
        (out,) = extension([family, power])
        return dict(out.samples[0].labels)

    assert labels(_compat(), {})["Hostname"] == "machine"
    assert labels(_compat(), {"NODE_NAME": "k8s-node"})["Hostname"] == "k8s-node"
    assert labels(_compat(dcgm_hostname="set"), {"NODE_NAME": "k8s-node"})["Hostname"] == "set"
    assert labels(_compat(dcgm_hostname_label="hostname"), {})["hostname"] == "machine"
    assert "Hostname" not in labels(_compat(dcgm_hostname_label=""), {})
    assert dcgm_extension(CompatSection()) is None


@pytest.mark.parametrize(
    ("toml", "problem"),
    [
        ("dcgm = 1", "compat.dcgm: must be true or false, got 1"),
        ('dcgm = true\ndcgm_hostname_label = "HostName"', 'compat.dcgm_hostname_label: must be "Hostname"'),
        ('dcgm = true\ndcgm_hostname = "a\\nb"', "compat.dcgm_hostname: must be a host name"),
        ('dcgm_hostname = "node-1"', "compat.dcgm: is false, so dcgm_hostname and dcgm_hostname_label have no effect"),
        ("dgcm = true", "compat.dgcm: unknown key; did you mean 'dcgm'?"),
    ],
)
def test_config_errors_say_what_to_do(tmp_path: Path, toml: str, problem: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[compat]\n{toml}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"{path}: {problem}" in str(error.value)


def _serve(tmp_path: Path, config: str) -> tuple[subprocess.Popen[str], int]:
    (tmp_path / "config.toml").write_text(config)
    port = free_port()
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", "mixed", "--gpus", "2"),
            *("--config", str(tmp_path / "config.toml"), "--listen", f"127.0.0.1:{port}", "--probe-interval", "0"),
            *("--state-dir", str(tmp_path / "state"), "--disable-collector", "ipmi"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if b"gpuwatch_gpu_up" in _get(port, "/metrics", "")[1]:
                return child, port
        except OSError:
            time.sleep(0.3)
    child.kill()
    raise AssertionError(f"the agent did not serve: {child.communicate()[0]}")


def _get(port: int, path: str, accept: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_off_by_default_no_dcgm_name_is_served(tmp_path: Path) -> None:
    child, port = _serve(tmp_path, "")
    try:
        for accept in ACCEPTS.values():
            status, body = _get(port, "/metrics", accept)
            assert status == 200 and b"gpuwatch_gpu_temperature_celsius" in body and b"DCGM_" not in body
        status, body = _get(port, "/metrics?name[]=DCGM_FI_DEV_GPU_TEMP", "")
        assert status == 400 and b"no metric named DCGM_FI_DEV_GPU_TEMP" in body
    finally:
        child.terminate()
        child.communicate(timeout=15)


def test_on_a_filter_for_a_dcgm_name_gets_that_family(tmp_path: Path) -> None:
    child, port = _serve(tmp_path, "[compat]\ndcgm = true\n")
    try:
        status, body = _get(port, "/metrics?name[]=DCGM_FI_DEV_GPU_TEMP", "")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert status == 200 and names == {"DCGM_FI_DEV_GPU_TEMP"}
        assert body.count(b"\nDCGM_FI_DEV_GPU_TEMP{") == 2
    finally:
        child.terminate()
        child.communicate(timeout=15)


def test_the_migration_guide_lists_every_field() -> None:
    """docs/migrating-from-dcgm-exporter.md says what maps: every DCGM name served is in its table."""
    text = (Path(__file__).parent.parent / "docs" / "migrating-from-dcgm-exporter.md").read_text()
    missing = sorted(name for name in NAMES if f"`{name}`" not in text)
    assert not missing, f"not in the migration guide: {missing}"


def test_a_reload_keeps_the_running_compat_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The exposition is built at start-up: a SIGHUP with another [compat] keeps the running one and says a restart
    applies it, as for [probe] and [host]."""
    from gpuwatch.service.startup import live_part

    old = load_config(None)
    new = load_config(None, {"compat": {"dcgm": True}})
    with caplog.at_level("WARNING"):
        kept = live_part(old, new)
    assert kept.compat == old.compat
    assert "[compat] changed: takes effect after a restart" in caplog.text


def test_amd_gpus_get_the_fields_whose_meaning_holds(tmp_path: Path) -> None:
    """The mapping reads gpuwatch's vendor-neutral families, so an AMD node (the real amdsmi package over the
    simulated libamd_smi) gets the same fields in the same units, its device label `amd` + index."""
    sim = SimAgent(tmp_path, scenario="busy", gpus=2, vendor="amd", probe={"interval_seconds": 0}, sections=DCGM_ON)
    try:
        sim.run(4.0)
        series = dcgm_series(sim)
        for index in range(2):
            labels, temp = series[("DCGM_FI_DEV_GPU_TEMP", str(index))]
            assert labels["device"] == f"amd{index}" and labels["modelName"] == "AMD Instinct MI300X"
            assert temp == sim.value("gpuwatch_gpu_temperature_celsius", index, sensor="core")
            clock = sim.value("gpuwatch_gpu_clock_hertz", index, clock="sm")
            assert clock is not None and series[("DCGM_FI_DEV_SM_CLOCK", str(index))][1] == round(clock / 1e6)
            used = sim.value("gpuwatch_gpu_memory_used_bytes", index)
            assert used is not None and series[("DCGM_FI_DEV_FB_USED", str(index))][1] == int(used) >> MIB_SHIFT
    finally:
        sim.close()


def test_thermal_violation_is_nvmls_thermal_policy_counter_not_the_sw_thermal_reason(tmp_path: Path) -> None:
    """From R580.82 NVML counts software thermal slowdown on its own (field 269), and gpuwatch's sw_thermal reads it;
    DCGM_FI_DEV_THERMAL_VIOLATION stays field 75, NVML_FI_DEV_PERF_POLICY_THERMAL (dcgmlib/src/dcgm_fields.cpp
    2383-2388). With the two counters apart on GPU 0, the DCGM field is 75's, in ns."""
    sim = SimAgent(tmp_path, scenario="healthy", gpus=2, probe={"interval_seconds": 0}, sections=DCGM_ON)
    try:
        ull = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        sim.node.faults.field(75, value=7_000_000_000, value_type=ull, gpu=0)
        sim.node.faults.field(269, value=2_000_000_000, value_type=ull, gpu=0)
        sim.run(3.0)
        series = dcgm_series(sim)
        assert series[("DCGM_FI_DEV_THERMAL_VIOLATION", "0")][1] == 7_000_000_000
        assert sim.value("gpuwatch_gpu_thermal_violation_seconds_total", 0) == 7.0
    finally:
        sim.close()
