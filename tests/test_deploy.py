"""The fleet deploy files, checked by the tools that consume them: ansible-playbook (syntax, check mode, real template
rendering), ansible-lint offline, the Kubernetes schemas (kubernetes-validate, offline), promtool, and install.sh
(its plan in dry runs, and as root a real install, upgrade and uninstall)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_systemd_unit import install_root

import gpuwatch
from gpuwatch import __version__
from gpuwatch.config.settings import load_config

REPO = Path(__file__).resolve().parent.parent
ANSIBLE = REPO / "deploy" / "ansible"
KUBE = REPO / "deploy" / "kubernetes"
BIN = Path(sys.executable).parent
KUBERNETES_VERSION = "1.30.0"


def ansible_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }


def ansible(tmp_path: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / tool), *args], cwd=ANSIBLE, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=300
    )


def local_inventory(tmp_path: Path) -> Path:
    """localhost as a GPU node and as the Prometheus server, plus a remote node that only appears in the targets."""
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_become": False,
                "ansible_python_interpreter": sys.executable,
                "gpuwatch_targets_file": str(tmp_path / "file_sd" / "gpuwatch.json"),
            },
            "children": {
                "gpu_nodes": {
                    "hosts": {"localhost": {}, "gpu-node-02": {"ansible_host": "10.0.0.2", "gpuwatch_port": 9846}}
                },
                "prometheus": {"hosts": {"localhost": {}}},
            },
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def test_playbook_syntax(tmp_path: Path) -> None:
    result = ansible(tmp_path, "ansible-playbook", "--syntax-check", "playbook.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_offline_production_profile(tmp_path: Path) -> None:
    result = ansible(tmp_path, "ansible-lint", "--offline", "playbook.yml", "roles/gpuwatch")
    assert result.returncode == 0, result.stdout + result.stderr


def test_role_in_check_mode_on_localhost_then_targets_for_real(tmp_path: Path) -> None:
    """Check mode changes nothing on this machine; the service tasks skip themselves where systemd is not PID 1."""
    inventory = local_inventory(tmp_path)
    check = ansible(tmp_path, "ansible-playbook", "-i", str(inventory), "playbook.yml", "--check", "-l", "localhost")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "failed=0" in check.stdout
    if not Path("/run/systemd/system").is_dir():
        assert "systemd is not PID 1 here" in check.stdout
    assert not (tmp_path / "file_sd" / "gpuwatch.json").exists()  # check mode wrote nothing

    real = ansible(
        tmp_path,
        "ansible-playbook",
        "-i",
        str(inventory),
        "playbook.yml",
        "--tags",
        "gpuwatch_targets",
        "-l",
        "localhost",
    )
    assert real.returncode == 0, real.stdout + real.stderr
    targets = json.loads((tmp_path / "file_sd" / "gpuwatch.json").read_text())
    # The file_sd format deploy/prometheus/prometheus.yml reads: a `node` label per target.
    assert targets == [
        {"targets": ["10.0.0.2:9846"], "labels": {"node": "gpu-node-02"}},
        {"targets": ["localhost:9845"], "labels": {"node": "localhost"}},
    ]


def render_role_templates(tmp_path: Path, **variables: object) -> Path:
    """Render the role's unit and config templates with ansible's own template module and the role's defaults."""
    out = tmp_path / "rendered"
    out.mkdir()
    templates = ANSIBLE / "roles" / "gpuwatch" / "templates"
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(ANSIBLE / "roles" / "gpuwatch" / "defaults" / "main.yml")],
                    "tasks": [
                        {
                            "name": f"Render {name}",
                            "ansible.builtin.template": {"src": str(templates / f"{name}.j2"), "dest": str(out / name)},
                        }
                        for name in ("gpuwatch.service", "config.toml")
                    ],
                }
            ]
        )
    )
    inventory = local_inventory(tmp_path)
    extra = tmp_path / "extra-vars.json"  # extra vars: above the role defaults read by vars_files
    extra.write_text(json.dumps(variables))
    result = ansible(tmp_path, "ansible-playbook", "-i", str(inventory), str(playbook), "-e", f"@{extra}")
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_unit_template_with_defaults_is_the_shipped_unit(tmp_path: Path) -> None:
    out = render_role_templates(tmp_path)
    rendered = (out / "gpuwatch.service").read_text().split("\n", 1)[1]  # after "# Ansible managed"
    assert rendered == (REPO / "systemd" / "gpuwatch.service").read_text()
    assert load_config(out / "config.toml").agent.listen == ":9845"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_unit_template_with_options_verifies_and_config_loads(tmp_path: Path) -> None:
    out = render_role_templates(
        tmp_path,
        gpuwatch_kernel_log=False,
        gpuwatch_ipmi=True,
        gpuwatch_expected_nvidia=8,
        gpuwatch_power_limit_watts=600,
        gpuwatch_web_config={"basic_auth_users": {"prometheus": "$2b$12$x"}},
        gpuwatch_watchdog_sec=90,
    )
    unit = (out / "gpuwatch.service").read_text()
    assert "DeviceAllow=char-ipmidev rw" in unit and "WatchdogSec=90s" in unit
    assert "AmbientCapabilities=CAP_SYSLOG" not in unit and "ProtectKernelLogs=yes" in unit
    root = install_root(tmp_path, unit, [])
    result = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "gpuwatch.service"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    config = load_config(out / "config.toml")
    assert config.gpus.expected_nvidia == 8 and config.gpus.power_limit_watts == 600.0
    assert config.xid.kernel_log == "" and config.agent.web_config == "/etc/gpuwatch/web-config.yml"


