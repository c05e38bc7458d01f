"""The fault ledger (docs/verdicts.md, "Held until repaired"): real `gpuwatch run` agents on the simulated node,
restarted on one state dir as an operator would, read through what a scheduler reads (/health/gpus, the verdict
metrics, `gpuwatch health`), and `gpuwatch repair` as a person runs it.

XID 79's action is reboot_node from NVIDIA's XID catalogue (RESTART_BM; gpuwatch/core/xid_catalogue.py, 2025-10-29);
a reboot shows as a new boot id (random(4): /proc/sys/kernel/random/boot_id), the simulated node's `simulated.boot`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from processes import stop, until, wait_until_ready
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

from gpuwatch.judge.findings import gpu_health
from gpuwatch.state.ledger import LEDGER_FILE, MAX_FAULTS_PER_GPU, FaultLedger

GPU = 2  # the scenario xid's faulty GPU


class Agent:
    """One `gpuwatch run` on the simulated node, on a given state dir."""

    def __init__(self, state: Path, scenario: str, *, boot: int = 0, probe: float = 0) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = state.parent / f"config-{self.port}.toml"
        config.write_text(f"[simulated]\nboot = {boot}\n")
        self.log = state.parent / f"agent-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
                *("--config", str(config), "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(state)),
                *("--poll-interval", "1", "--probe-interval", str(probe)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        wait_until_ready(f"{self.base}/healthz", self.proc, f"agent ({scenario})")

    def document(self) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(f"{self.base}/health/gpus", headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def gpu(self, index: int = GPU) -> dict[str, Any]:
        return next(g for g in self.document()[1]["gpus"] if g["index"] == index)

    def until(self, what: str, test: Any, timeout: float = 120) -> Any:
        return until(what, test, timeout, context=lambda: f"; log:\n{self.log.read_text()[-3000:]}")

    def action_metric(self, index: int = GPU) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as reply:
            text = reply.read().decode()
        return {
            s.labels["action"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "gpuwatch_gpu_recommended_action"
            for s in f.samples
            if s.labels["gpu"] == str(index)
        }

    def stop(self) -> None:
        stop(self.proc)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def _gpuwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True, text=True, timeout=120)


def _repair(state: Path, gpu: str, note: str) -> subprocess.CompletedProcess[str]:
    return _gpuwatch("repair", "--gpu", gpu, "--note", note, "--state-dir", str(state))


def _ledger(state: Path) -> dict[str, Any]:
    return json.loads((state / LEDGER_FILE).read_text())


def _faults(state: Path, uuid: str) -> list[dict[str, Any]]:
    return _ledger(state)["gpus"][uuid]["faults"]


def _needing_action(gpu: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU once its fault is in the ledger (the verdict of the poll before the ledger's update is live only)."""
    held = any("held until repaired" in line for line in gpu["evidence"])
    return gpu if held and gpu["action"] not in ("none", "restart_app") else None


def _held_xid(agents: list[Agent], state: Path, **kwargs: Any) -> tuple[Agent, dict[str, Any]]:
    """An agent of the scenario xid whose GPU 2 reads reboot_node (XID 79), and GPU 2's verdict."""
    agent = Agent(state, "xid", **kwargs)
    agents.append(agent)
    gpu = agent.until("GPU 2 held for its XID 79", lambda: _needing_action(agent.gpu()))
    return agent, gpu


