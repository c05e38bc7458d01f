"""What a release promises a user: every text names the distribution they can actually install (`gpuwatch-agent`;
PyPI's `gpuwatch` is an unrelated project), the version they see is the version pip installed, the licence is the one
pyproject declares, and the changelog has a section for this version."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from ports import free_port
from processes import stop, wait_until_ready
from repofiles import REPO

from gpuwatch import __version__

DISTRIBUTION = "gpuwatch-agent"

# What tells a user to install PyPI's `gpuwatch` (another project) instead of ours. A name "gpuwatch" not followed by
# "-agent" and not part of a path (/opt/gpuwatch, .venv/bin/gpuwatch) or a longer name (gpuwatch_agent):
_FOREIGN = r"(?<![\w/.-])gpuwatch(?![\w-])"
FOREIGN_INSTALL = [
    # pip install NAME, pip install -q --upgrade 'NAME[amd]', pipx install NAME (NAME: the foreign name): among
    # the words that follow `install` up to anything a pip argument cannot hold (prose's "(", a shell's ";", "&&",
    # "|", "#")
    re.compile(r"\b(?:pip3?|pipx|uv pip|uv tool)\s+install(?:\s+[-\w.:/=<>~!\[\],@+'\"]+)*?\s+['\"]?" + _FOREIGN),
    # 'NAME[nvidia]', NAME[probe,amd]: a requirement with extras, wherever it is written
    re.compile(_FOREIGN + r"\[[a-z][a-z0-9,\s-]*\]"),
    # NAME==0.1.0, NAME>=0.1
    re.compile(_FOREIGN + r"\s*(?:==|>=|<=|~=|!=)"),
    # install.sh --source NAME / --source 'NAME[...]'
    re.compile(r"--source[\s=]+['\"]?" + _FOREIGN),
    # the Ansible role's pip requirement: gpuwatch_source: NAME, or an argument spec's default: NAME
    re.compile(r"gpuwatch_source\b[^\n]*?(?::|default:)\s*['\"]?" + _FOREIGN),
    # the installed distribution looked up by the foreign name
    re.compile(r"(?:metadata\.version|distribution)\(\s*['\"]" + _FOREIGN + r"['\"]"),
]

# Not checked, on purpose: recorded output of past runs on real hardware, evidence of what an older build printed,
# not instructions. Rewriting it would falsify the record.
EXCLUDED = ("benchmarks/hardware/results/",)
# The foreign distribution's name, put into the old texts below when the tests run: this file spells no instruction
# to install it, so the check covers this file too.
FOREIGN_NAME = "gpu" + "watch"


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every file git tracks in the checkout, binary files (undecodable or with NUL bytes) left out."""
    names = (
        subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    files = []
    for name in names:
        if not name or name.startswith(EXCLUDED):
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            files.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return files


def foreign_install_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if any(pattern.search(line) for pattern in FOREIGN_INSTALL)]


# The old texts, and the other ways to say it, with @ standing for the foreign name.
OLD_TEXTS = [
    "python3 -m venv /opt/gpuwatch && /opt/gpuwatch/bin/pip install '@[nvidia]'   # or [amd]",
    "AMD SMI: the amdsmi Python package is not installed: pip install '@[amd]'",
    "pip install @",
    'pip install "@==0.1.0"',
    "pip3 install -q --upgrade @",
    "$venv/bin/python -m pip install -q --index-url https://pypi.org/simple '@[amd]'",
    "pipx install @",
    "# Build it from deploy/kubernetes/Dockerfile (pip install @[nvidia]); pin by digest in production.",
    "On AMD nodes (MI300X and other Instinct GPUs) install `@[amd]`: the `amdsmi` package",
    "curl -fsSL .../install.sh | sudo bash -s -- --source '@[nvidia]'   # from PyPI",
    "sudo bash deploy/install.sh --source @",
    "gpuwatch_source: @",
    "gpuwatch_source: {type: str, default: @, description: pip requirement or path to install}",
    "@>=0.1",
    'importlib.metadata.version("@")',
]


