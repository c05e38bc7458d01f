"""`gpuwatch health --npd` and the shipped node-problem-detector config (deploy/kubernetes/npd/), held to NPD's code.

What NPD does with a plugin is transcribed here from its source (github.com/kubernetes/node-problem-detector, commit
6632ca67148f7a23df9cdbd98d9e89b388561a3a), each step with its file and lines, and the real `gpuwatch health --npd` runs
through it against real simulated agents:
- pkg/custompluginmonitor/types/types.go:25-31: the statuses OK 0, NonOK 1, Unknown 2; 41-62: a rule's JSON fields.
- pkg/custompluginmonitor/types/config.go:27-39: the defaults (timeout 5s, invoke_interval 30s, max_output_length 80);
  41-75: the config's JSON fields; 139-181: Validate (plugin "custom", a rule's timeout at most the global one, a
  permanent rule's condition among the default conditions).
- pkg/custompluginmonitor/plugin/plugin.go:226-351: run (the timeout, stdout only, trimmed, cut at max_output_length
  bytes, exit 0 OK, 1 NonOK, anything else Unknown).
- pkg/custompluginmonitor/custom_plugin_monitor.go:157-298: a permanent rule's condition (NonOK True with the rule's
  reason and the plugin's message; OK False with the default reason and message; Unknown: the default reason and the
  plugin's message).
- pkg/types/types.go:56-68: a condition's JSON fields.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from ports import free_port, free_port_range
from processes import stop_all

from gpuwatch.cli.health_command import TIMEOUT_SECONDS, fit, npd_message
from gpuwatch.config.settings import DEFAULT_PORT, parse_listen
from gpuwatch.core.exitcodes import NPD_MAX_OUTPUT_LENGTH, NPD_NON_OK, NPD_OK, NPD_UNKNOWN

REPO = Path(__file__).resolve().parent.parent
KUBE = REPO / "deploy" / "kubernetes"
NPD_CONFIG = KUBE / "npd" / "npd-gpuwatch.json"
CONDITION = "GpuwatchGpuHealthy"  # the issue's name for it (#32)
GPUWATCH = (
    Path(sys.executable).parent / "gpuwatch"
)  # this venv's console script: the image's /opt/gpuwatch/bin/gpuwatch
KUBERNETES_VERSION = "1.30.0"  # as tests/test_deploy.py

# NPD's JSON fields, by the structs that read them: anything else json.Unmarshal would drop without a word.
CONFIG_FIELDS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}  # config.go:61-75
PLUGIN_CONFIG_FIELDS = {  # config.go:41-58
    "invoke_interval",
    "timeout",
    "max_output_length",
    "concurrency",
    "enable_message_change_based_condition_update",
    "skip_initial_status",
}
RULE_FIELDS = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}  # types.go:41-62
CONDITION_FIELDS = {"type", "status", "transition", "reason", "message"}  # pkg/types/types.go:56-68
DEFAULT_TIMEOUT, DEFAULT_INVOKE_INTERVAL, DEFAULT_MAX_OUTPUT_LENGTH = 5.0, 30.0, 80  # config.go:28-32
MAX_PLUGIN_BUFFER_BYTES = 4096  # plugin.go:39 maxCustomPluginBufferBytes

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    """Seconds of a Go time.ParseDuration string ("15s", "1m30s"); ValueError for what Go refuses too."""
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a Go duration")
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


@dataclass
class Condition:
    status: str  # "True", "False", "Unknown"
    reason: str
    message: str


@dataclass
class Npd:
    """The shipped config as NPD reads it: ApplyConfiguration's defaults, then Validate (config.go:78-181)."""

    config: dict[str, Any]

    @property
    def global_timeout(self) -> float:
        return go_duration(self.config["pluginConfig"].get("timeout", "5s"))

    @property
    def max_output_length(self) -> int:
        return int(self.config["pluginConfig"].get("max_output_length", DEFAULT_MAX_OUTPUT_LENGTH))

    @property
    def rule(self) -> dict[str, Any]:
        (rule,) = self.config["rules"]
        return rule  # type: ignore[no-any-return]

    def timeout(self, rule: dict[str, Any]) -> float:
        """plugin.go:230-234: the rule's timeout when it is below the global one, else the global one."""
        own = go_duration(rule["timeout"]) if "timeout" in rule else None
        return own if own is not None and own < self.global_timeout else self.global_timeout

    def default(self, condition_type: str) -> Condition:
        (default,) = [c for c in self.config["conditions"] if c["type"] == condition_type]
        return Condition("False", default["reason"], default["message"])

    def run(self, rule: dict[str, Any], path: Path, args: list[str]) -> tuple[int, str, str]:
        """plugin.go:226-351: (status, message, stderr) of one run of PATH ARGS as NPD runs the rule."""
        try:
            done = subprocess.run([str(path), *args], capture_output=True, timeout=self.timeout(rule))
        except subprocess.TimeoutExpired as exc:  # plugin.go:331-333: killed; -1 is no exit status: Unknown
            out = (exc.stdout or b"")[:MAX_PLUGIN_BUFFER_BYTES].decode(errors="replace").strip()
            return NPD_UNKNOWN, f"Timeout when running plugin {str(path)!r}: output - {out!r}", ""
        output = done.stdout[:MAX_PLUGIN_BUFFER_BYTES].decode(errors="replace").strip()  # 296, 325
        output = output.encode()[: self.max_output_length].decode(errors="replace")  # 336-338: bytes
        status = {0: NPD_OK, 1: NPD_NON_OK}.get(done.returncode, NPD_UNKNOWN)  # 340-351
        return status, output, done.stderr.decode(errors="replace")

    def condition(self, previous: Condition, rule: dict[str, Any], status: int, message: str) -> Condition:
        """custom_plugin_monitor.go:173-236 and toConditionStatus (289-298), for a permanent rule."""
        default = self.default(rule["condition"])
        new = {NPD_OK: "False", NPD_NON_OK: "True"}.get(status, "Unknown")
        if previous.status == "True" and new != "True":  # scenario 1
            return Condition(new, default.reason, default.message if new == "False" else message)
        if previous.status != "True" and new == "True":  # scenario 2
            return Condition(new, rule["reason"], message)
        if previous.status != new:  # scenario 3
            return Condition(new, default.reason, default.message if new == "False" else message)
        change_on_message = self.config["pluginConfig"].get("enable_message_change_based_condition_update", False)
        if new == "True" and (previous.reason != rule["reason"] or (change_on_message and previous.message != message)):
            return Condition(new, rule["reason"], message)  # scenario 4
        return previous  # scenario 5