def test_an_xid_79_stays_after_a_restart_until_repaired_and_the_ledger_keeps_the_repair(
    state: Path, agents: list[Agent]
) -> None:
    first, gpu = _held_xid(agents, state)
    assert (gpu["state"], gpu["action"]) == ("unhealthy", "reboot_node")
    first.stop()

    # The Show: restarted on the same state dir with nothing wrong any more (scenario healthy: the same
    # GPUs, no XID in its kernel log).
    agent = Agent(state, "healthy")
    agents.append(agent)
    status, document = agent.document()
    assert status == 503 and document["healthy"] is False
    held = next(g for g in document["gpus"] if g["index"] == GPU)
    assert (held["state"], held["action"]) == ("unhealthy", "reboot_node"), held
    assert any("XID 79" in line and "held until repaired" in line for line in held["evidence"]), held
    (fault,) = held["held"]  # the same, machine-readable for a scheduler
    assert (fault["fault"], fault["action"], fault["returns"]) == ("XID 79", "reboot_node", 0), fault
    others = [g for g in document["gpus"] if g["index"] != GPU]
    assert all((g["state"], g["action"]) == ("healthy", "none") for g in others), others
    assert agent.action_metric() == {"reboot_node": 1.0}
    assert _gpuwatch("health", "--url", agent.base).returncode == 1
    with urllib.request.urlopen(f"{agent.base}/", timeout=30) as reply:  # the status page shows it, and the way out
        page = reply.read().decode()
    assert "held until repaired: XID 79" in page and f"gpuwatch repair --gpu {GPU}" in page

    repaired = _repair(state, str(GPU), "node rebooted, GPU reseated")
    assert repaired.returncode == 0, repaired.stderr
    assert "XID 79" in repaired.stdout and "repaired" in repaired.stdout
    agent.until("the repair read by the running agent", lambda: agent.document()[0] == 200, timeout=30)
    assert agent.gpu()["action"] == "none"
    assert agent.action_metric() == {"none": 1.0}
    assert _gpuwatch("health", "--url", agent.base).returncode == 0

    time.sleep(3)  # the agent's later polls change the ledger under its lock: they must not undo the repair
    (fault,) = _faults(state, held["uuid"])
    assert fault["key"] == "XID 79" and fault["action"] == "reboot_node"
    assert fault["closed"]["how"] == "repair" and fault["closed"]["note"] == "node rebooted, GPU reseated"
    assert fault["closed"]["by"] and fault["boots"] and fault["driver"]
    assert agent.document()[0] == 200


def test_the_same_fault_after_two_repairs_escalates(state: Path, agents: list[Agent]) -> None:
    """reboot_node (XID 79) -> inspect_hardware after it returned twice ([ledger] escalate_after = 2)."""
    actions = []
    for round_ in range(3):
        agent, gpu = _held_xid(agents, state)
        actions.append(gpu["action"])
        if round_ == 2:
            assert any("came back 2x" in line for line in gpu["evidence"]), gpu
        assert _repair(state, gpu["uuid"], f"round {round_}").returncode == 0
        agent.until("repaired", lambda a=agent: a.document()[0] == 200, timeout=30)
        agent.stop()
    assert actions == ["reboot_node", "reboot_node", "inspect_hardware"]
    faults = _faults(state, gpu["uuid"])
    assert [f["returns"] for f in faults] == [0, 1, 2]
    assert [f["closed"]["note"] for f in faults] == ["round 0", "round 1", "round 2"]


def test_a_fault_that_comes_back_through_reboots_escalates(state: Path, agents: list[Agent]) -> None:
    """XID 79 in boot 0, again in boot 1 and boot 2 (never repaired): the reboots did not cure it, so the same open
    fault counts each as a return, and after two it asks for inspect_hardware."""
    actions = []
    for boot in range(3):
        agent, gpu = _held_xid(agents, state, boot=boot)
        if boot:  # the fault is the old one, seen in a new boot: wait for the ledger's update of this poll
            agent.until(
                f"seen in boot {boot}",
                lambda a=agent, b=boot, u=gpu["uuid"]: len(_faults(state, u)[0]["boots"]) == b + 1 and a.gpu(),
            )
            gpu = agent.gpu()
        actions.append(gpu["action"])
        agent.stop()
    assert actions == ["reboot_node", "reboot_node", "inspect_hardware"]
    (fault,) = _faults(state, gpu["uuid"])
    assert fault["returns"] == 2 and fault["closed"] is None and len(set(fault["boots"])) == 3


