"""One verdict per GPU (docs/verdicts.md): real `gpuwatch run` agents on the simulated node, one per scenario, judged
through what a scheduler reads — /health/gpus as JSON, the one-hot metrics — and `gpuwatch health`'s exit statuses.
The XID mappings are held to NVIDIA's catalogue (gpuwatch/core/xid_catalogue.py, the catalogue of 2025-10-29)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from ports import free_port, free_port_range
from processes import stop_all
from prometheus_client.parser import text_string_to_metric_families
from test_webconfig import Pki, pki  # noqa: F401 (the module's test CA and server certificate)

from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.core.thresholds import xid_class
from gpuwatch.core.xid_catalogue import CATALOGUE, CATALOGUE_DATE, immediate_action
from gpuwatch.judge.gpu_verdict import ACTIONS, STATES, Step, decide, finding_step, verdict_of, xid_step
from gpuwatch.judge.verdict import judge_gpu

GPUS = 8
PROBED = {"underperforming", "corrupt"}  # shows its fault only in the probe: probes every 5 s

# scenario -> {GPU index: (state, action, words its evidence holds)}; every other GPU is healthy with nothing to do.
EXPECTED: dict[str, dict[int, tuple[str, str, tuple[str, ...]]]] = {
    "healthy": {},
    # XID 79's bucket is RESTART_BM (NVIDIA's catalogue); XID 13 (RESTART_APP) before it asks only for restart_app.
    "xid": {2: ("unhealthy", "reboot_node", ("XID 79", "RESTART_BM -> reboot_node", "XID 13", "RESTART_APP"))},
    "ecc_uncorrectable": {2: ("degraded", "reset_gpu", ("GpuEccUncorrectable", "uncorrectable ECC"))},
    # The failed remap asks for a new GPU; the driver's recovery action 1 (GPU_RESET) for less, so replace_gpu wins.
    "row_remap_failure": {2: ("unhealthy", "replace_gpu", ("GpuRowRemapFailure", "recovery action 1", "-> reset_gpu"))},
    "gpu_lost": {2: ("unhealthy", "reboot_node", ("GpuLost",))},
    "power_brake": {2: ("unhealthy", "inspect_hardware", ("GpuPowerBrakeSlowdown", "power supplies"))},
    "power_limit_low": {2: ("degraded", "none", ("GpuPowerLimitBelowDefault",))},
    "psu_undervoltage": {
        i: ("unhealthy", "inspect_hardware", ("GpuPowerSupplyUndersized", "power cables")) for i in range(GPUS)
    },
    "underperforming": {2: ("degraded", "reset_gpu", ("slow probe",))},
    # A wrong result is a compute error from the first probe: unhealthy, never a slow probe.
    "corrupt": {2: ("unhealthy", "reset_gpu", ("GpuComputeErrors", "column checksums disagree"))},
}
PASSWORD = "verdict-secret"


def _start(tmp: Path, name: str, scenario: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
            *("--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp / f"state-{name}"), "--poll-interval", "1"),
            *("--probe-interval", "5" if scenario in PROBED else "0", *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every scenario's agent at once, plus a healthy one behind basic auth: name -> base URL."""
    tmp = tmp_path_factory.mktemp("verdicts")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    first = free_port_range(len(EXPECTED) + 1)
    procs, urls = [], {}
    for i, scenario in enumerate(EXPECTED):
        procs.append(_start(tmp, scenario, scenario, first + i))
        urls[scenario] = f"http://127.0.0.1:{first + i}"
    auth_port = first + len(EXPECTED)
    procs.append(_start(tmp, "auth", "healthy", auth_port, "--web-config", str(tmp / "web.yml")))
    urls["auth"] = f"http://127.0.0.1:{auth_port}"
    try:
        yield urls
    finally:
        stop_all(procs)


def _get(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, str, bytes]:
    """(status, content type, body) of a request, error statuses included."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _document(base: str) -> tuple[int, dict[str, Any]]:
    status, content_type, body = _get(f"{base}/health/gpus?format=json")
    assert content_type == "application/json", (content_type, body)
    return status, json.loads(body)


def _settled(scenario: str, base: str, timeout: float = 90) -> tuple[int, dict[str, Any]]:
    """The document once every GPU reads as expected (faults develop over the first seconds; probes take longer)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            status, document = _document(base)
        except OSError:
            time.sleep(0.5)
            continue
        last = (status, document)
        got = {g["index"]: (g["state"], g["action"]) for g in document["gpus"]}
        want = {i: EXPECTED[scenario].get(i, ("healthy", "none", ()))[:2] for i in range(GPUS)}
        if got == want:
            return status, document
        time.sleep(0.5)
    raise AssertionError(f"{scenario}: the verdicts never settled as expected; last: {json.dumps(last, indent=1)}")


