"""Absurd throughputs in `probe_baselines.json` (someone with write access to the state dir, or a damaged disk): NaN,
infinities, zero, negatives and 1e308 were believed. A negative baseline made "slow probe: -68 %" and a 503, an
infinite one a GpuUnderperforming that never healed, NaN turned the check off without a word. Such a file is corrupt:
a real agent starts, moves it aside as it does a file that is not JSON, says so once and reports no slow probe."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_agent_process import Agent, get, value
from test_probe_agent import wait_for

from gpuwatch.probe.baseline import BASELINES_FILE, PROBES_TO_ESTABLISH, BaselineKey, Baselines
from gpuwatch.state.probebook import MAX_PLAUSIBLE_FLOPS, WorkerResult, plausible_flops

KEY = BaselineKey("bf16", "8192x8192x8192", "simulated", "1", "simulated", "580.1", 700.0)  # the simulated node's
UUID = "GPU-test"


def gpu0_labels(text: str) -> dict[str, str]:
    uuid = next(
        line.split('uuid="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("gpuwatch_gpu_up{") and 'gpu="0"' in line
    )
    return {"gpu": "0", "uuid": uuid}


def plant(state: Path, uuid: str, field: str, raw: str) -> None:
    """An established baseline for `uuid`, then `field` replaced by the JSON text `raw` (NaN and Infinity as Python's
    json writes and reads them)."""
    for _ in range(PROBES_TO_ESTABLISH):
        Baselines(state).observe(uuid, KEY, 690e12, steady=True, mode="agent", timestamp=1.0)
    doc = json.loads((state / BASELINES_FILE).read_text())
    doc["gpus"][uuid][field] = "@@"
    (state / BASELINES_FILE).write_text(json.dumps(doc).replace('"@@"', raw))


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-6.9e14", "1e308"])
def test_an_agent_moves_a_baselines_file_with_an_absurd_throughput_aside_and_reports_no_slow_probe(
    tmp_path: Path, raw: str
) -> None:
    first = Agent(tmp_path, "--scenario", "healthy", "--probe-interval", "3600")
    try:
        first.wait_ready()
        gpu0 = gpu0_labels(first.metrics())
        assert first.stop()[0] == 0
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
            first.proc.communicate()
    plant(first.state_dir, gpu0["uuid"], "flops", raw)

    agent = Agent(tmp_path, "--scenario", "healthy", "--probe-interval", "1")
    try:
        agent.wait_ready()
        text = wait_for(agent, "gpuwatch_probe_runs_total", 2.0, result="ok", **gpu0)  # two probes ran, both ok
        assert value(text, "gpuwatch_probe_baseline_flops", dtype="bf16", **gpu0) is None  # being re-established
        status, health = get(agent.base + "/health/gpus")
        assert status == 200 and "slow probe" not in health, health
        code, _, out = agent.stop()
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.communicate()
    assert code == 0, out
    assert out.count("is unusable") == 1, out  # said once, not at every probe
    assert f"has flops {float(raw)!r}, not a throughput" in out, out
    moved = list(agent.state_dir.glob(f"{BASELINES_FILE}.corrupt-*"))
    assert len(moved) == 1 and raw in moved[0].read_text()  # the evidence is kept for a human
    rebuilt = json.loads((agent.state_dir / BASELINES_FILE).read_text())  # the new file: plausible numbers only
    assert all(plausible_flops(v) for v in rebuilt["gpus"][gpu0["uuid"]]["samples"])


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("flops", "-Infinity"),
        ("flops", "0"),
        ("flops", "1.0000001e18"),
        ("flops", '"Infinity"'),  # a string that float() would have turned into inf
        ("flops", "true"),
        ("previous_flops", "NaN"),
        ("samples", "[6.9e14, -1]"),
        ("uncapped_samples", "[Infinity]"),
    ],
)
def test_every_throughput_in_the_file_is_checked(tmp_path: Path, field: str, raw: str) -> None:
    plant(tmp_path, UUID, field, raw)
    assert Baselines(tmp_path).peek() == {}  # `gpuwatch check` reads it as unusable, changing nothing
    assert (tmp_path / BASELINES_FILE).exists()
    assert Baselines(tmp_path).load() == {}
    assert not (tmp_path / BASELINES_FILE).exists() and len(list(tmp_path.glob(f"{BASELINES_FILE}.corrupt-*"))) == 1


def test_plausible_baselines_load_unchanged_up_to_the_bound(tmp_path: Path) -> None:
    plant(tmp_path, UUID, "flops", repr(MAX_PLAUSIBLE_FLOPS))
    assert Baselines(tmp_path).load()[UUID].flops == MAX_PLAUSIBLE_FLOPS
    plant(tmp_path, UUID, "flops", "1")  # tiny is allowed: the probe's size is configurable
    assert Baselines(tmp_path).load()[UUID].flops == 1.0


@pytest.mark.parametrize("flops", [math.inf, math.nan, 1e308, -1.0])
def test_a_worker_reporting_an_absurd_throughput_is_malformed_never_a_baseline(flops: float) -> None:
    """The same bound on the way in: a worker's infinite result would otherwise be written and then found corrupt."""
    doc = {
        "engine": "simulated",
        "engine_version": "1",
        "blas_version": "simulated",
        "dtype": "bf16",
        "shape": "8192x8192x8192",
        "flops_median": flops,
        "flops_p10": 1.0,
        "flops_p90": 1.0,
        "spread_ratio": 0.0,
        "iterations": 1,
        "gpu_time_seconds": 1.0,
    }
    with pytest.raises(ValueError, match="flops_median must be in"):
        WorkerResult.from_json(doc)