def kube_documents() -> list[tuple[str, dict[str, object]]]:
    docs = []
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs.append((path.name, doc))
    return docs


def test_kubernetes_manifests_match_the_schemas() -> None:
    checked = set()
    for name, doc in kube_documents():
        if name in ("servicemonitor.yaml", "kustomization.yaml"):
            continue  # a CRD and a kustomize file: not in the Kubernetes schemas
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked.add(doc["kind"])
    assert {"Namespace", "ConfigMap", "DaemonSet", "Service"} <= checked


def test_kubernetes_schema_check_rejects_a_typo() -> None:
    """The validation above means something: a misspelt field fails it."""
    daemonset = next(doc for name, doc in kube_documents() if name == "daemonset.yaml")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_kubernetes_pieces_fit_together(tmp_path: Path) -> None:
    docs = {doc["kind"]: doc for _, doc in kube_documents() if "kind" in doc}
    ds, svc, sm, cm = docs["DaemonSet"], docs["Service"], docs["ServiceMonitor"], docs["ConfigMap"]
    pod = ds["spec"]["template"]  # type: ignore[index]
    container = pod["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "resources" not in container or "nvidia.com/gpu" not in container["resources"].get("limits", {})
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}  # [compat] dcgm's Hostname label
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()  # type: ignore[index]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()  # type: ignore[index]
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]  # type: ignore[index]
    config = tmp_path / "config.toml"
    config.write_text(cm["data"]["config.toml"])  # type: ignore[index]
    loaded = load_config(config)
    assert "probe" in loaded.agent.disable_collectors and loaded.xid.kernel_log == ""
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert all((KUBE / name).exists() for name in kustomization["resources"])


def build_image_setting(name: str) -> str:
    """A NAME=value line of scripts/build-image.sh: what the image it builds is called and whom it runs as."""
    match = re.search(rf"^{name}=(\S+)$", (REPO / "scripts" / "build-image.sh").read_text(), re.MULTILINE)
    assert match, f"scripts/build-image.sh sets no {name}"
    return match.group(1)


def test_kubernetes_runs_the_image_this_project_builds() -> None:
    """The DaemonSet names the image scripts/build-image.sh tags (so `ctr -n k8s.io images import` of its archive is
    all a node needs: no pull), at this version, and runs it as the image's own user."""
    name, uid, gid = (build_image_setting(key) for key in ("IMAGE_NAME", "IMAGE_UID", "IMAGE_GID"))
    pod = next(doc for file, doc in kube_documents() if file == "daemonset.yaml")["spec"]["template"]["spec"]  # type: ignore[index]
    containers = pod["containers"] + pod["initContainers"]
    assert {(c["image"], c["imagePullPolicy"]) for c in containers} == {(f"{name}:{__version__}", "IfNotPresent")}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (str(pod["securityContext"]["runAsUser"]), str(pod["securityContext"]["runAsGroup"])) == (uid, gid)
    (init,) = pod["initContainers"]
    assert f"chown {uid}:{gid} /var/lib/gpuwatch" in init["command"][-1]
    # The build and load instructions in the comments name this version's archive and image too.
    for file in ("daemonset.yaml", "kustomization.yaml"):
        text = (KUBE / file).read_text()
        named = set(re.findall(r"gpuwatch-image-([\w.+-]+?)\.tar", text)) | set(
            re.findall(r"gpuwatch:([\w.+-]+)", text)
        )
        assert named == {__version__}, f"{file} names versions {named}, not {__version__}"
    assert not (KUBE / "Dockerfile").exists()  # one way to build the image: scripts/build-image.sh