def _metrics(base: str) -> dict[str, list[Any]]:
    _, _, body = _get(f"{base}/metrics")
    families = text_string_to_metric_families(body.decode())
    return {f.name: f.samples for f in families}


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_each_scenario_gives_its_faulty_gpu_its_state_and_action(scenario: str, agents: dict[str, str]) -> None:
    status, document = _settled(scenario, agents[scenario])
    assert set(document) == {"node", "healthy", "gpus", "node_findings"}
    assert isinstance(document["node"], str) and document["node"]
    assert document["healthy"] is (status == 200) is (not EXPECTED[scenario])
    assert [g["index"] for g in document["gpus"]] == list(range(GPUS))
    info = {s.labels["gpu"]: s.labels for s in _metrics(agents[scenario])["gpuwatch_gpu_info"]}
    for gpu in document["gpus"]:
        assert set(gpu) == {"index", "uuid", "serial", "state", "action", "evidence", "held"}
        # what the fault ledger holds: faults that need an action and do not mend by themselves (docs/verdicts.md)
        # (none asks for more than the GPU's action, the worst of them all)
        assert all(ACTIONS.index(h["action"]) <= ACTIONS.index(gpu["action"]) for h in gpu["held"]), gpu
        assert (gpu["uuid"], gpu["serial"]) == (info[str(gpu["index"])]["uuid"], info[str(gpu["index"])]["serial"])
        expected = EXPECTED[scenario].get(gpu["index"])
        if expected is None:
            assert gpu["evidence"] == [], gpu
            continue
        evidence = "\n".join(gpu["evidence"])
        for words in expected[2]:
            assert words in evidence, (gpu["index"], words, gpu["evidence"])
    if scenario == "psu_undervoltage":  # the host's sagging rail is the node's, not one GPU's
        assert any("HostPsuRailUndervoltage" in line for line in document["node_findings"]), document


@pytest.mark.parametrize("scenario", ["healthy", "xid", "row_remap_failure", "psu_undervoltage"])
def test_the_metrics_hold_the_current_state_and_action_and_agree_with_the_json(
    scenario: str, agents: dict[str, str]
) -> None:
    """One series per GPU for each, its state's or action's, at 1: the others' zeros are not served (an exclusive
    set: docs/cost-and-sizing.md, "The series budget")."""
    _, document = _settled(scenario, agents[scenario])
    families = _metrics(agents[scenario])
    for family, label, values, key in (
        ("gpuwatch_gpu_health", "state", STATES, "state"),
        ("gpuwatch_gpu_recommended_action", "action", ACTIONS, "action"),
    ):
        by_gpu: dict[str, dict[str, float]] = {}
        for sample in families[family]:
            by_gpu.setdefault(sample.labels["gpu"], {})[sample.labels[label]] = sample.value
        assert sorted(by_gpu, key=int) == [str(i) for i in range(GPUS)]
        for gpu in document["gpus"]:
            assert gpu[key] in values
            assert by_gpu[str(gpu["index"])] == {gpu[key]: 1.0}, gpu


def test_json_only_when_asked_and_the_plain_answer_stays(agents: dict[str, str]) -> None:
    base = agents["xid"]
    _settled("xid", base)
    status, content_type, body = _get(f"{base}/health/gpus")
    assert (status, content_type) == (503, "text/plain; charset=utf-8")
    assert body.decode().startswith("GPU 2: "), body
    assert _get(f"{base}/health/gpus", accept="text/html")[1] == "text/plain; charset=utf-8"
    status, content_type, body = _get(f"{base}/health/gpus", accept="text/plain;q=0.5, application/json")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body)["gpus"][2]["action"] == "reboot_node"
    status, content_type, body = _get(f"{base}/health/gpus?format=json", method="HEAD")
    assert (status, content_type, body) == (503, "application/json", b"")
    status, content_type, body = _get(f"{agents['healthy']}/health/gpus", accept="application/json")
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body)["healthy"] is True


def _health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "health", *args], capture_output=True, text=True, timeout=60
    )


