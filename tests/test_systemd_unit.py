"""The shipped unit as systemd reads it: `systemd-analyze verify` in a root where the install layout exists (the venv's
real entry point at /opt/gpuwatch/bin/gpuwatch), and `systemd-analyze security --offline=yes` within the target."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "gpuwatch.service"
DROP_INS = REPO / "systemd" / "drop-ins"
UVM_UNIT = REPO / "systemd" / "gpuwatch-nvidia-uvm.service"


@pytest.fixture
def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("systemd-analyze is missing: scripts/test.sh installs Debian's systemd package")
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    return path


def install_root(tmp_path: Path, unit_text: str, drop_ins: list[Path]) -> Path:
    """A filesystem root laid out as deploy/install.sh leaves a node, for `systemd-analyze --root`."""
    root = tmp_path / "root"
    bin_dir = root / "opt" / "gpuwatch" / "bin"
    bin_dir.mkdir(parents=True)
    entry = Path(sys.executable).parent / "gpuwatch"  # the console script pip wrote into this venv
    shutil.copy2(entry if entry.exists() else Path(sys.executable), bin_dir / "gpuwatch")
    for tool in ("/bin/kill", "/usr/bin/kill"):
        if Path(tool).exists():
            (root / "bin").mkdir(exist_ok=True)
            shutil.copy2(tool, root / "bin" / "kill")
            break
    (root / "usr" / "bin").mkdir(parents=True)
    shutil.copy2(root / "bin" / "kill", root / "usr" / "bin" / "nvidia-modprobe")  # stands in: verify checks +x
    (root / "usr" / "lib" / "systemd").mkdir(parents=True)
    for units in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if units.is_dir():
            shutil.copytree(units, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
            break
    system = root / "etc" / "systemd" / "system"
    (system / "gpuwatch.service.d").mkdir(parents=True)
    (system / "gpuwatch.service").write_text(unit_text)
    for drop_in in drop_ins:
        shutil.copy2(drop_in, system / "gpuwatch.service.d" / drop_in.name)
    shutil.copy2(UVM_UNIT, system / UVM_UNIT.name)  # install.sh puts it beside the unit with nvidia-uvm.conf
    return root


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def exposure(output: str) -> float:
    match = re.search(r"Overall exposure level for gpuwatch\.service: (\d+\.\d)", output)
    assert match, output
    return float(match.group(1))


def test_unit_and_every_drop_in_verify(analyze: str, tmp_path: Path) -> None:
    root = install_root(tmp_path, UNIT.read_text(), sorted(DROP_INS.glob("*.conf")))
    result = run(analyze, "verify", f"--root={root}", "gpuwatch.service")
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_nvidia_uvm_unit_verifies_and_runs_before_the_agent(analyze: str, tmp_path: Path) -> None:
    """nvidia_uvm must be loaded before the agent starts: DeviceAllow=char-nvidia* is resolved from /proc/devices at
    service start, and an ExecStartPre= of the agent cannot mknod under DeviceAllow=rw."""
    root = install_root(tmp_path, UNIT.read_text(), [DROP_INS / "nvidia-uvm.conf"])
    result = run(analyze, "verify", f"--root={root}", "gpuwatch-nvidia-uvm.service", "gpuwatch.service")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    drop_in = {line.strip() for line in (DROP_INS / "nvidia-uvm.conf").read_text().splitlines()}
    assert {"Wants=gpuwatch-nvidia-uvm.service", "After=gpuwatch-nvidia-uvm.service"} <= drop_in
    assert not any(line.startswith("ExecStartPre") for line in drop_in)  # never from inside the agent's sandbox
    uvm = {line.strip() for line in UVM_UNIT.read_text().splitlines()}
    assert {"Type=oneshot", "RemainAfterExit=yes", "Before=gpuwatch.service"} <= uvm
    assert "ExecStart=/usr/bin/nvidia-modprobe -u -c=0" in uvm
    assert not any(line.startswith(("DevicePolicy=", "NoNewPrivileges=")) for line in uvm)  # it must mknod
    broken = UVM_UNIT.read_text().replace("/usr/bin/nvidia-modprobe -u", "/usr/bin/nvidia-modprob -u")
    (root / "etc" / "systemd" / "system" / UVM_UNIT.name).write_text(broken)
    result = run(analyze, "verify", f"--root={root}", "gpuwatch-nvidia-uvm.service")
    assert result.returncode != 0 and "nvidia-modprob" in result.stderr  # the check above means something


def test_verify_catches_a_broken_unit(analyze: str, tmp_path: Path) -> None:
    """The check above means something: a typo in a directive, or a missing binary, fails it."""
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict")
    result = run(analyze, "verify", f"--root={install_root(tmp_path / 'a', broken, [])}", "gpuwatch.service")
    assert "Unknown key 'ProtectSystm'" in result.stderr  # a warning, exit 0: hence stderr == "" above
    missing = UNIT.read_text().replace("/opt/gpuwatch/bin/gpuwatch", "/opt/gpuwatch/bin/gpuwtch")
    result = run(analyze, "verify", f"--root={install_root(tmp_path / 'b', missing, [])}", "gpuwatch.service")
    assert result.returncode != 0 and "gpuwtch" in result.stderr


def test_security_exposure_is_at_most_2(analyze: str) -> None:
    result = run(analyze, "security", "--offline=yes", "--threshold=20", str(UNIT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert exposure(result.stdout) <= 2.0


def test_no_kernel_log_drop_in_lowers_the_exposure(analyze: str, tmp_path: Path) -> None:
    root = install_root(tmp_path, UNIT.read_text(), [DROP_INS / "no-kernel-log.conf"])
    result = run(analyze, "security", "--offline=yes", f"--root={root}", "gpuwatch.service")
    assert exposure(result.stdout) < exposure(run(analyze, "security", "--offline=yes", str(UNIT)).stdout)


def test_the_unit_keeps_what_the_agent_needs() -> None:
    """The settings whose absence would silently break the agent, or whose presence would (README table)."""
    lines = {line.strip() for line in UNIT.read_text().splitlines()}
    for needed in (
        "Type=notify",
        "RestartPreventExitStatus=78",
        "Restart=on-failure",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia* rw",
        "DeviceAllow=char-kfd rw",
        "DeviceAllow=char-drm rw",
        "AmbientCapabilities=CAP_SYSLOG",
        "StateDirectory=gpuwatch",
        "CacheDirectory=gpuwatch",
        "ConfigurationDirectory=gpuwatch",
        "After=network-online.target nvidia-persistenced.service",
    ):
        assert needed in lines, needed
    assert not any(
        line.startswith(("PrivateDevices=yes", "MemoryDenyWriteExecute=yes", "ProcSubset=pid")) for line in lines
    )
    assert any(line.startswith("WatchdogSec=") for line in lines)


def test_the_workloads_drop_in_lifts_only_hidepid(analyze: str, tmp_path: Path) -> None:
    """Reading other users' /proc/PID/cgroup and status needs no capability and no ptrace (mode 0444 in
    fs/proc/base.c), only /proc without hidepid: the drop-in sets ProtectProc=default and nothing else, and the
    exposure grows by that setting's weight (0.2) alone; the unit itself keeps ProtectProc=invisible."""
    drop_in = DROP_INS / "workloads.conf"
    settings = [line.strip() for line in drop_in.read_text().splitlines() if line.strip() and line[0] not in "#["]
    assert settings == ["ProtectProc=default"]
    assert "ProtectProc=invisible" in {line.strip() for line in UNIT.read_text().splitlines()}
    base = exposure(run(analyze, "security", "--offline=yes", str(UNIT)).stdout)
    root = install_root(tmp_path, UNIT.read_text(), [drop_in])
    with_drop_in = exposure(run(analyze, "security", "--offline=yes", f"--root={root}", "gpuwatch.service").stdout)
    assert base < with_drop_in <= base + 0.2 + 1e-9