@pytest.mark.parametrize(("name", "flags"), [("agent-remote-write.yml", ["--agent"]), ("federation.yml", [])])
def test_large_fleet_examples_pass_promtool(name: str, flags: list[str], promtool: str) -> None:
    path = REPO / "deploy" / "prometheus" / "remote-write" / name
    result = subprocess.run([promtool, "check", "config", *flags, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


INSTALL_SH = REPO / "deploy" / "install.sh"
# What install.sh writes on the node itself (--prefix moves only the venv).
NODE_PATHS = (
    Path("/etc/gpuwatch"),
    Path("/etc/systemd/system/gpuwatch.service"),
    Path("/etc/systemd/system/gpuwatch.service.d"),
    Path("/etc/systemd/system/gpuwatch-nvidia-uvm.service"),
    Path("/etc/udev/rules.d/60-gpuwatch-ipmi.rules"),
    Path("/opt/gpuwatch"),
    Path("/var/lib/gpuwatch"),
)


def install_sh(
    *args: str, env: dict[str, str] | None = None, stdin_script: bool = False
) -> subprocess.CompletedProcess[str]:
    """deploy/install.sh run as a file (beside its checkout), or piped into `bash -s` as `curl ... | bash` does."""
    full_env = {**os.environ, **(env or {})}
    if stdin_script:
        return subprocess.run(
            ["bash", "-s", "--", *args],
            input=INSTALL_SH.read_text(),
            capture_output=True,
            text=True,
            env=full_env,
            timeout=600,
            cwd="/",
        )
    return subprocess.run(["bash", str(INSTALL_SH), *args], capture_output=True, text=True, env=full_env, timeout=600)


@pytest.mark.skipif(os.geteuid() != 0, reason="installs into /etc for real: root only (CI runs as root)")
def test_install_script_installs_upgrades_and_uninstalls_for_real(tmp_path: Path) -> None:
    """A real install as root from this checkout (the venv under a temporary --prefix, no user, not started), a second
    run that keeps the operator's config, --uninstall (twice) and --uninstall --purge."""
    present = [str(path) for path in NODE_PATHS if path.exists()]
    if present:
        pytest.skip(f"gpuwatch is installed on this machine ({', '.join(present)}): not touching it")
    prefix = tmp_path / "opt" / "gpuwatch"
    modprobe = tmp_path / "nvidia-modprobe"  # nvidia-uvm's oneshot is installed where nvidia-modprobe exists
    modprobe.write_text("#!/bin/sh\n")
    modprobe.chmod(0o755)
    fixtures = {"GPUWATCH_NVIDIA_MODPROBE": str(modprobe), "GPUWATCH_IPMI_DEVICE": str(tmp_path / "no-ipmi0")}
    args = ["--prefix", str(prefix), "--python", sys.executable, "--extras", "", "--no-start", "--no-user"]
    try:
        first = install_sh(*args, env=fixtures)
        assert first.returncode == 0, first.stdout + first.stderr
        config = Path("/etc/gpuwatch/config.toml")
        assert load_config(config).agent.listen == ":9845"
        unit = Path("/etc/systemd/system/gpuwatch.service").read_text()
        shipped = (REPO / "systemd" / "gpuwatch.service").read_text()
        assert unit == shipped.replace("/opt/gpuwatch/", f"{prefix}/")
        assert f"ExecStart={prefix}/bin/gpuwatch run" in unit
        assert Path("/etc/systemd/system/gpuwatch.service.d/nvidia-uvm.conf").is_file()
        assert Path("/etc/systemd/system/gpuwatch-nvidia-uvm.service").is_file()
        assert not Path("/etc/systemd/system/gpuwatch.service.d/ipmi.conf").exists()  # no /dev/ipmi0 here
        for doc in ("README.md", "systemd.md", "config.example.toml"):
            assert (prefix / "share" / "doc" / "gpuwatch" / doc).is_file(), doc
        version = subprocess.run(
            [str(prefix / "bin" / "gpuwatch"), "version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert version.returncode == 0, version.stderr
        assert version.stdout.startswith(f"gpuwatch {gpuwatch.__version__} (gpuwatch-agent, "), version.stdout
        imported = subprocess.run(
            [str(prefix / "bin" / "python"), "-c", "import gpuwatch; print(gpuwatch.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert imported.stdout.startswith(str(prefix)), imported.stdout  # installed, not this checkout

        config.write_text(config.read_text() + "\n[gpus]\nexpected_nvidia = 8\n")  # the operator's edit
        second = install_sh(*args, env=fixtures)
        assert second.returncode == 0, second.stdout + second.stderr
        assert load_config(config).gpus.expected_nvidia == 8  # kept

        for attempt in range(2):  # the second finds nothing to remove, and succeeds
            removed = install_sh("--uninstall", "--prefix", str(prefix))
            assert removed.returncode == 0, removed.stdout + removed.stderr
            assert not prefix.exists() and not Path("/etc/systemd/system/gpuwatch.service").exists()
            assert not Path("/etc/systemd/system/gpuwatch.service.d").exists()
            assert not Path("/etc/systemd/system/gpuwatch-nvidia-uvm.service").exists()
            assert load_config(config).gpus.expected_nvidia == 8  # the config stays without --purge
            assert "kept /etc/gpuwatch" in removed.stdout
            assert ("nothing of gpuwatch to remove" in removed.stdout) is (attempt == 1)

        purged = install_sh("--uninstall", "--purge", "--prefix", str(prefix))
        assert purged.returncode == 0, purged.stdout + purged.stderr
        assert not Path("/etc/gpuwatch").exists()
    finally:
        install_sh("--uninstall", "--purge", "--prefix", str(prefix))


def test_install_script_refuses_a_prefix_that_is_not_a_venv(tmp_path: Path) -> None:
    """--uninstall deletes --prefix: never a directory that is not a venv (a typo such as --prefix /opt)."""
    (tmp_path / "keep.txt").write_text("mine")
    result = install_sh("--uninstall", "--dry-run", "--prefix", str(tmp_path))
    assert result.returncode == 1 and "not a venv" in result.stderr, result.stdout + result.stderr
    assert (tmp_path / "keep.txt").exists()


OPEN_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)  2025\n"
)
PROPRIETARY_550 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"


@pytest.mark.parametrize(
    ("driver", "flags", "expected"),
    [
        (OPEN_580, [], "[nvidia] cupy-cuda13x>=13"),
        (PROPRIETARY_550, [], "[nvidia,probe]"),  # pyproject's probe extra: cupy-cuda12x
        (None, [], "[nvidia,probe]"),  # driver version unknown: CUDA 12, and it says so
        (OPEN_580, ["--probe-cuda", "12"], "[nvidia,probe]"),
        (OPEN_580, ["--no-probe"], "[nvidia]"),
    ],
)
def test_install_script_picks_the_probe_engine(
    tmp_path: Path, driver: str | None, flags: list[str], expected: str
) -> None:
    version_file = tmp_path / "version"
    if driver is not None:
        version_file.write_text(driver)
    result = install_sh(
        "--dry-run",
        "--python",
        sys.executable,
        "--source",
        "gpuwatch-agent",
        "--extras",
        "nvidia",
        *flags,
        env={"GPUWATCH_NVIDIA_VERSION_FILE": str(version_file)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"would install into /opt/gpuwatch: gpuwatch-agent{expected}\n" in result.stdout
    if driver is None:
        assert "unknown, assuming CUDA 12" in result.stdout
    if "--no-probe" in flags:
        assert "WARNING: --no-probe" in result.stdout


def test_install_script_plans_nvidia_uvm_only_with_the_probe(tmp_path: Path) -> None:
    """The dry run says what the real run does (the real run is checked above, as root): the nvidia-uvm oneshot where
    nvidia-modprobe exists, unless --no-probe; the IPMI drop-in and udev rule where the BMC device exists."""
    modprobe = tmp_path / "nvidia-modprobe"
    modprobe.write_text("#!/bin/sh\n")
    modprobe.chmod(0o755)
    ipmi = tmp_path / "ipmi0"
    ipmi.write_text("")
    env = {"GPUWATCH_NVIDIA_MODPROBE": str(modprobe), "GPUWATCH_IPMI_DEVICE": str(ipmi)}
    for flags, planned in (([], True), (["--no-probe"], False)):
        result = install_sh("--dry-run", "--extras", "", *flags, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ("would add the drop-in nvidia-uvm.conf and gpuwatch-nvidia-uvm.service" in result.stdout) is planned
        assert "would add the drop-in ipmi.conf and /etc/udev/rules.d/60-gpuwatch-ipmi.rules" in result.stdout
    ipmi.unlink()
    assert "ipmi.conf" not in install_sh("--dry-run", "--extras", "", env=env).stdout


def test_install_script_piped_into_bash_installs_gpuwatch_agent_from_pypi() -> None:
    """`curl ... | sudo bash -s -- ...`: no script file, no checkout beside it; no unbound variable, and the
    distribution it would install is ours (PyPI's gpuwatch is another project)."""
    result = install_sh("--dry-run", "--extras", "amd", "--version", "0.1.0", stdin_script=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no gpuwatch tree beside this script" in result.stdout
    assert "would install into /opt/gpuwatch: gpuwatch-agent[amd]==0.1.0\n" in result.stdout
    helped = install_sh("--help", stdin_script=True)
    assert helped.returncode == 0 and "--uninstall" in helped.stdout, helped.stderr


def test_install_script_points_packagers_at_the_debian_package() -> None:
    """--root staged a venv whose scripts pointed into the staging dir: gone, with what to use instead."""
    result = install_sh("--root", "/tmp/stage")
    assert result.returncode == 1 and "scripts/build-deb.sh" in result.stderr and "--prefix" in result.stderr


def test_role_ships_the_same_nvidia_uvm_files_as_the_installer() -> None:
    files = ANSIBLE / "roles" / "gpuwatch" / "files"
    assert (files / "gpuwatch-nvidia-uvm.service").read_text() == (
        REPO / "systemd" / "gpuwatch-nvidia-uvm.service"
    ).read_text()
    assert (files / "nvidia-uvm.conf").read_text() == (REPO / "systemd" / "drop-ins" / "nvidia-uvm.conf").read_text()


@pytest.mark.parametrize("nvidia_node", [True, False])
def test_role_in_check_mode_detects_ipmi_nvidia_uvm_and_the_probe_engine(tmp_path: Path, nvidia_node: bool) -> None:
    """Detection pointed at fixtures: the BMC device, nvidia-modprobe and a 580 driver (or none of them)."""
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    if nvidia_node:
        (fixtures / "ipmi0").write_text("")
        (fixtures / "nvidia-modprobe").write_text("")
        (fixtures / "version").write_text(OPEN_580)
    extra = tmp_path / "detect.json"
    extra.write_text(
        json.dumps(
            {
                "gpuwatch_ipmi_device": str(fixtures / "ipmi0"),
                "gpuwatch_nvidia_modprobe": str(fixtures / "nvidia-modprobe"),
                "gpuwatch_nvidia_version_file": str(fixtures / "version"),
                "gpuwatch_extras": ["nvidia"] if nvidia_node else ["amd"],
            }
        )
    )
    inventory = local_inventory(tmp_path)
    check = ansible(
        tmp_path,
        "ansible-playbook",
        "-i",
        str(inventory),
        "playbook.yml",
        "--check",
        "-l",
        "localhost",
        "-e",
        f"@{extra}",
    )
    assert check.returncode == 0 and "failed=0" in check.stdout, check.stdout + check.stderr
    out = check.stdout
    new_tasks = ("Install the nvidia-uvm oneshot", "Pull the nvidia-uvm oneshot in before gpuwatch")
    if nvidia_node:
        assert "probe engine: cupy-cuda13x>=13 (NVIDIA driver 580.65.06)" in out
        assert "nvidia-uvm oneshot: True; IPMI: True" in out
        for task in (*new_tasks, "Give the gpuwatch group /dev/ipmi0"):
            assert re.search(rf"TASK \[gpuwatch : {re.escape(task)}\] \**\nchanged: \[localhost\]", out), task
    else:
        assert "probe engine: NONE" in out and "nvidia-uvm oneshot: False; IPMI: False" in out
        for task in (*new_tasks, "Give the gpuwatch group /dev/ipmi0"):
            assert re.search(rf"TASK \[gpuwatch : {re.escape(task)}\] \**\nskipping: \[localhost\]", out), task
