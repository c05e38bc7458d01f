"""Config files that are not what they seem: /dev/zero, a FIFO (at start-up and at SIGHUP), a 60,000-term sensor-map
expression, a 5,000-digit integer. Each is a configuration error naming the file (exit 78), never a hang, a
MemoryError or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.config.settings import ConfigError, load_config
from gpuwatch.files.sensormap import SensorMapError, load_sensor_maps

GPUWATCH = [sys.executable, "-m", "gpuwatch"]


def run_check(config: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCH, "run", "--config", str(config), "--listen", "127.0.0.1:0", "--backend", "simulated"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_dev_zero_as_config_is_exit_78_at_once() -> None:
    """`--config /dev/zero` read 1.9 GB, then MemoryError."""
    started = time.monotonic()
    result = run_check("/dev/zero")
    assert result.returncode == 78, result.stderr
    assert "/dev/zero" in result.stderr and "character device" in result.stderr
    assert "Traceback" not in result.stderr and time.monotonic() - started < 15


def test_a_fifo_as_config_is_exit_78_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    result = run_check(fifo)
    assert result.returncode == 78 and "FIFO" in result.stderr


def test_a_fifo_at_sighup_keeps_the_running_config_without_hanging(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[agent]\nlog_level = 'info'\n")
    assert load_config(path).agent.log_level == "info"
    path.unlink()
    os.mkfifo(path)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="FIFO"):
        load_config(path)  # what reload() calls; it logs the error and keeps the running config
    assert time.monotonic() - started < 1.0


def test_an_oversized_config_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    with open(path, "wb") as f:
        f.truncate(64 * 2**20)
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def sensor_map(tmp_path: Path, compute: str) -> Path:
    path = tmp_path / "board.toml"
    path.write_text(f'[[chip]]\nmatch = "nct6798-*"\n[chip.in4]\ncompute = "{compute}"\n')
    return path


def test_a_60000_term_compute_expression_is_a_config_error(tmp_path: Path) -> None:
    """It was a RecursionError and exit 1."""
    path = sensor_map(tmp_path, "@" + "+1" * 60_000)
    with pytest.raises(SensorMapError, match="compute"):
        load_sensor_maps([str(path)])
    with pytest.raises(ConfigError, match=r"host\.sensor_maps"):
        load_config(None, {"host": {"sensor_maps": [str(path)]}})


def test_deeply_nested_compute_is_a_config_error(tmp_path: Path) -> None:
    path = sensor_map(tmp_path, "(" * 150 + "@" + ")" * 150)
    with pytest.raises(SensorMapError, match="compute"):
        load_sensor_maps([str(path)])


def test_a_5000_digit_integer_in_a_sensor_map_is_a_config_error(tmp_path: Path) -> None:
    """The sensor-map reader lacked the config reader's ValueError branch: a traceback. Both share one reader now."""
    path = tmp_path / "board.toml"
    path.write_text(f'[[chip]]\nmatch = "x"\n[chip.in4]\nnominal = {"9" * 5000}\n')
    with pytest.raises(SensorMapError, match="not a usable TOML document"):
        load_sensor_maps([str(path)])


def test_the_agent_exits_78_for_a_sensor_map_it_cannot_use(tmp_path: Path) -> None:
    bad = sensor_map(tmp_path, "@" + "+1" * 60_000)
    config = tmp_path / "config.toml"
    config.write_text(f"[host]\nsensor_maps = ['{bad}']\n")
    result = run_check(config)
    assert result.returncode == 78, result.stderr
    assert "Traceback" not in result.stderr