@pytest.fixture(scope="module")
def npd() -> Npd:
    return Npd(json.loads(NPD_CONFIG.read_text()))


# --- the shipped config, field by field ---------------------------------------------------------------------------


def test_the_config_has_only_fields_npd_reads(npd: Npd) -> None:
    config = npd.config
    assert set(config) <= CONFIG_FIELDS, set(config) - CONFIG_FIELDS
    assert set(config["pluginConfig"]) <= PLUGIN_CONFIG_FIELDS, set(config["pluginConfig"]) - PLUGIN_CONFIG_FIELDS
    for rule in config["rules"]:
        assert set(rule) <= RULE_FIELDS, set(rule) - RULE_FIELDS
    for condition in config["conditions"]:
        assert set(condition) <= CONDITION_FIELDS, set(condition) - CONDITION_FIELDS


def test_the_config_passes_npds_validation(npd: Npd) -> None:
    """config.go:78-181, but for the rule's path, which is the image's (the next test)."""
    config = npd.config
    assert config["plugin"] == "custom"  # 141
    assert go_duration(config["pluginConfig"].get("invoke_interval", "30s")) > 0  # 94, 144
    for rule in config["rules"]:
        assert rule["type"] in ("temporary", "permanent")  # pkg/types/types.go:97-102
        # A rule's own invoke_interval came after NPD v1.36.0 (the component's), which would drop it without a word.
        assert "invoke_interval" not in rule
        if "timeout" in rule:
            assert go_duration(rule["timeout"]) <= npd.global_timeout  # 152
        if rule["type"] == "permanent":
            assert rule["condition"] in {c["type"] for c in config["conditions"]}  # 164-179
    assert go_duration("1m30s") == 90 and go_duration("15s") == 15  # the parser itself
    for bad in ("15", "15 s", "s", ""):
        with pytest.raises(ValueError):
            go_duration(bad)