def test_a_lifetime_ecc_count_is_one_fault_through_reboots_and_stays_repaired(state: Path) -> None:
    """NVML's aggregate uncorrectable ECC count persists across resets and reboots (nvml.h, nvmlEccCounterType_t:
    NVML_AGGREGATE_ECC, "Aggregate counts persist across reboots (i.e. for the lifetime of the device)"): the same
    count read in a new boot is the same fault, not one that came back; once repaired, the same count is the one the
    repair covered; only a count that grows opens the fault again. The agents run on the test's clock (the scenario
    adds an error every 5 s), each over the same state dir."""
    first = SimAgent(state, "ecc_uncorrectable")
    first.run(3)
    (held,) = first.agent.store.snapshot().ledger.open_faults(_uuid(first))
    assert (held.key, held.action, held.returns) == ("GpuEccUncorrectable", "reset_gpu", 0)

    rebooted = SimAgent(state, "ecc_uncorrectable", boot=1)  # the same count, read after a reboot
    rebooted.run(3)
    (fault,) = rebooted.agent.store.snapshot().ledger.gpus[_uuid(rebooted)].faults
    assert fault.is_open and fault.returns == 0 and len(fault.boots) == 2, fault

    assert _repair(state, str(GPU), "drained, reset, count noted").returncode == 0
    rebooted.run(2)  # polls that read the same count: it stays repaired
    assert gpu_health(rebooted.agent.store.snapshot())[0] is True, gpu_health(rebooted.agent.store.snapshot())[1]
    assert len(rebooted.agent.store.snapshot().ledger.gpus[_uuid(rebooted)].faults) == 1
    rebooted.run(40)  # more errors (ECC is read on the slow tier, every 30 s): the count grew, the fault is back
    (_, again) = rebooted.agent.store.snapshot().ledger.gpus[_uuid(rebooted)].faults
    assert again.is_open and again.returns == 1 and gpu_health(rebooted.agent.store.snapshot())[0] is False


def _uuid(sim: SimAgent) -> str:
    return next(i.uuid for i in sim.agent.store.snapshot().identities.values() if i.index == GPU)


def test_a_reboot_and_a_clean_probe_close_a_fault_a_reboot_cures(state: Path, agents: list[Agent]) -> None:
    first, gpu = _held_xid(agents, state)
    first.stop()
    same_boot = Agent(state, "healthy", probe=2)  # a clean probe in the same boot cures nothing
    agents.append(same_boot)
    same_boot.until("a probe ran", lambda: b'result="ok"' in _probe_runs(same_boot), timeout=120)
    time.sleep(1.5)
    assert same_boot.document()[0] == 503
    same_boot.stop()

    rebooted = Agent(state, "healthy", boot=1, probe=2)
    agents.append(rebooted)
    rebooted.until("closed by a clean probe after the reboot", lambda: rebooted.document()[0] == 200, timeout=120)
    (fault,) = _faults(state, gpu["uuid"])
    assert fault["closed"]["how"] == "clean_probe" and fault["closed"]["by"] == "gpuwatch agent"
    assert "rebooted" in fault["closed"]["note"]


def _probe_runs(agent: Agent) -> bytes:
    with urllib.request.urlopen(f"{agent.base}/metrics", timeout=30) as reply:
        return b"\n".join(
            line for line in reply.read().splitlines() if line.startswith(b'gpuwatch_probe_runs_total{gpu="2"')
        )


def _plant(state: Path, uuid: str, serial: str, index: int, **fault: Any) -> None:
    now = time.time()
    entry = {
        "key": "GpuRowRemapFailure",
        "state": "unhealthy",
        "base_action": "replace_gpu",
        "action": "replace_gpu",
        "evidence": "GpuRowRemapFailure: a row remap failed -> replace_gpu",
        "opened": now - 3600,
        "at": now - 3600,
        "index": index,
        "driver": "580.159.04",
        "boots": ["11111111-2222-4333-8444-555555555555"],
        "returns": 0,
        "closed": None,
        **fault,
    }
    document = {
        "kind": "fault_ledger",
        "version": 1,
        "gpus": {uuid: {"serial": serial, "index": index, "faults": [entry]}},
    }
    (state / LEDGER_FILE).write_text(json.dumps(document))


def _identity(state: Path, agents: list[Agent]) -> dict[str, Any]:
    """GPU 2's UUID and serial, as a healthy agent reads them (then stopped, the ledger left empty)."""
    agent = Agent(state, "healthy")
    gpu = agent.gpu()
    agent.stop()
    (state / LEDGER_FILE).unlink(missing_ok=True)
    return gpu


