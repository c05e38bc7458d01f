"""`gpuwatch check`'s output on a good node and on a bad one, as golden files (tests/golden/check-*.txt): every line
`[ok|warn|FAIL] what: detail` in plain words (no Python dicts), and under every warn and FAIL line what to do about it.
Regenerate with GPUWATCH_UPDATE_GOLDEN=1 after reading the diff."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

GOLDEN = Path(__file__).parent / "golden"
LINE = re.compile(r"\[(ok|warn|FAIL)\] \S.*?: \S.*")
FIX = re.compile(r"    fix: \S.*")


def _check(tmp: Path, *args: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "check", "--backend", "simulated", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    text = result.stdout.replace(str(tmp), "<tmp>")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"nvidia-ml-py [\w.+-]+", "nvidia-ml-py <version>", text)
    return result.returncode, text


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUWATCH_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name}: regenerate with GPUWATCH_UPDATE_GOLDEN=1 after checking the diff"


def _one_format(text: str) -> None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        assert LINE.fullmatch(line) or FIX.fullmatch(line), line
        if line.startswith(("[warn]", "[FAIL]")):
            assert i + 1 < len(lines) and FIX.fullmatch(lines[i + 1]), f"no remedy under: {line}"
    assert "{" not in text and "none needed" not in text


def test_a_good_node(tmp_path: Path) -> None:
    rc, text = _check(tmp_path, "--state-dir", str(tmp_path / "state"), "--listen", f"127.0.0.1:{free_port()}")
    assert rc == 0, text
    _one_format(text)
    _golden("check-good.txt", text)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_bad_node(tmp_path: Path, taken_port: int) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("a file where the state dir should be\n")
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: not-a-bcrypt-hash\n")
    config = tmp_path / "gpuwatch.toml"
    config.write_text('[simulated]\nscenario = "backend_down"\n')  # the driver missing
    rc, text = _check(
        tmp_path,
        *("--config", str(config), "--state-dir", str(not_a_dir), "--listen", f"127.0.0.1:{taken_port}"),
        *("--web-config", str(web)),
    )
    assert rc == 78, text  # the web config is what `gpuwatch run` would exit 78 on
    _one_format(text)
    assert text.count("[FAIL]") == 4, text
    _golden("check-bad.txt", text)


def test_every_registered_collector_says_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The collector lines come from the registry: each registration's module answers `check`, a disabled one is
    said as such, and a new registration brings its own line (and its remedy) with no change to the command."""
    import types

    from gpuwatch.cli import commands
    from gpuwatch.collectors import base as collector
    from gpuwatch.collectors.base import CheckLine, check_lines
    from gpuwatch.config.settings import load_config
    from gpuwatch.registry import COLLECTORS, REGISTRY, Registration
    from gpuwatch.service.nodes import build_sources

    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(tmp_path)}})
    said = {name for name, _ in check_lines(config, build_sources(config))}
    assert said == set(COLLECTORS)

    disabled = load_config(None, {"agent": {"backend": "simulated", "disable_collectors": ("ipmi",)}})
    ipmi = [line for name, line in check_lines(disabled, build_sources(disabled)) if name == "ipmi"]
    assert ipmi == [CheckLine("ok", "collector ipmi", "disabled (agent.disable_collectors)")]

    new = types.ModuleType("tests_nvswitch_collector")
    new.check = lambda config, sources, name: [  # type: ignore[attr-defined]
        CheckLine("FAIL", f"{name} fabric manager", "not running", "systemctl start nvidia-fabricmanager")
    ]
    monkeypatch.setitem(sys.modules, new.__name__, new)
    monkeypatch.setattr(collector, "REGISTRY", (*REGISTRY, Registration("nvswitch", new.__name__)))
    config = load_config(
        None, {"agent": {"backend": "simulated", "state_dir": str(tmp_path), "listen": f"127.0.0.1:{free_port()}"}}
    )
    assert commands.check(config) == 69  # its FAIL stops the agent like any other
    out = capsys.readouterr().out
    assert out.endswith("[FAIL] nvswitch fabric manager: not running\n    fix: systemctl start nvidia-fabricmanager\n")
    _one_format(out)


def test_a_warn_or_fail_line_without_a_remedy_is_refused() -> None:
    from gpuwatch.collectors.base import CheckLine

    with pytest.raises(ValueError, match="without a remedy"):
        CheckLine("warn", "probe engine", "none installed")
    assert CheckLine("ok", "probe engine", "simulated worker").fix == ""