def test_the_condition_and_the_rule_are_gpuwatchs(npd: Npd) -> None:
    (condition,) = npd.config["conditions"]
    rule = npd.rule
    assert condition["type"] == rule["condition"] == CONDITION and rule["type"] == "permanent"
    # NPD sets a permanent condition True on NonOK (toConditionStatus): its reasons say which way it reads.
    assert rule["reason"] == "GpuNeedsAction"
    assert "True when one does" in condition["message"] and "no GPU that needs action" in condition["message"]
    # The plugin's line fits whole, and a restarted NPD does not flip a True condition to False before its first run.
    assert npd.max_output_length == NPD_MAX_OUTPUT_LENGTH == DEFAULT_MAX_OUTPUT_LENGTH
    assert npd.config["pluginConfig"]["skip_initial_status"] is True
    # The message holds ages ("7 s ago"): updating on each new message would post an event every 30 s.
    assert npd.config["pluginConfig"]["enable_message_change_based_condition_update"] is False


def test_the_rule_runs_gpuwatch_health_npd_with_time_to_answer(npd: Npd) -> None:
    """The rule's command is the image's gpuwatch (the venv scripts/build-image.sh makes, and the one deploy/install.sh
    and the .deb install) asking the agent in the same pod; NPD kills it only after health's own deadline."""
    rule = npd.rule
    assert rule["path"] == "/opt/gpuwatch/bin/gpuwatch"
    assert "in_root /usr/bin/python3 -m venv /opt/gpuwatch\n" in (REPO / "scripts" / "build-image.sh").read_text()
    assert "DEFAULT_PREFIX=/opt/gpuwatch\n" in (REPO / "deploy" / "install.sh").read_text()
    assert rule["args"] == ["health", "--npd", "--url", f"http://127.0.0.1:{DEFAULT_PORT}"]
    configmap = yaml.safe_load((KUBE / "configmap.yaml").read_text())
    listen = re.search(r'^listen = "(.*)"$', configmap["data"]["config.toml"], re.M)
    assert listen and parse_listen(listen.group(1))[1] == DEFAULT_PORT  # the agent listens where the rule asks
    # health's whole answer is bounded by TIMEOUT_SECONDS; the interpreter's start comes on top.
    assert npd.timeout(rule) >= TIMEOUT_SECONDS + 3
    assert npd.timeout(rule) < go_duration(npd.config["pluginConfig"].get("invoke_interval", "30s"))


# --- the contract, against real agents ------------------------------------------------------------------------------

SCENARIOS = ("healthy", "xid", "psu_undervoltage")
GPUS = 8


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A simulated agent per scenario: name -> base URL."""
    tmp = tmp_path_factory.mktemp("npd")
    first = free_port_range(len(SCENARIOS))
    procs, urls = [], {}
    for i, scenario in enumerate(SCENARIOS):
        procs.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
                    *("--listen", f"127.0.0.1:{first + i}", "--state-dir", str(tmp / f"state-{scenario}")),
                    *("--poll-interval", "1", "--probe-interval", "0"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        urls[scenario] = f"http://127.0.0.1:{first + i}"
    try:
        for scenario, url in urls.items():
            _settled(scenario, url)
        yield urls
    finally:
        stop_all(procs)


def _settled(scenario: str, base: str, timeout: float = 90) -> None:
    """Wait until the agent's verdicts show its scenario: healthy for "healthy", not healthy otherwise."""
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health/gpus?format=json", timeout=5) as reply:
                document = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            document = json.loads(exc.read())
        except OSError as exc:
            last = str(exc)
            time.sleep(0.5)
            continue
        actions = {g["index"]: g["action"] for g in document["gpus"] if g["action"] != "none"}
        want = {
            "healthy": {},
            "xid": {2: "reboot_node"},
            "psu_undervoltage": dict.fromkeys(range(GPUS), "inspect_hardware"),
        }
        if actions == want[scenario]:
            return
        last = json.dumps(document)
        time.sleep(0.5)
    raise AssertionError(f"{scenario}: the verdicts never settled; last: {last}")


