"""`gpuwatch snapshot`, the terminal twin of the status page: readings against their limits with units, a verdict per
GPU with its reason and what to do, the host's rails and supplies in a table; colour on a terminal (a real pty here),
none when piped or when NO_COLOR is set; --json keeps its shape and adds each GPU's findings."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CMD = [sys.executable, "-m", "gpuwatch", "snapshot", "--backend", "simulated"]


def _on_a_tty(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal, as a person at a shell sees it."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CMD, *args], stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    out = bytearray()
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError("snapshot wrote nothing for 60 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=30), out.decode().replace("\r\n", "\n")


def _piped(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=60, env=env)


def test_on_a_terminal_the_verdicts_are_coloured() -> None:
    rc, out = _on_a_tty("--scenario", "mixed")
    assert rc == 0, out
    # GPU 5's 500 W limit against its 700 W default: flagged, in the warning colour, with what to do
    assert re.search(r"\n +5 .*\x1b\[33mpower-capped: limit 500 W, default 700 W", out), out
    assert "what to do: restore the limit: nvidia-smi -i 5 -pl 700" in out
    anchor = "gpupowerlimitbelowdefault"
    assert f"runbook: /runbooks#{anchor} on the agent, docs/runbooks.md#{anchor}" in out
    assert "\x1b[32mok\x1b[0m" in out  # healthy GPUs in green
    plain = ANSI.sub("", out)
    assert re.search(r"\n +0 +NVIDIA H100 80GB HBM3 +\d+/89 +\d+/95 +\d+/700 +345/1980 +0% +\d+x16/5x16  ok", plain)


def test_piped_or_no_color_it_is_plain_text() -> None:
    piped = _piped("--scenario", "mixed")
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout, piped.stdout
    assert "power-capped: limit 500 W, default 700 W" in piped.stdout
    rc, out = _on_a_tty("--scenario", "mixed", env={**os.environ, "NO_COLOR": "1"})
    assert rc == 0 and "\x1b[" not in out, out
    coloured = ANSI.sub("", _on_a_tty("--scenario", "mixed")[1]).split("\n")
    assert coloured[:3] == out.split("\n")[:3] and len(coloured) == len(out.split("\n"))  # the same text, uncoloured


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("pcie_degraded", "PCIe link downtrained: gen 3 x8 of gen 5 x16 while busy"),
        ("row_remap_failure", "row remap failed"),
        ("power_limit_low", "power-capped: limit 450 W, default 700 W"),
    ],
)
def test_a_faulty_gpu_reads_its_fault_and_remedy(scenario: str, words: str) -> None:
    result = _piped("--scenario", scenario)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if re.match(r" +2  NVIDIA", line))
    assert words in row, row
    assert f"! {words}" in result.stdout and "what to do: " in result.stdout


def test_host_rails_and_supplies_in_a_table_with_their_limits() -> None:
    out = _piped("--scenario", "healthy").stdout
    assert re.search(r"rail +now V +limit V +nominal  state", out), out
    assert re.search(r"ipmi 12V +12\.\d{3} +10\.800 +12\.000  ok", out), out
    assert re.search(r"power supply +load W  state\nPS1 Status +612  up", out), out


def test_a_missing_driver_says_so_against_the_expected_count() -> None:
    result = _piped("--scenario", "backend_down")
    assert result.returncode == 69
    assert "nvml: unavailable: NVML: libnvidia-ml.so.1 was not found" in result.stdout
    assert "0 of 8 expected GPUs read" in result.stdout and "#gpubackenddown" in result.stdout


def test_json_keeps_its_shape_and_adds_findings() -> None:
    document = json.loads(_piped("--scenario", "mixed", "--json").stdout)
    assert set(document) == {"gpus", "backend_errors", "host", "host_errors"}
    gpu5 = next(g for g in document["gpus"] if g["identity"]["index"] == 5)
    assert gpu5["sample"]["power_limit_watts"]["enforced"] == 500
    assert [f["alert"] for f in gpu5["findings"]] == ["GpuPowerLimitBelowDefault"]
    assert gpu5["findings"][0]["runbook"] == "/runbooks#gpupowerlimitbelowdefault"  # the path the agent serves it at
