"""`gpuwatch probe` end to end (a real process over the simulated node), and the [probe] configuration."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import ConfigError


def gpuwatch_probe(state_dir: Path, *args: str, scenario: str = "underperforming") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpuwatch", "probe", "--backend", "simulated", "--scenario", scenario]
    return subprocess.run(
        [*argv, "--gpus", "4", "--state-dir", str(state_dir), *args], capture_output=True, text=True, timeout=120
    )


def results(proc: subprocess.CompletedProcess[str]) -> list[dict]:  # type: ignore[type-arg]
    return json.loads(proc.stdout)["results"]  # type: ignore[no-any-return]


def test_probe_prints_each_gpu_beside_its_baseline_and_changes_baselines_only_when_asked(tmp_path: Path) -> None:
    proc = gpuwatch_probe(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "probing GPU 0, 1, 2, 3" in proc.stderr  # progress goes to stderr
    assert "TFLOP/s" in proc.stdout and "baseline" in proc.stdout
    assert not (tmp_path / "probe_baselines.json").exists()  # no flag: no baseline change
    for _ in range(5):
        proc = gpuwatch_probe(tmp_path, "--json", "--update-baseline")
        assert proc.returncode == 0, proc.stderr
    out = results(proc)
    assert [r["gpu"] for r in out] == [0, 1, 2, 3]
    assert all(r["result"] == "ok" and 650e12 < r["baseline_flops"] < 730e12 for r in out)
    # The baseline is learnt: the simulated GPU 2 now shows its fault, and a plain probe reports the drop.
    out = results(gpuwatch_probe(tmp_path, "--json"))
    ratios = {r["gpu"]: r["ratio_to_baseline"] for r in out}
    assert ratios[2] < 0.85 and all(0.98 < ratios[g] < 1.02 for g in (0, 1, 3)), ratios
    proc = gpuwatch_probe(tmp_path, "--json", "--reset-baseline", "--gpu", "1")
    (only,) = results(proc)
    assert only["gpu"] == 1 and only["baseline_flops"] is None


def test_a_gpu_capped_at_500_w_probes_slower_than_its_peers_at_its_cap(tmp_path: Path) -> None:
    """Issue #30 (9), end to end: `gpuwatch probe` on the mixed node, whose GPU 5 runs at 500 W of 700 W. The
    probe's load runs on the simulated GPUs' physics: GPU 5 computes at the clock its cap gives (about sqrt(500/700)
    of its peers'), below 95 % of their median, and every GPU that reached its power limit shows a mean power near
    its own limit, GPU 5's near 500 W, with an SM clock between idle and its peers'."""
    argv = [sys.executable, "-m", "gpuwatch", "probe", "--backend", "simulated", "--scenario", "mixed", "--json"]
    proc = subprocess.run([*argv, "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    out = {r["gpu"]: r for r in results(proc)}
    ok = {gpu: r for gpu, r in out.items() if r["result"] == "ok"}
    assert 5 in ok and len(ok) >= 6, out
    peers = [gpu for gpu in ok if gpu != 5]
    flops = {gpu: r["measured"]["flops_median"] for gpu, r in ok.items()}
    assert flops[5] < 0.95 * statistics.median(flops[g] for g in peers), flops
    clock = {gpu: r["telemetry"]["sm_clock_hertz"] for gpu, r in ok.items()}
    assert 345e6 < clock[5] < min(clock[g] for g in peers), clock  # H100 idle SM clock: 345 MHz
    for gpu, r in ok.items():
        limit = 500.0 if gpu == 5 else 700.0
        assert r["measured"]["power_capped"] is True, (gpu, r)
        assert r["telemetry"]["samples"] >= 1 and r["telemetry"]["power_watts"] >= 0.85 * limit, (gpu, r)


def test_probe_skips_busy_gpus_and_says_so(tmp_path: Path) -> None:
    proc = gpuwatch_probe(tmp_path, "--json", scenario="busy")
    assert proc.returncode == 1
    assert {r["result"] for r in results(proc)} == {"skipped_busy"}
    # Named explicitly, a busy GPU is probed, marked as such, and never counts toward its baseline.
    (named,) = results(gpuwatch_probe(tmp_path, "--json", "--gpu", "3", "--update-baseline", scenario="busy"))
    assert named["result"] == "ok" and "busy" in named["reason"] and named["baseline_flops"] is None


def test_probe_rejects_an_unknown_gpu_and_conflicting_flags(tmp_path: Path) -> None:
    proc = gpuwatch_probe(tmp_path, "--gpu", "9")
    assert proc.returncode == 1 and "no GPU [9]" in proc.stderr
    proc = gpuwatch_probe(tmp_path, "--update-baseline", "--reset-baseline")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("interval_seconds = 0.5", "probe.interval_seconds"),
        ("require_idle_node = 1", "probe.require_idle_node"),
        ('dtype = "int8"', "probe.dtype"),
        ('engine = "jax"', "probe.engine"),
        ("timeout_seconds = 2", "probe.timeout_seconds"),  # shorter than warm-up + measure (1.5 + 1)
        ("warmup_max_seconds = 0.2", "probe.warmup_max_seconds"),  # below warmup_min_seconds
        ("intervall_seconds = 5", "probe.intervall_seconds"),
    ],
)
def test_bad_probe_settings_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[probe]\n{toml}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.key == key


def test_probe_interval_flag_and_off(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[probe]\ninterval_seconds = 0\nrequire_idle_node = false\n")
    config = load_config(path, {"probe": {"interval_seconds": 300}})
    assert config.probe.interval_seconds == 300 and config.probe.require_idle_node is False
    assert load_config(path).probe.interval_seconds == 0