def _run_rule(npd: Npd, url: str) -> tuple[int, str, str]:
    """The shipped rule as NPD runs it: its args, with the test agent's URL in place of the pod's loopback one."""
    rule = npd.rule
    args = [url if arg == f"http://127.0.0.1:{DEFAULT_PORT}" else arg for arg in rule["args"]]
    assert args != rule["args"]
    return npd.run(rule, GPUWATCH, args)


def _one_short_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message
    assert len(message.encode()) <= NPD_MAX_OUTPUT_LENGTH, message


def test_healthy_is_ok_and_leaves_the_condition_false(npd: Npd, agents: dict[str, str]) -> None:
    status, message, _ = _run_rule(npd, agents["healthy"])
    assert status == NPD_OK, message
    _one_short_line(message)
    assert message == f"ok: {GPUS} GPUs healthy"
    first = npd.condition(npd.default(CONDITION), npd.rule, status, message)
    assert first == npd.default(CONDITION)  # False, with the default reason and message


def test_xid_is_nonok_and_the_condition_names_gpu_action_and_evidence(npd: Npd, agents: dict[str, str]) -> None:
    status, message, _ = _run_rule(npd, agents["xid"])
    assert status == NPD_NON_OK, message
    _one_short_line(message)
    assert message.startswith("GPU 2 reboot_node: XID 79 (GPU has fallen off the bus)"), message
    condition = npd.condition(npd.default(CONDITION), npd.rule, status, message)
    assert condition == Condition("True", "GpuNeedsAction", message)
    # Repaired: OK brings back the default reason and message.
    ok_status, ok_message, _ = _run_rule(npd, agents["healthy"])
    assert npd.condition(condition, npd.rule, ok_status, ok_message) == npd.default(CONDITION)


def test_the_gpu_that_needs_the_most_comes_first_and_the_rest_are_counted(npd: Npd, agents: dict[str, str]) -> None:
    status, message, _ = _run_rule(npd, agents["psu_undervoltage"])
    assert status == NPD_NON_OK, message
    _one_short_line(message)
    assert message.startswith(f"GPU 0 inspect_hardware (+{GPUS - 1} more): GpuPower"), message


def test_the_heaviest_action_wins_then_the_worst_state_then_the_lowest_index() -> None:
    """Unit: the order of npd_message's pick (gpuwatch/judge/gpu_verdict.py ACTIONS and STATES, mildest first)."""

    def gpu(index: int, state: str, action: str, *evidence: str) -> dict[str, Any]:
        return {"index": index, "uuid": f"GPU-{index}", "state": state, "action": action, "evidence": list(evidence)}

    document: dict[str, Any] = {
        "healthy": False,
        "gpus": [
            gpu(0, "healthy", "none"),
            gpu(1, "healthy", "restart_app", "XID 13"),
            gpu(3, "unhealthy", "reset_gpu", "XID 48"),
            gpu(5, "degraded", "replace_gpu", "GpuRowRemapFailure: row remap failed"),
            gpu(6, "unhealthy", "replace_gpu", "GpuRowRemapFailure: row remap failed again"),
            gpu(7, "degraded", "none", "GpuPowerLimitBelowDefault"),
        ],
        "node_findings": ["GpusMissing: 1 GPU missing"],
    }
    assert npd_message(document) == "GPU 6 replace_gpu (+4 more): GpuRowRemapFailure: row remap failed again"
    document["gpus"] = [gpu(0, "healthy", "none"), gpu(7, "degraded", "none", "GpuPowerLimitBelowDefault")]
    assert npd_message(document) == "GPU 7 degraded: GpuPowerLimitBelowDefault"
    document["gpus"] = [gpu(0, "healthy", "none"), gpu(2, "unhealthy", "wipe_the_floor")]  # a newer agent's action
    assert npd_message(document) == "GPU 2 wipe_the_floor"
    document["gpus"] = [gpu(0, "healthy", "none")]
    assert npd_message(document) == "node: GpusMissing: 1 GPU missing"


