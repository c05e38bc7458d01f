"""The state dir turning read-only or full while the agent runs: it keeps serving, says so once, and every file it
persisted earlier (known_gpus.json, probe_baselines.json, host_psus.json) stays intact and parseable.

Tests run as root, so a read-only or full filesystem is simulated where the kernel would report it: creating the
temp file (EROFS), flushing it to disk (ENOSPC), or renaming it into place (EROFS)."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

from gpuwatch.files.statefile import STATE_VERSION, atomic_write_json, read_json
from gpuwatch.readers.ipmi import PSU_STATE_KIND, IpmiReader
from gpuwatch.simulated.host_sensors import SimulatedBmc, SimulatedHost

QUICK_PROBE = {
    "interval_seconds": 60.0,
    "timeout_seconds": 30.0,
    "warmup_min_seconds": 0.0,
    "warmup_max_seconds": 0.0,
    "measure_seconds": 0.1,
}
FILES = {"known_gpus.json": "known_gpus", "probe_baselines.json": "probe_baselines", "host_psus.json": PSU_STATE_KIND}


def failing(code: int) -> Callable[..., Any]:
    def fail(*_args: object, **_kwargs: object) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


BREAKAGES = {
    "read-only: no temp file": ("mkstemp", errno.EROFS),
    "full: fsync fails": ("fsync", errno.ENOSPC),
    "read-only: rename fails": ("replace", errno.EROFS),
}


def break_state_dir(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    where, code = BREAKAGES[how]
    if where == "mkstemp":
        monkeypatch.setattr(tempfile, "mkstemp", failing(code))
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", failing(code))
    else:
        monkeypatch.setattr(os, "replace", failing(code))


@pytest.mark.parametrize("how", sorted(BREAKAGES))
def test_state_dir_read_only_or_full_at_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # A first agent persists its GPUs and probe baselines; a BMC reader remembers one supply.
    first = SimAgent(tmp_path, gpus=2, probe=QUICK_PROBE)
    try:
        first.run(3.0)
        first.probe_round()
    finally:
        first.close()
    atomic_write_json(tmp_path / "host_psus.json", {"kind": PSU_STATE_KIND, "version": STATE_VERSION, "psus": ["PS9"]})
    before = {name: (tmp_path / name).read_bytes() for name in FILES}

    # Then the filesystem breaks, and a second agent (more GPUs: it must write) runs on the same state dir.
    second = SimAgent(tmp_path, gpus=3, probe=QUICK_PROBE)
    bmc = IpmiReader(SimulatedBmc(SimulatedHost(second.node)), state_path=tmp_path / "host_psus.json")
    try:
        break_state_dir(monkeypatch, how)
        with caplog.at_level(logging.WARNING):
            second.run(20.0)
            second.probe_round()
            second.run(20.0)
            second.probe_round()
            psus = {psu.psu: psu.up for psu in bmc.read().psus}
            bmc.read()
        text = second.text()
        list(text_string_to_metric_families(text))  # still a complete exposition
        assert {second.value("gpuwatch_gpu_up", gpu) for gpu in range(3)} == {1.0}
        assert psus["PS9"] is False and len(psus) > 1  # the remembered supply and the live ones
        for name in ("known_gpus.json", "probe_baselines.json"):  # said once, not at every poll or probe
            warnings = [r.getMessage() for r in caplog.records if name in r.getMessage()]
            assert len(warnings) == 1, warnings
            assert os.strerror(BREAKAGES[how][1]) in warnings[0]
    finally:
        monkeypatch.undo()
        second.close()
    for name, kind in FILES.items():  # the old files, byte for byte, and still ours
        assert (tmp_path / name).read_bytes() == before[name], name
        assert read_json(tmp_path / name, expect_kind=kind) is not None, name
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no half-written leftovers
