"""The simulated libnvidia-ml answers every NVML call of gpuwatch's backend as a real H100 answered it.

tests/fixtures/h100/nvml-backend-calls.json is `benchmarks/hardware/nvml_survey.py` run on an H100 80GB HBM3 (SXM,
700 W, driver 580.159.04, NVML 13.580.159.04, nvidia-ml-py 13.615.71; a VM with the GPU passed through, no NVLink
peers) on 2026-11-26: the NVML backend opened, polled once with the slow tier and twice without, and closed, over
NVIDIA's real pynvml, each call recorded with its answer, its NVMLError code and its wall time. Here the same script
does the same over the simulated healthy H100 under the installed pynvml, and the two must agree: the same calls,
the same errors (per call, per field value and per GPM metric), the same answers where the driver's do not move with
time, and the simulation's latency model taken from the same reading.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
from repofiles import REPO, load_script

from gpuwatch.simulated import libnvml
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

FIXTURE = json.loads((REPO / "tests/fixtures/h100/nvml-backend-calls.json").read_text())
REAL: list[dict[str, Any]] = FIXTURE["calls"]
# Answers that do not move while a GPU idles: the simulated H100 must give exactly the real one's.
STATIC = frozenset(
    {
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetName",
        "nvmlDeviceGetNumFans",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerSource",
        "nvmlDeviceGetRowRemapperHistogram",
        "nvmlDeviceGetSramEccErrorStatus",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceValidateInforom",
        "nvmlGpmQueryDeviceSupport",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
    }
)
MEMORY_STATIC = ("version", "total", "reserved")  # free and used move with every allocation


def _survey() -> ModuleType:
    return load_script(REPO / "benchmarks" / "hardware" / "nvml_survey.py", "nvml_survey")


@pytest.fixture(scope="module")
def simulated() -> list[dict[str, Any]]:
    """The simulated healthy H100, read as the real one was. This H100 filled its HW thermal / power-brake slowdown
    time fields (270, 271) at 0 from the first read; the one of nvml-idle.json, on the same driver, answered them
    with timestamp 0 at idle. Both are real: the simulation's default follows the first, `hw_counter_quirk` picks."""
    node = SimulatedNode("healthy", gpus=1, vendor="nvidia")
    lib = simulated_pynvml(node, hw_counter_quirk="never")
    log, _, _ = _survey().record_backend(lib, polls=3)  # 0.2 s apart, as on the H100
    return log