def test_an_unreachable_agent_is_unknown_with_the_reason(npd: Npd) -> None:
    port = free_port()
    status, message, stderr = _run_rule(npd, f"http://127.0.0.1:{port}")
    assert status == NPD_UNKNOWN
    _one_short_line(message)
    assert message.startswith(f"cannot tell: agent unreachable at 127.0.0.1:{port}"), message
    assert "is gpuwatch running there?" in stderr  # the whole reason, for NPD's log
    condition = npd.condition(Condition("True", "GpuNeedsAction", "GPU 2 ..."), npd.rule, status, message)
    assert condition == Condition("Unknown", npd.default(CONDITION).reason, message)


class _HungAgent:
    """A loopback server that accepts and then drips a reply that never ends, a byte each 0.2 s: no single read times
    out, so only health's own deadline ends the wait. It stops by itself after 60 s."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.server = threading.Thread(target=self._serve, daemon=True)
        self.server.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.5)
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._drip, args=(conn, deadline), daemon=True).start()

    def _drip(self, conn: socket.socket, deadline: float) -> None:
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not self.stop.is_set() and time.monotonic() < deadline:
                    conn.sendall(b"a")
                    time.sleep(0.2)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.server.join(timeout=5)  # it checks the flag every 0.5 s; the socket closes after it stopped accepting
        self.sock.close()


def test_a_hung_agent_is_unknown_before_npd_kills_the_plugin(npd: Npd) -> None:
    hung = _HungAgent()
    try:
        started = time.monotonic()
        status, message, _ = _run_rule(npd, f"http://127.0.0.1:{hung.port}")
        took = time.monotonic() - started
    finally:
        hung.close()
    assert status == NPD_UNKNOWN, message
    assert not message.startswith("Timeout when running plugin"), message  # our answer, not NPD's kill
    _one_short_line(message)
    assert message == f"cannot tell: the agent gave no answer within {TIMEOUT_SECONDS:g} s", message
    assert TIMEOUT_SECONDS <= took < npd.timeout(npd.rule)


def test_plain_health_has_the_same_deadline() -> None:
    """HealthCheckProgram and NHC must not hang on a dripping agent either: 69 after TIMEOUT_SECONDS."""
    hung = _HungAgent()
    try:
        started = time.monotonic()
        done = subprocess.run(
            [str(GPUWATCH), "health", "--url", f"http://127.0.0.1:{hung.port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        took = time.monotonic() - started
    finally:
        hung.close()
    assert done.returncode == 69, done.stderr
    assert f"no answer within {TIMEOUT_SECONDS:g} s" in done.stderr
    assert took < TIMEOUT_SECONDS + 5


def test_bad_usage_is_unknown_with_a_line_that_says_so(tmp_path: Path) -> None:
    """argparse's 2 and gpuwatch's own usage errors are NPD's Unknown (2); so is a broken config (78 without --npd)."""
    cases = {
        ("health", "--npd", "--bogus"): "cannot tell: bad usage of gpuwatch health --npd",
        ("health", "--npd", "--json"): "cannot tell: bad usage of gpuwatch health --npd",
        ("health", "--npd", "--url", "ftp://127.0.0.1:9845"): "cannot tell: bad usage: --url 'ftp://127.0.0.1:9845'",
    }
    broken = tmp_path / "broken.toml"
    broken.write_text("[agent]\nlisten = 9845\n")
    cases[("health", "--npd", "--config", str(broken))] = "cannot tell: invalid configuration:"
    for args, start in cases.items():
        done = subprocess.run([str(GPUWATCH), *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == NPD_UNKNOWN, (args, done.stdout, done.stderr)
        (line,) = done.stdout.splitlines()
        _one_short_line(line)
        assert line.startswith(start), (args, line)
        assert "Traceback" not in done.stderr
    plain = subprocess.run([str(GPUWATCH), "health", "--config", str(broken)], capture_output=True, timeout=30)
    assert plain.returncode == 78 and plain.stdout == b""  # without --npd: gpuwatch's own statuses


def test_fit_cuts_at_a_character_within_the_byte_limit() -> None:
    """NPD cuts bytes (plugin.go:336-338); fit cuts first, at a character, so no half character reaches the node."""
    assert fit("  short\n line ") == "short line"
    exact = "x" * NPD_MAX_OUTPUT_LENGTH
    assert fit(exact) == exact
    for text in ("é" * 100, "x" + "°C" * 60, "GPU 2 inspect_hardware: " + "€" * 40):
        cut = fit(text)
        assert len(cut.encode()) <= NPD_MAX_OUTPUT_LENGTH and cut.endswith("...")
        assert text.startswith(cut[:-3])


# --- the manifests ----------------------------------------------------------------------------------------------------


def test_the_npd_component_renders_valid_manifests_that_fit_together(npd: Npd, tmp_path: Path) -> None:
    """deploy/kubernetes with its npd component, as an overlay of one's own renders it (kubectl kustomize, offline):
    valid for the Kubernetes schemas, NPD in the agent's pod running gpuwatch's image, with the shipped config."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = Path(os.path.relpath(KUBE, overlay))  # kustomize takes no absolute root
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{base.as_posix()}]\ncomponents: [{(base / 'npd').as_posix()}]\n"
    )
    rendered = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    docs = list(yaml.safe_load_all(rendered.stdout))
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    (ds,) = by_kind["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    agent, detector = containers["gpuwatch"], containers["node-problem-detector"]
    assert ds["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "gpuwatch"
    # NPD runs in gpuwatch's image (where the rule's path is), its binary copied by an init container into /npd.
    assert detector["image"] == agent["image"]
    (copier,) = [c for c in pod["initContainers"] if c["name"] == "npd-binary"]
    assert copier["image"].startswith("registry.k8s.io/node-problem-detector/node-problem-detector:v")
    mounts = {m["name"]: m["mountPath"] for m in detector["volumeMounts"]}
    assert (
        {m["name"]: m["mountPath"] for m in copier["volumeMounts"]}
        == {"npd-bin": "/npd"}
        == {"npd-bin": mounts["npd-bin"]}
    )
    assert copier["command"][-1] == detector["command"][0] == "/npd/node-problem-detector"
    flag = f"--config.custom-plugin-monitor={mounts['npd-config']}/{NPD_CONFIG.name}"
    assert flag in detector["command"]
    # The config volume is the generated ConfigMap, holding the shipped file as it is.
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmaps = {c["metadata"]["name"]: c for c in by_kind["ConfigMap"]}
    shipped = configmaps[volumes["npd-config"]["configMap"]["name"]]
    assert json.loads(shipped["data"][NPD_CONFIG.name]) == npd.config
    # The rule asks the agent on the pod's loopback, at its container port.
    assert npd.rule["args"][-1] == f"http://127.0.0.1:{agent['ports'][0]['containerPort']}"
    # NPD's identity: the built-in ClusterRole, its token in NPD's container only.
    (binding,) = by_kind["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "system:node-problem-detector"
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert pod["automountServiceAccountToken"] is False
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert mounts["npd-token"] == token_path
    assert all(m["mountPath"] != token_path for m in agent["volumeMounts"])
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in detector["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # A cluster's taint for a GPU that needs action does not evict or keep out the agent that reports the repair.
    assert {"key": "gpuwatch.io/gpu-unhealthy", "operator": "Exists"} in pod["tolerations"]
