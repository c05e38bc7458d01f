"""State files: atomic writes, defensive reads, and the known-GPU memory that survives restarts.

Tests run as root, where chmod 0o500 does not stop a write; read-only and full disks are simulated by making
the OS calls fail with EROFS / ENOSPC, and a missing directory by a path under a regular file.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import GpuIdentity
from gpuwatch.files import statefile
from gpuwatch.files.statefile import (
    KNOWN_GPUS_FILE,
    KnownGpus,
    StateDirError,
    atomic_write_json,
    check_state_dir,
    read_json,
)

H100_A = GpuIdentity(
    uuid="GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3",
    vendor="nvidia",
    index=0,
    model="NVIDIA H100 80GB HBM3",
    serial="1753024033842",
    pci_bus_id="00000000:18:00.0",
    driver_version="580.159.04",
    vbios_version="96.00.99.00.01",
)
H100_B = dataclasses.replace(H100_A, uuid="GPU-0b7c5a1e-0000-1111-2222-333344445555", index=1, serial="2")
MI300X = GpuIdentity(uuid="a1b2c3d4-0000-0000-0000-000000000001", vendor="amd", index=0, model="MI300X")


def doc(kind: str = "probe_baseline", **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "version": 1, **fields}


def error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def asides(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


# --- atomic_write_json ----------------------------------------------------------------------------


def test_atomic_write_round_trip_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    atomic_write_json(path, doc(flops=6.9e14))
    atomic_write_json(path, doc(flops=7.0e14))
    assert json.loads(path.read_text()) == doc(flops=7.0e14)
    assert read_json(path, expect_kind="probe_baseline") == doc(flops=7.0e14)
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_atomic_write_creates_the_state_dir(tmp_path: Path) -> None:
    path = tmp_path / "var" / "lib" / "gpuwatch" / "x.json"
    atomic_write_json(path, doc())
    assert read_json(path, expect_kind="probe_baseline") == doc()


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EACCES])
def test_failed_rename_raises_state_dir_error_and_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    path = tmp_path / "baseline.json"
    atomic_write_json(path, doc(flops=1.0))

    def fail(*args: object) -> None:
        raise error(code)

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StateDirError) as excinfo:
        atomic_write_json(path, doc(flops=2.0))
    assert excinfo.value.errno == code
    assert excinfo.value.path == path
    assert str(path) in str(excinfo.value)
    assert errno.errorcode[code] in str(excinfo.value)
    assert "writable" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, OSError)
    assert json.loads(path.read_text()) == doc(flops=1.0)
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]  # temp file cleaned up


def test_full_disk_during_fsync_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "baseline.json"
    atomic_write_json(path, doc(flops=1.0))

    def enospc(fd: int) -> None:
        raise error(errno.ENOSPC)

    monkeypatch.setattr(os, "fsync", enospc)
    with pytest.raises(StateDirError, match="No space left"):
        atomic_write_json(path, doc(flops=2.0))
    assert json.loads(path.read_text()) == doc(flops=1.0)
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]


def test_read_only_dir_cannot_create_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def erofs(*args: object, **kwargs: object) -> tuple[int, str]:
        raise error(errno.EROFS)

    monkeypatch.setattr(tempfile, "mkstemp", erofs)
    with pytest.raises(StateDirError, match="Read-only file system"):
        atomic_write_json(tmp_path / "x.json", doc())


def test_state_dir_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(StateDirError):
        atomic_write_json(blocker / "x.json", doc())
    with pytest.raises(StateDirError):
        check_state_dir(blocker)


def test_check_state_dir_leaves_nothing_behind(tmp_path: Path) -> None:
    check_state_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unserialisable_data_is_a_programming_error_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    with pytest.raises(TypeError):
        atomic_write_json(path, doc(value=object()))
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_fsync_of_directory_failing_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync
    calls: list[int] = []

    def fsync_files_only(fd: int) -> None:
        calls.append(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise error(errno.EINVAL)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_files_only)
    atomic_write_json(tmp_path / "x.json", doc())
    assert len(calls) == 2  # the file, then the directory
    assert read_json(tmp_path / "x.json", expect_kind="probe_baseline") == doc()


# --- read_json ------------------------------------------------------------------------------------


def test_missing_file_is_none_without_noise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        assert read_json(tmp_path / "absent.json", expect_kind="known_gpus") is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"kind": "known_gpus", "version": 1, "gpus": {', "not valid JSON"),  # cut off by a crash
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2, 3]", "JSON list"),
        (b'{"kind": "probe_baseline", "version": 1}', "kind is 'probe_baseline'"),
        (b'{"version": 1, "gpus": {}}', "kind is None"),
        (b'{"kind": "known_gpus", "version": 2}', "newer gpuwatch"),
        (b'{"kind": "known_gpus", "version": "1"}', "version is '1'"),
        (b'{"kind": "known_gpus", "version": true}', "version is True"),
        (b'{"kind": "known_gpus"}', "version is None"),
    ],
)
def test_corrupt_or_foreign_file_is_moved_aside_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, problem: str
) -> None:
    path = tmp_path / "known_gpus.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="gpuwatch.files.statefile"):
        assert read_json(path, expect_kind="known_gpus") is None
    assert not path.exists()
    (aside,) = asides(path)
    assert aside.read_bytes() == content
    assert aside.name.removeprefix("known_gpus.json.corrupt-").isdigit()
    message = caplog.records[-1].getMessage()
    assert caplog.records[-1].levelno == logging.WARNING
    assert str(path) in message and str(aside) in message and problem in message
    assert "delete" in message  # says what to do


def test_two_corrupt_files_in_the_same_second_are_both_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)
    path = tmp_path / "known_gpus.json"
    for content in ("first", "second", "third"):
        path.write_text(content)
        assert read_json(path, expect_kind="known_gpus") is None
    kept = asides(path)
    assert sorted(p.read_text() for p in kept) == ["first", "second", "third"]
    assert tmp_path / "known_gpus.json.corrupt-1700000000" in kept


def test_unreadable_file_is_not_moved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "known_gpus.json"
    atomic_write_json(path, doc("known_gpus", gpus={}))

    def eacces(self: Path, **_kw: object) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(statefile, "read_regular_file", eacces)
    with caplog.at_level(logging.WARNING):
        assert read_json(path, expect_kind="known_gpus") is None
    assert path.exists() and asides(path) == []
    assert str(path) in caplog.text and "permission" in caplog.text.lower()


def test_corrupt_file_that_cannot_be_moved_is_still_only_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "known_gpus.json"
    path.write_text("{{{")

    def erofs(*args: object) -> None:
        raise error(errno.EROFS)

    monkeypatch.setattr(os, "replace", erofs)
    with caplog.at_level(logging.WARNING):
        assert read_json(path, expect_kind="known_gpus") is None
    assert path.exists()
    assert "could not move it aside" in caplog.text and str(path) in caplog.text


# --- KnownGpus ------------------------------------------------------------------------------------


def test_known_gpus_round_trip_across_restart(tmp_path: Path) -> None:
    KnownGpus(tmp_path).remember([H100_A, H100_B, MI300X])
    assert KnownGpus(tmp_path).load() == {g.uuid: g for g in (H100_A, H100_B, MI300X)}
    document = json.loads((tmp_path / KNOWN_GPUS_FILE).read_text())
    assert document["kind"] == "known_gpus" and document["version"] == 1
    assert document["gpus"][H100_A.uuid]["pci_bus_id"] == "00000000:18:00.0"


def test_gpu_lost_before_restart_is_still_known_after(tmp_path: Path) -> None:
    before = KnownGpus(tmp_path)
    before.load()
    before.remember([H100_A, H100_B])
    after = KnownGpus(tmp_path)  # the agent restarted; H100_B fell off the bus meanwhile
    assert set(after.load()) == {H100_A.uuid, H100_B.uuid}
    after.remember([H100_A])
    assert after.known()[H100_B.uuid] == H100_B
    assert set(KnownGpus(tmp_path).load()) == {H100_A.uuid, H100_B.uuid}


def test_remember_before_load_does_not_wipe_the_file(tmp_path: Path) -> None:
    KnownGpus(tmp_path).remember([H100_A])
    KnownGpus(tmp_path).remember([H100_B])  # no load() first
    assert set(KnownGpus(tmp_path).load()) == {H100_A.uuid, H100_B.uuid}


class WriteCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_with: int | None = None) -> None:
        self.calls = 0
        self.fail_with = fail_with
        self._real = statefile.atomic_write_json
        monkeypatch.setattr(statefile, "atomic_write_json", self)

    def __call__(self, path: Path, data: dict[str, Any]) -> None:
        self.calls += 1
        if self.fail_with is not None:
            raise StateDirError(path, error(self.fail_with))
        self._real(path, data)


def test_writes_only_when_something_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = WriteCounter(monkeypatch)
    known = KnownGpus(tmp_path)
    known.load()
    known.remember([H100_A, H100_B])
    assert writes.calls == 1
    for _ in range(5):
        known.remember([H100_A, H100_B])
        known.remember([H100_A])
        known.remember([])
    assert writes.calls == 1
    upgraded = dataclasses.replace(H100_A, driver_version="580.200.01")
    known.remember([upgraded, H100_B])
    assert writes.calls == 2
    assert KnownGpus(tmp_path).load()[H100_A.uuid].driver_version == "580.200.01"
    renumbered = dataclasses.replace(H100_B, index=0)
    known.remember([renumbered])
    assert writes.calls == 3


def test_forget_removes_a_gpu_for_good(tmp_path: Path) -> None:
    known = KnownGpus(tmp_path)
    known.remember([H100_A, H100_B])
    assert known.forget(H100_B.uuid) is True
    assert known.forget(H100_B.uuid) is False
    assert known.forget("GPU-never-seen") is False
    assert set(known.known()) == {H100_A.uuid}
    assert set(KnownGpus(tmp_path).load()) == {H100_A.uuid}


def test_write_failure_logged_once_memory_stays_right_retried_on_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    writes = WriteCounter(monkeypatch, fail_with=errno.EROFS)
    known = KnownGpus(tmp_path, retry_interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="gpuwatch.files.statefile"):
        known.remember([H100_A])
        known.remember([H100_A, H100_B])  # a change: retried at once
        assert writes.calls == 2
        known.remember([H100_A, H100_B])  # no change, within the retry interval: no attempt
        assert writes.calls == 2
        now[0] += 61
        known.remember([H100_A, H100_B])  # still unsaved, interval passed: retried
        assert writes.calls == 3
        assert set(known.known()) == {H100_A.uuid, H100_B.uuid}
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "Read-only file system" in warnings[0].getMessage()
        assert str(tmp_path / KNOWN_GPUS_FILE) in warnings[0].getMessage()

        writes.fail_with = None  # the disk is writable again
        known.remember([MI300X])
        assert writes.calls == 4
        assert "again" in caplog.records[-1].getMessage()
    assert set(KnownGpus(tmp_path).load()) == {H100_A.uuid, H100_B.uuid, MI300X.uuid}
    known.remember([H100_A, H100_B, MI300X])
    assert writes.calls == 4  # saved now: nothing more to write


def test_unsaved_state_retried_after_interval_without_a_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    writes = WriteCounter(monkeypatch, fail_with=errno.ENOSPC)
    known = KnownGpus(tmp_path, retry_interval_s=30.0, clock=lambda: now[0])
    known.remember([H100_A])
    writes.fail_with = None
    now[0] = 10.0
    known.remember([H100_A])
    assert not (tmp_path / KNOWN_GPUS_FILE).exists()
    now[0] = 31.0
    known.remember([H100_A])
    assert KnownGpus(tmp_path).load() == {H100_A.uuid: H100_A}


def test_corrupt_known_gpus_file_starts_empty_and_is_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / KNOWN_GPUS_FILE
    path.write_text('{"kind": "known_gpus", "version": 1, "gpus": {"GPU-1": {"vend')
    known = KnownGpus(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert known.load() == {}
    assert len(asides(path)) == 1
    known.remember([H100_A])
    assert KnownGpus(tmp_path).load() == {H100_A.uuid: H100_A}


def test_malformed_entries_are_skipped_not_the_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = dataclasses.asdict(H100_A)
    atomic_write_json(
        tmp_path / KNOWN_GPUS_FILE,
        doc(
            "known_gpus",
            gpus={
                H100_A.uuid: good,
                "GPU-bad-vendor": {**good, "uuid": "GPU-bad-vendor", "vendor": "intel"},
                "GPU-bad-index": {**good, "uuid": "GPU-bad-index", "index": "0"},
                "GPU-bad-model": {**good, "uuid": "GPU-bad-model", "model": 7},
                "GPU-mismatch": {**good},  # uuid field says another GPU
                "GPU-not-a-dict": [],
                "GPU-minimal": {"vendor": "amd", "index": 3},
            },
        ),
    )
    with caplog.at_level(logging.WARNING):
        loaded = KnownGpus(tmp_path).load()
    assert loaded == {
        H100_A.uuid: H100_A,
        "GPU-minimal": GpuIdentity(uuid="GPU-minimal", vendor="amd", index=3),
    }
    assert caplog.text.count("malformed entry") == 5


def test_known_gpus_without_gpus_object(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / KNOWN_GPUS_FILE, doc("known_gpus", gpus=[]))
    assert KnownGpus(tmp_path).load() == {}


identities = st.builds(
    GpuIdentity,
    uuid=st.text(min_size=1, max_size=40),
    vendor=st.sampled_from(["nvidia", "amd"]),
    index=st.integers(min_value=0, max_value=63),
    model=st.text(max_size=30),
    serial=st.text(max_size=20),
    pci_bus_id=st.text(max_size=16),
    driver_version=st.text(max_size=16),
    vbios_version=st.text(max_size=16),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(identities, max_size=8, unique_by=lambda g: g.uuid))
def test_any_identities_survive_a_restart(gpus: list[GpuIdentity]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        KnownGpus(Path(directory)).remember(gpus)
        assert KnownGpus(Path(directory)).load() == {g.uuid: g for g in gpus}