def _by_call(log: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    calls: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in log:
        calls.setdefault((entry["phase"], entry["function"]), []).append(entry)
    return calls


def _outcome(entry: dict[str, Any]) -> int:
    return int(entry.get("error", 0))  # NVML_SUCCESS is 0


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


# Fields the backend asks on every poll since the trace was recorded: the real H100 answered each of them when the
# backend asked every candidate at open (its first nvmlDeviceGetFieldValues in the trace), which stands for them here.
ASKED_SINCE = {75: "the combined thermal counter, DCGM_FI_DEV_THERMAL_VIOLATION's (issue 30)"}


def _without_newer_fields(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """The simulated call as the backend made it when the trace was recorded: without the fields asked since."""
    if sim["function"] != "nvmlDeviceGetFieldValues" or not isinstance(sim.get("value"), list):
        return sim
    asked = {f["fieldId"] for f in real["value"]}
    return {**sim, "value": [f for f in sim["value"] if f["fieldId"] in asked or f["fieldId"] not in ASKED_SINCE]}


def _pairs(simulated: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each real call beside the simulated call of the same function, phase and position."""
    sim = _by_call(simulated)
    return [
        (real, _without_newer_fields(real, other))
        for key, entries in _by_call(REAL).items()
        for real, other in zip(entries, sim.get(key, []), strict=False)
    ]


def test_fields_asked_since_the_trace_answer_as_the_h100_did_at_open(simulated: list[dict[str, Any]]) -> None:
    """A field the backend asks on every poll since the trace was recorded answers each poll as the real H100 answered
    it at open (same nvmlReturn, valueType and whether a timestamp is set): the H100 supports it."""
    opened = next(r for r in REAL if r["function"] == "nvmlDeviceGetFieldValues" and r["phase"] == "open")
    real = {f["fieldId"]: (f["nvmlReturn"], f["valueType"], f["timestamp"] > 0) for f in opened["value"]}
    polls = [e for e in simulated if e["function"] == "nvmlDeviceGetFieldValues" and e["phase"] == "fast poll"]
    for field_id in ASKED_SINCE:
        answers = [(f["nvmlReturn"], f["valueType"], f["timestamp"] > 0) for e in polls for f in e["value"]
                   if f["fieldId"] == field_id]  # fmt: skip
        assert answers and all(a == real[field_id] for a in answers), (field_id, answers, real[field_id])


def test_the_backend_makes_the_same_calls_over_both(simulated: list[dict[str, Any]]) -> None:
    """Open, a slow poll, two fast polls and close call the same NVML functions, as often, on both libraries: a call
    the real driver refused once (NotSupported: remembered) is not repeated over the simulation either."""
    assert Counter((e["phase"], e["function"]) for e in simulated) == Counter((e["phase"], e["function"]) for e in REAL)


def test_every_call_succeeds_or_fails_as_on_the_h100(simulated: list[dict[str, Any]]) -> None:
    """The same NVMLError per call: the H100 answered NotSupported for nvmlDeviceGetNvLinkState (no NVLink peers in
    that VM) and nvmlDeviceGetRetiredPages (Ampere and later retire rows by remapping, nvml.h), success elsewhere."""
    differ = [
        (r["phase"], r["function"], _outcome(r), _outcome(s))
        for r, s in _pairs(simulated)
        if _outcome(r) != _outcome(s)
    ]
    assert not differ
    assert {r["function"] for r in REAL if _outcome(r) == 3} == {
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetRetiredPages",
    }


def test_answers_have_the_real_shape(simulated: list[dict[str, Any]]) -> None:
    """Every answer is the same type of thing (a structure with the same fields, a list as long, a number, a string)
    as the real driver's, through the same pynvml."""
    differ = [
        (r["phase"], r["function"])
        for r, s in _pairs(simulated)
        if "value" in r and _shape(r["value"]) != _shape(s.get("value"))
    ]
    assert not differ


def test_static_answers_are_the_real_ones(simulated: list[dict[str, Any]]) -> None:
    """Limits, thresholds, max clocks, the PCIe link, modes, the remapper's bank histogram, event and throttle
    support, fabric state, versions: the simulated H100 answers exactly what the real one did."""
    checked = 0
    for real, sim in _pairs(simulated):
        if real["function"] in STATIC:
            assert sim.get("value") == real.get("value"), real["function"]
            real_args = [a for a in real["args"] if not (isinstance(a, str) and a.startswith("<"))]
            sim_args = [a for a in sim["args"] if not (isinstance(a, str) and a.startswith("<"))]
            if real_args and all(isinstance(a, dict) for a in real_args):  # out-parameters, as filled
                assert sim_args == real_args, real["function"]
            checked += 1
        elif real["function"] == "nvmlDeviceGetMemoryInfo":
            assert {k: sim["value"][k] for k in MEMORY_STATIC} == {k: real["value"][k] for k in MEMORY_STATIC}
            checked += 1
    assert checked >= len(STATIC)


def test_each_field_value_answers_as_on_the_h100(simulated: list[dict[str, Any]]) -> None:
    """nvmlDeviceGetFieldValues answers each field with its own nvmlReturn and valueType (nvml.h nvmlFieldValue_t):
    the PCIe error counters, throttle-reason times and the rest, field by field as the H100 did."""

    def fields(entry: dict[str, Any]) -> list[tuple[int, int, int, int, bool]]:
        # timestamp 0 with success is "no data" (what the backend keys on), so whether it is set must agree too
        return [
            (f["fieldId"], f["scopeId"], f["valueType"], f["nvmlReturn"], f["timestamp"] > 0) for f in entry["value"]
        ]

    pairs = [(r, s) for r, s in _pairs(simulated) if r["function"] == "nvmlDeviceGetFieldValues"]
    assert pairs
    for real, sim in pairs:
        assert fields(sim) == fields(real)


def test_each_gpm_metric_answers_as_on_the_h100(simulated: list[dict[str, Any]]) -> None:
    """nvmlGpmMetricsGet fills one nvmlReturn and a metricInfo (short name, long name, unit) per metric (nvml.h
    nvmlGpmMetric_t). The 580 driver answered the windowed shares and the PCIe rates ("MiB/s"), and InvalidArgument,
    with no names, for each since-reboot id it does not know (248-260, NVML 13.2's); the backend then asks without
    them."""

    def metrics(entry: dict[str, Any]) -> list[tuple[int, int, Any]]:
        value = entry["value"]
        return [(m["metricId"], m["nvmlReturn"], m["metricInfo"]) for m in value["metrics"][: value["numMetrics"]]]

    pairs = [(r, s) for r, s in _pairs(simulated) if r["function"] == "nvmlGpmMetricsGet"]
    assert len(pairs) == 2
    for real, sim in pairs:
        assert metrics(sim) == metrics(real)
    first = {metric: code for metric, code, _ in metrics(pairs[0][0])}
    assert {first[i] for i in range(248, 261) if i in first} == {2}  # NVML_ERROR_INVALID_ARGUMENT


def _symbol(name: str) -> str:
    """The C function pynvml 13.615.71 calls for `name` (pynvml.py: nvmlInit -> nvmlInitWithFlags, line 3150;
    nvmlDeviceGetCount -> _v2, 3374; nvmlDeviceGetHandleByIndex -> _v2, 3382; nvmlDeviceGetPciInfo -> _v3, 3666;
    nvmlDeviceGetMemoryInfo(version) -> _v2, 4000; nvmlDeviceGetComputeRunningProcesses -> _v3, 4196)."""
    if name == "nvmlInit":
        return "nvmlInitWithFlags"
    return next(c for c in (name, f"{name}_v2", f"{name}_v3") if c in libnvml._LATENCY_MS)


def test_latency_model_is_the_h100s_median() -> None:
    """The simulated library sleeps (latency_scale > 0) what each call took on the H100: the median of the fixture's
    wall times per function, to two significant figures."""
    times: dict[str, list[float]] = {}
    for entry in REAL:
        times.setdefault(entry["function"], []).append(entry["ms"])
    for name, found in times.items():
        assert libnvml._LATENCY_MS[_symbol(name)] == float(f"{statistics.median(found):.2g}"), name