@pytest.mark.parametrize("line", [text.replace("@", FOREIGN_NAME) for text in OLD_TEXTS])
def test_the_check_catches_the_foreign_distribution(line: str) -> None:
    """The old texts (and the other ways to say it): each is caught, so the check below can fail."""
    assert foreign_install_lines(line) == [line]


@pytest.mark.parametrize(
    "line",
    [
        "python3 -m venv /opt/gpuwatch && /opt/gpuwatch/bin/pip install 'gpuwatch-agent[nvidia]'   # or [amd]",
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/gpuwatch demo",
        "pip install gpuwatch-agent==0.1.0 && gpuwatch check",
        "dist/gpuwatch_agent-0.1.0-py3-none-any.whl",
        "/opt/gpuwatch/bin/gpuwatch run        # the agent, on :9845",
        'return "{" + re.sub(r"\\bgpuwatch[:_]", "", expr) + "}"',
        "gpuwatch_source: gpuwatch-agent",
        'importlib.metadata.version("gpuwatch-agent")',
        "no probe engine installed: pip install 'gpuwatch-agent[probe]' (CuPy) or PyTorch beside gpuwatch",
        "pip install -e '.[dev]' && gpuwatch demo",
    ],
)
def test_the_check_leaves_our_own_names_alone(line: str) -> None:
    assert foreign_install_lines(line) == []


def test_no_text_tells_a_user_to_install_the_foreign_distribution() -> None:
    files = tracked_text_files()
    assert any(name == "README.md" for name, _ in files)  # the listing found the repository's files
    found = [f"{name}: {line}" for name, text in files for line in foreign_install_lines(text)]
    assert found == [], "PyPI's gpuwatch is another project; name gpuwatch-agent:\n" + "\n".join(found)


def test_the_version_shown_is_the_installed_distributions() -> None:
    """`gpuwatch version` prints gpuwatch.__version__, and pip's metadata for gpuwatch-agent agrees: an install made
    before a version bump (a stale editable install) would not."""
    installed = importlib.metadata.version(DISTRIBUTION)
    assert installed == __version__
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "version"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert re.fullmatch(rf"gpuwatch {re.escape(__version__)} \({DISTRIBUTION}, Python [\d.]+\S*\)", first), first


def test_version_says_when_pips_record_disagrees(tmp_path: Path) -> None:
    """A stale record of gpuwatch-agent first on sys.path (an install made before a version bump): `gpuwatch version`
    says so instead of passing it off as the code that runs."""
    stale = tmp_path / "gpuwatch_agent-0.0.1.dist-info"
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: gpuwatch-agent\nVersion: 0.0.1\n")
    assert importlib.metadata.version(DISTRIBUTION) == __version__  # without it: the real record
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not the checkout, whose gpuwatch_agent.egg-info (an editable install's) would come first
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"gpuwatch {__version__} (pip's metadata says {DISTRIBUTION} 0.0.1: reinstall it, "), first


def test_build_info_carries_the_version(tmp_path: Path) -> None:
    """The running agent's gpuwatch_build_info, scraped from a real demo process."""
    listen = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "demo", "--listen", listen, "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        wait_until_ready(f"http://{listen}/metrics", proc, "gpuwatch demo")
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        stop(proc)
    build_info = [line for line in text.splitlines() if line.startswith("gpuwatch_build_info{")]
    assert len(build_info) == 1, build_info
    assert f'version="{__version__}"' in build_info[0] and build_info[0].endswith(" 1.0")
    assert __version__ == importlib.metadata.version(DISTRIBUTION)


# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt (also Debian's /usr/share/common-licenses/Apache-2.0)
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_2_0_text() -> None:
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


def test_changelog_has_a_section_for_this_version() -> None:
    """Keep a Changelog: `## [0.1.0] - 2026-12-01` (or `- unreleased` until the day), with at least one entry."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    heading = re.search(
        rf"^## \[{re.escape(__version__)}\] - (?:\d{{4}}-\d{{2}}-\d{{2}}|unreleased)$", changelog, re.MULTILINE
    )
    assert heading, f"CHANGELOG.md has no '## [{__version__}] - DATE' section"
    section = changelog[heading.end() :].split("\n## ", 1)[0]
    assert re.search(r"^- \S", section, re.MULTILINE), "the section lists no change"