def test_a_card_moved_to_another_slot_keeps_its_history_and_a_new_card_starts_clean(
    state: Path, agents: list[Agent]
) -> None:
    gpu = _identity(state, agents)
    _plant(state, gpu["uuid"], gpu["serial"], index=5)  # held while it sat in slot 5; the state dir came along
    moved = Agent(state, "healthy")
    agents.append(moved)
    verdict = moved.gpu()
    assert verdict["action"] == "replace_gpu" and any("GpuRowRemapFailure" in e for e in verdict["evidence"])
    moved.until("the record follows the card to slot 2", lambda: _ledger(state)["gpus"][gpu["uuid"]]["index"] == GPU)
    moved.stop()

    _plant(state, gpu["uuid"], "another-serial", index=GPU)  # the same UUID with another serial: not this card
    fresh = Agent(state, "healthy")
    agents.append(fresh)
    assert fresh.document()[0] == 200
    assert "a different card" in fresh.log.read_text()


def test_repair_says_what_is_wrong_with_its_input(state: Path, agents: list[Agent]) -> None:
    first, gpu = _held_xid(agents, state)
    first.stop()
    check = _gpuwatch("check", "--backend", "simulated", "--state-dir", str(state), "--listen", "127.0.0.1:0")
    assert f"[warn] fault ledger: GPU {GPU} ({gpu['uuid']}): XID 79 held -> reboot_node" in check.stdout, check.stdout
    empty = _repair(state, str(GPU), "  ")
    assert empty.returncode == 2 and "--note is empty" in empty.stderr
    unknown = _repair(state, "7", "done")
    assert unknown.returncode == 2 and f"faults are held for GPU {GPU} ({gpu['uuid']})" in unknown.stderr
    missing = _repair(state / "nowhere", str(GPU), "done")
    assert missing.returncode == 69 and "no state dir" in missing.stderr
    assert _faults(state, gpu["uuid"])[0]["closed"] is None  # nothing was lost or changed by the bad calls
    by_uuid = _repair(state, gpu["uuid"], "done")
    assert by_uuid.returncode == 0
    again = _repair(state, str(GPU), "done")
    assert again.returncode == 0 and "no fault held" in again.stdout


def test_a_ledger_that_is_not_one_is_moved_aside_and_a_bad_entry_is_skipped(state: Path) -> None:
    (state / LEDGER_FILE).write_text("{not json")
    assert FaultLedger(state).view().gpus == {}
    assert [p.name for p in state.iterdir() if p.name.startswith(f"{LEDGER_FILE}.corrupt-")]

    now = time.time()
    good = {
        "key": "XID 79",
        "state": "unhealthy",
        "base_action": "reboot_node",
        "action": "reboot_node",
        "evidence": "XID 79",
        "opened": now,
        "at": now,
        "index": 0,
        "driver": "580",
        "boots": ["b"],
        "returns": 0,
        "closed": None,
    }
    bad = [
        {**good, "action": "format_disk"},  # no such action
        {**good, "opened": float("nan")},
        {**good, "opened": 1e308},
        {**good, "returns": -1},
        {**good, "boots": []},
        {**good, "closed": {"time": now, "how": "magic", "by": "x", "note": ""}},
        "not a fault",
    ]
    faults = bad + [good] * (MAX_FAULTS_PER_GPU * 3)
    document = {"kind": "fault_ledger", "version": 1, "gpus": {"GPU-a": {"serial": "1", "index": 0, "faults": faults}}}
    document["gpus"]["GPU-b"] = {"serial": 5, "index": 0, "faults": []}  # a serial that is no string
    (state / LEDGER_FILE).write_text(json.dumps(document))
    view = FaultLedger(state).view()
    assert list(view.gpus) == ["GPU-a"]
    assert len(view.gpus["GPU-a"].faults) == MAX_FAULTS_PER_GPU
    assert all(f.action == "reboot_node" and f.opened == now for f in view.gpus["GPU-a"].faults)


def test_a_link_planted_as_the_ledger_is_never_followed(state: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    os.symlink(target, state / LEDGER_FILE)
    ledger = FaultLedger(state)
    assert ledger.view().gpus == {}
    assert target.read_text() == "precious"