def test_gpuwatch_health_exits_0_when_healthy_and_1_when_a_gpu_needs_action(
    agents: dict[str, str], tmp_path: Path
) -> None:
    _settled("healthy", agents["healthy"])
    _settled("xid", agents["xid"])
    ok = _health("--url", agents["healthy"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ": healthy" in ok.stdout.splitlines()[0]
    bad = _health("--url", agents["xid"] + "/")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "GPU 2 (GPU-" in bad.stdout and "unhealthy, reboot_node" in bad.stdout and "XID 79" in bad.stdout
    as_json = _health("--url", agents["xid"], "--json")
    assert as_json.returncode == 1, as_json.stderr
    printed = json.loads(as_json.stdout)
    _, served = _document(agents["xid"])
    assert set(printed) == set(served) and printed["healthy"] is False
    verdicts = [(g["index"], g["uuid"], g["state"], g["action"]) for g in printed["gpus"]]
    assert verdicts == [(g["index"], g["uuid"], g["state"], g["action"]) for g in served["gpus"]]
    # With no --url: the configured listen address, as `run` reads it (here from --config).
    config = tmp_path / "gpuwatch.toml"
    config.write_text(f'[agent]\nlisten = "{agents["xid"].removeprefix("http://")}"\n')
    assert _health("--config", str(config)).returncode == 1


def test_gpuwatch_health_exits_2_on_bad_usage_and_69_when_it_cannot_tell(agents: dict[str, str]) -> None:
    assert _health("--url", "ftp://127.0.0.1:9845").returncode == 2
    assert _health("--bogus").returncode == 2
    unreachable = _health("--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 69, unreachable.stderr
    assert "cannot reach the agent" in unreachable.stderr
    not_the_agent = _health("--url", agents["healthy"] + "/nothing-here")  # 404: no verdicts to read
    assert not_the_agent.returncode == 69 and "answered 404" in not_the_agent.stderr, not_the_agent.stderr


def test_an_agent_behind_basic_auth_is_a_clear_69(agents: dict[str, str]) -> None:
    """gpuwatch health sends no credentials (reading the agent's web config is a later step): it says so."""
    deadline = time.monotonic() + 30
    while _reachable_status(agents["auth"]) != 401:
        assert time.monotonic() < deadline, "the agent behind basic auth never answered 401"
        time.sleep(0.3)
    locked = _health("--url", agents["auth"])
    assert locked.returncode == 69, locked.stdout + locked.stderr
    assert "asks for credentials (401" in locked.stderr


def _reachable_status(base: str) -> int | None:
    try:
        return _get(f"{base}/health/gpus")[0]
    except OSError:
        return None


# --- the mapping itself, signal by signal -----------------------------------------------------------------------


def test_every_bucket_of_nvidias_catalogue_has_an_action() -> None:
    """A catalogue update that brings a new resolution bucket must be mapped (docs/verdicts.md), not fall through."""
    from gpuwatch.judge.gpu_verdict import _ACTION_OF_BUCKET

    buckets = {action for _, _, action in CATALOGUE.values()} - {""}
    assert buckets <= set(_ACTION_OF_BUCKET), sorted(buckets - set(_ACTION_OF_BUCKET))


# NVIDIA's XID catalogue (gpuwatch/core/xid_catalogue.py, 2025-10-29): code, its resolution bucket, and the verdict.
XID_CASES = [
    (13, "RESTART_APP", "healthy", "restart_app"),  # graphics engine exception: the application's
    (31, "RESTART_APP", "healthy", "restart_app"),  # GPU memory page fault
    (43, "IGNORE", "healthy", "none"),
    (48, "WORKFLOW_XID_48", "unhealthy", "reset_gpu"),  # double-bit ECC
    (54, "CHECK_MECHANICALS", "unhealthy", "inspect_hardware"),  # auxiliary power not connected
    (64, "RESET_GPU", "unhealthy", "reset_gpu"),  # row remap failure
    (74, "WORKFLOW_NVLINK_ERR", "unhealthy", "reset_gpu"),
    (79, "RESTART_BM", "unhealthy", "reboot_node"),  # fallen off the bus
    (95, "RESET_GPU", "unhealthy", "reset_gpu"),  # uncontained memory error
    (119, "RESET_GPU", "unhealthy", "reset_gpu"),  # GSP RPC timeout
    (151, "RESTART_VM", "unhealthy", "reboot_node"),
    (154, "XID_154", "degraded", "reset_gpu"),  # recovery action changed
    (45, "WORKFLOW_XID_45", "healthy", "restart_app"),  # alone: cleanup after an earlier error (a notice)
    (159, "CHECK_UVM", "healthy", "restart_app"),  # the application's unified memory (a notice)
]


@pytest.mark.parametrize(("code", "bucket", "state", "action"), XID_CASES)
def test_an_xid_takes_its_action_from_nvidias_catalogue(code: int, bucket: str, state: str, action: str) -> None:
    assert CATALOGUE_DATE == "2025-10-29"
    assert immediate_action(code) == bucket, f"NVIDIA's catalogue gives XID {code} {immediate_action(code)}"
    step = xid_step(code, 1, 30.0, xid_class(code))
    assert (step.state, step.action) == (state, action)
    assert f"XID {code} " in step.evidence and bucket in step.evidence and f"-> {action}" in step.evidence
    if code == 54:
        assert "power cables" in step.evidence


def test_an_xid_the_catalogue_does_not_list_asks_for_a_reset() -> None:
    step = xid_step(999, 2, 10.0, xid_class(999))
    assert (step.state, step.action) == ("degraded", "reset_gpu")
    assert "not in NVIDIA's catalogue" in step.evidence


@pytest.mark.parametrize(
    ("value", "action"), [(1, "reset_gpu"), (2, "reboot_node"), (3, "reset_gpu"), (4, "reset_gpu")]
)
def test_the_drivers_recovery_action_by_its_value(value: int, action: str) -> None:
    """nvml.h nvmlGpuRecoveryAction_t: 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET."""
    identity = GpuIdentity(uuid="GPU-x", vendor="nvidia", index=0)
    findings = judge_gpu(identity, GpuSample(uuid="GPU-x", timestamp=0.0, recovery_action=value))
    assert verdict_of(findings, value)[:2] == ("unhealthy", action)
    assert verdict_of(judge_gpu(identity, GpuSample(uuid="GPU-x", timestamp=0.0, recovery_action=0)), 0) == (
        "healthy",
        "none",
        (),
    )


def test_the_worst_state_and_action_win() -> None:
    steps = [
        Step("degraded", "replace_gpu", "banks"),
        Step("unhealthy", "reset_gpu", "brake"),
        Step("healthy", "restart_app", "xid 13"),
        Step("healthy", "none", "nothing"),
    ]
    assert decide(steps) == ("unhealthy", "replace_gpu", ("banks", "brake", "xid 13"))
    assert decide([]) == ("healthy", "none", ())
    assert ACTIONS == ("none", "restart_app", "reset_gpu", "reboot_node", "inspect_hardware", "replace_gpu")


def test_an_info_finding_asks_for_nothing() -> None:
    identity = GpuIdentity(uuid="GPU-x", vendor="nvidia", index=0)
    sample = GpuSample(uuid="GPU-x", timestamp=0.0, throttle_active={"board_limit": True})
    findings = judge_gpu(identity, sample)
    assert [f.level for f in findings] == ["info"]  # "throttling: board limit": no alert on its own
    assert [finding_step(f) for f in findings] == [None]
    assert verdict_of(findings) == ("healthy", "none", ())


# --- where the operator looks, and TLS ----------------------------------------------------------------------------


def test_the_status_page_shows_the_verdict_of_the_faulty_gpu_only(agents: dict[str, str]) -> None:
    _settled("xid", agents["xid"])
    page = _get(agents["xid"] + "/")[2].decode()
    rows = {i: page.split(f'id="gpu-{i}"', 1)[1].split("</tr>", 1)[0] for i in range(GPUS)}
    assert "verdict: <b>unhealthy</b>, action <b>reboot_node</b>" in rows[2], rows[2]
    assert all("verdict:" not in rows[i] for i in range(GPUS) if i != 2)


def test_snapshot_shows_each_gpus_verdict(tmp_path: Path) -> None:
    args = (sys.executable, "-m", "gpuwatch", "snapshot", "--backend", "simulated", "--scenario", "row_remap_failure")
    as_json = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120, check=True).stdout
    verdicts = {g["identity"]["index"]: g["verdict"] for g in json.loads(as_json)["gpus"]}
    assert (verdicts[2]["state"], verdicts[2]["action"]) == ("unhealthy", "replace_gpu")
    assert any("GpuRowRemapFailure" in line for line in verdicts[2]["evidence"])
    assert all(
        (v["state"], v["action"], v["evidence"]) == ("healthy", "none", []) for i, v in verdicts.items() if i != 2
    )
    text = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    assert text.count("verdict: ") == 1 and "verdict: unhealthy, action replace_gpu" in text, text


@pytest.fixture(scope="module")
def tls_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("tls")
    (tmp / "web.yml").write_text(f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n")
    port = free_port()
    proc = _start(tmp, "tls", "healthy", port, "--web-config", str(tmp / "web.yml"))
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_an_https_agent_is_verified_against_the_systems_cas(tls_agent: str, pki: Pki) -> None:  # noqa: F811
    """The agent's CA trusted (OpenSSL's SSL_CERT_FILE, as an operator's CA bundle would be): exit 0; not trusted:
    69, naming TLS."""
    import os

    trusted = {**os.environ, "SSL_CERT_FILE": str(pki.ca)}
    deadline = time.monotonic() + 30
    while (
        done := subprocess.run(
            [sys.executable, "-m", "gpuwatch", "health", "--url", tls_agent],
            env=trusted,
            capture_output=True,
            text=True,
            timeout=60,
        )
    ).returncode != 0:
        assert time.monotonic() < deadline, done.stdout + done.stderr
        time.sleep(0.5)
    assert ": healthy" in done.stdout
    untrusted = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    refused = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "health", "--url", tls_agent],
        env=untrusted,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 69 and "TLS failed" in refused.stderr, refused.stderr
