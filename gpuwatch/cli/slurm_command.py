"""`gpuwatch slurm health-check` and `gpuwatch slurm epilog`: the agent's verdicts acted on in Slurm (docs/slurm.md).

health-check asks the local agent for /health/gpus (gpuwatch/cli/health_command.py) and, with Slurm's own scontrol:
- drains the node when a GPU needs an action above restart_app, with a reason `gpuwatch: GPU <i> (<uuid>) <action>`
  (updated when the node is drained by gpuwatch for another one);
- resumes the node only when its drain reason starts `gpuwatch:` and every verdict is clean (healthy: true);
- leaves alone a node drained or down by anyone else, and a node whose only problems are the agent's node findings
  (a collector failing, a vendor call hung in the agent: the agent's troubles, not a GPU's; a lost GPU has its own
  verdict): it neither drains nor resumes such a node.
It exits 0 when it did its job (drained, resumed or left the node alone), 69 when it could not reach the agent or
Slurm, 2 on bad usage. Everything it waits on, HTTP and scontrol alike, is bounded by what is left of its budget.

epilog probes the GPUs the finished job released (SLURM_JOB_GPUS, which slurmd puts in the epilog's environment:
src/plugins/gres/common/gres_common.c:706-708, merged into the epilog's environment at
src/plugins/prep/script/prep_script_slurmd.c:240-243, Slurm 22.05) in its own children, exactly as the agent
probes (gpuwatch/probe/runner.py: the per-GPU lock files keep it and the agent's own probe apart, a busy GPU is
skipped, baselines learn as the agent's do), killed when the budget runs out. The results reach the agent as a
file in its state dir that its `probe_results` collector takes (gpuwatch/probe/handoff.py says why a file), so its
metrics, verdicts and baselines show them; then it runs the health check, so a bad result drains the node.
A non-zero epilog drains the node in Slurm ("Epilog error", src/slurmctld/job_mgr.c:16017-16028): the epilog exits
0 unless its own command line is wrong (2), and says on stderr what it could not do.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwatch.cli.health_command import CannotTell, default_url, fetch, health_url
from gpuwatch.cli.probe_command import NodeUnavailable, polled_node
from gpuwatch.config.settings import Config
from gpuwatch.core.exitcodes import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from gpuwatch.files.statedir import StateDirUnsafe, require_safe_state_dir
from gpuwatch.files.statefile import StateDirError
from gpuwatch.judge.gpu_verdict import ACTIONS
from gpuwatch.probe.handoff import hand_over, wait_taken
from gpuwatch.probe.locks import LockUnavailable
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.readers.slurm_node import NodeState, SlurmUnavailable, scontrol, show_node
from gpuwatch.state.probebook import ProbeOutcome

REASON_PREFIX = "gpuwatch:"
DEFAULT_BUDGET_SECONDS = 10.0  # slurmd gives HealthCheckProgram 60 s (src/slurmd/slurmd/slurmd.c:2870)
MAX_BUDGET_SECONDS = 3600.0
# Of an epilog's budget, what the hand-over and the health check after the probe keep for themselves (at most).
EPILOG_RESERVE_SECONDS = 3.0
# What --diag-before-resume needs of the budget: gpuwatch diag --level 1 takes at most 30 s per GPU (the GPUs at once),
# plus reading the node and Slurm's answer.
DIAG_SECONDS = 45.0
STOP_GRACE_SECONDS = 1.0  # a probe killed at its deadline gets this long to record what it had
_DRAIN_FROM = ACTIONS.index("restart_app")  # an action above it drains; restart_app is the job's, not the node's


class Deadline:
    """What is left of a budget, on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


@dataclass(frozen=True, slots=True)
class Plan:
    """What the health check does to the node: drain (also: update a gpuwatch reason), resume or nothing; and why."""

    action: str  # "drain", "resume" or "none"
    reason: str
    says: str


def node_name(given: str | None) -> str:
    """--node, else $SLURMD_NODENAME (slurmd sets it for HealthCheckProgram, prolog and epilog:
    src/slurmd/slurmd/slurmd.c:2880, src/plugins/prep/script/prep_script_slurmd.c:243), else this host's short name,
    which is what slurmd itself uses when started without -N and its NodeName is the host's name
    (src/slurmd/slurmd/slurmd.c:1328 and 944)."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def needs_drain(gpu: dict[str, Any]) -> bool:
    """A GPU whose action ranks above restart_app; an action this gpuwatch does not know (a newer agent) counts."""
    action = gpu.get("action")
    return action not in ACTIONS or ACTIONS.index(action) > _DRAIN_FROM


def drain_reason(gpus: list[dict[str, Any]]) -> str:
    """`gpuwatch: GPU 2 (GPU-…) reboot_node`, the worst action first; `+N more` for the others, so it reads whole in
    `sinfo -R` (a free string to Slurm)."""
    ranked = sorted(gpus, key=lambda g: (-_rank(g.get("action")), g.get("index", 0)))
    first = ranked[0]
    reason = f"{REASON_PREFIX} GPU {first.get('index')} ({first.get('uuid') or 'no UUID'}) {first.get('action')}"
    return reason + (f" +{len(ranked) - 1} more" if len(ranked) > 1 else "")


def _rank(action: object) -> int:
    return ACTIONS.index(action) if action in ACTIONS else len(ACTIONS)


def plan(document: dict[str, Any], node: NodeState) -> Plan:
    """The rule (docs/slurm.md): drain for a GPU that needs it, resume only our own drain once all is clean, leave
    everyone else's drain or down alone."""
    bad = [g for g in document["gpus"] if isinstance(g, dict) and needs_drain(g)]
    ours = node.reason.startswith(REASON_PREFIX)
    wanted = drain_reason(bad) if bad else ""
    if (node.drained or node.down) and not ours:
        why = f"{'down' if node.down else 'drained'} by someone else ({node.reason or 'no reason'})"
        also = f"; gpuwatch would drain it: {wanted}" if bad else ""
        return Plan("none", "", f"{node.name}: {why}: left alone{also}")
    if node.down:  # our reason, but down since (not responding, an admin): resuming it is not ours to do
        return Plan("none", "", f"{node.name}: down ({node.reason}): left alone")
    if bad:
        if node.drained and node.reason == wanted:
            return Plan("none", "", f"{node.name}: already drained: {wanted}")
        return Plan("drain", wanted, f"{node.name}: drained: {wanted}")
    if not document["healthy"]:
        findings = "; ".join(str(f) for f in document.get("node_findings", [])) or "the agent says not healthy"
        state = "stays drained" if node.drained else "not drained"
        return Plan("none", "", f"{node.name}: {state}: no GPU needs draining, but the node is not clean ({findings})")
    if node.drained:
        return Plan("resume", "", f"{node.name}: resumed (was: {node.reason}); every GPU is healthy")
    return Plan("none", "", f"{node.name}: healthy")


def fetch_within(url: str, deadline: Deadline) -> dict[str, Any]:
    """health_command.fetch, given up at the deadline whatever the agent does (a slow drip of bytes included)."""
    box: list[dict[str, Any] | BaseException] = []

    def ask() -> None:
        try:
            box.append(fetch(url, timeout_seconds=max(0.1, deadline.left())))
        except BaseException as exc:
            box.append(exc)

    worker = threading.Thread(target=ask, name="slurm-health-fetch", daemon=True)
    worker.start()
    worker.join(deadline.left())
    if not box:
        raise CannotTell(f"the agent at {url} did not answer within the budget; is gpuwatch running (or hung) there?")
    answer = box[0]
    if isinstance(answer, BaseException):
        raise answer
    return answer


def health_check(
    config: Config,
    url: str | None,
    node: str | None,
    budget: float,
    *,
    command: str = "slurm health-check",
    deadline: Deadline | None = None,
    diag_before_resume: bool = False,
) -> int:
    """One check (module docstring); its exit status."""
    say_error = _stderr(command)
    if not 0 < budget <= MAX_BUDGET_SECONDS:
        say_error(f"--budget {budget:g} must be between 0 and {MAX_BUDGET_SECONDS:g} seconds")
        return EXIT_USAGE
    deadline = deadline or Deadline(budget)
    try:
        target = health_url(url if url is not None else default_url(config))
    except ValueError as exc:
        say_error(str(exc))
        return EXIT_USAGE
    name = node_name(node)
    try:
        document = fetch_within(target, deadline)
    except CannotTell as exc:
        say_error(f"cannot tell, the node is left as it is: {exc}")
        return EXIT_UNAVAILABLE
    try:
        state = show_node(name, deadline.left())
        decided = plan(document, state)
        if decided.action == "resume" and diag_before_resume:
            decided = _diag_first(config, decided, deadline, say_error)
        if decided.action == "drain":
            scontrol(["update", f"NodeName={name}", "State=DRAIN", f"Reason={decided.reason}"], deadline.left())
        elif decided.action == "resume":
            scontrol(["update", f"NodeName={name}", "State=RESUME"], deadline.left())
    except SlurmUnavailable as exc:
        say_error(f"cannot reach Slurm for node {name} (--node, $SLURMD_NODENAME), or it refused: {exc}")
        return EXIT_UNAVAILABLE
    print(decided.says, flush=True)
    return EXIT_OK


def _diag_first(config: Config, decided: Plan, deadline: Deadline, say: Callable[[str], None]) -> Plan:
    """`--diag-before-resume`: run `gpuwatch diag --level 1` on the drained node first and resume it only when no
    test failed; within the budget, which must then leave DIAG_SECONDS for it (without dcgmi, which takes minutes)."""
    from gpuwatch.cli.diag_command import failures, run_diag

    if deadline.left() < DIAG_SECONDS:
        return Plan(
            "none",
            "",
            f"left drained: --diag-before-resume needs {DIAG_SECONDS:g} s of the budget for gpuwatch diag --level 1, "
            f"{deadline.left():.0f} s were left (raise --budget and the HealthCheckProgram/prolog's time limit)",
        )
    code, diags = run_diag(config, level=1, gpus=[], force=False, progress=say, with_dcgm=False, command="slurm")
    if diags is None:
        return Plan("none", "", f"left drained: gpuwatch diag --level 1 could not run (exit {code}, said above)")
    failed = failures(diags)
    if failed:
        return Plan("none", "", "left drained: gpuwatch diag --level 1 failed: " + "; ".join(failed)[:400])
    if code != EXIT_OK:  # every test skipped: nothing passed
        skipped = "; ".join(f"GPU {d.identity.index} {t.name}: {t.detail}" for d in diags for t in d.tests[:1])
        return Plan("none", "", "left drained: gpuwatch diag --level 1 could run no test: " + skipped[:400])
    return dataclasses.replace(decided, says=f"{decided.says} (after gpuwatch diag --level 1 passed)")


def _stderr(command: str) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(f"gpuwatch {command}: {text}", file=sys.stderr, flush=True)

    return say


def released_gpus(value: str | None) -> list[int]:
    """SLURM_JOB_GPUS ('0,1,3': Slurm's GPU indices on this node, gres_common.c:683-684); ValueError if malformed."""
    if not value or not value.strip():
        return []
    try:
        return sorted({int(part) for part in value.split(",")})
    except ValueError:
        raise ValueError(f"SLURM_JOB_GPUS={value!r} is not a comma-separated list of GPU indices") from None


def epilog(config: Config, url: str | None, node: str | None, budget: float) -> int:
    """Probe the released GPUs, hand the results to the agent, then the health check; 0 unless bad usage."""
    say = _stderr("slurm epilog")
    if not 0 < budget <= MAX_BUDGET_SECONDS:
        say(f"--budget {budget:g} must be between 0 and {MAX_BUDGET_SECONDS:g} seconds")
        return EXIT_USAGE
    try:  # a wrong command line fails before the probe, not after it
        health_url(url if url is not None else default_url(config))
    except ValueError as exc:
        say(str(exc))
        return EXIT_USAGE
    deadline = Deadline(budget)
    reserve = min(EPILOG_RESERVE_SECONDS, budget * 0.4)
    try:
        gpus = released_gpus(os.environ.get("SLURM_JOB_GPUS"))
    except ValueError as exc:
        say(f"{exc}; probing nothing")
        gpus = []
    job = os.environ.get("SLURM_JOB_ID", "?")
    if gpus:
        outcomes = _probe_within(config, gpus, Deadline(max(0.0, deadline.left() - reserve)), deadline, say)
        if outcomes:
            try:
                path = hand_over(config.state_dir, outcomes, f"slurm epilog of job {job}")
            except StateDirError as exc:
                say(f"cannot hand the probe results to the agent: {exc}")
            else:
                if not wait_taken(path, deadline.end - reserve / 2):
                    say(
                        f"the agent has not taken {path.name} yet (is it running, with the probe_results collector "
                        "on?): it takes it when it can; the health check below does not see it"
                    )
                print(
                    f"job {job}: probed GPU "
                    + ", ".join(f"{o.index} {o.result}{f' ({o.reason})' if o.reason else ''}" for o in outcomes),
                    flush=True,
                )
    code = health_check(config, url, node, budget, command="slurm epilog", deadline=deadline)
    return EXIT_USAGE if code == EXIT_USAGE else EXIT_OK  # anything else would drain the node for Slurm's reasons


def _probe_within(
    config: Config, gpus: list[int], deadline: Deadline, overall: Deadline, say: Callable[[str], None]
) -> list[ProbeOutcome]:
    """The probe of `gpus`, as the agent's (lock files, busy GPUs skipped, baselines in the agent's mode), its
    workers killed at `deadline`; the outcomes it recorded ([] when it could not run or did not end in time). Killing
    and waiting for a round that passed its deadline never runs past the `overall` one."""
    box: list[list[ProbeOutcome]] = []
    runners: list[ProbeRunner] = []
    problem: list[str] = []
    gave_up = threading.Event()  # set before the runners are stopped: a runner made after it never starts a worker

    def run() -> None:
        try:
            require_safe_state_dir(config.state_dir)  # as `gpuwatch probe`: its links would steer this (root) process
            with polled_node(config) as (store, sources):
                known = {i.index for i in store.identities().values()}
                if missing := [n for n in gpus if n not in known]:
                    say(f"SLURM_JOB_GPUS names GPU {missing}, which this node does not have (GPUs: {sorted(known)})")
                settings = dataclasses.replace(
                    config.probe,
                    require_idle_node=False,  # the other GPUs may run jobs: that is the point of probing between jobs
                    timeout_seconds=max(0.1, deadline.left() - 0.2),  # each worker killed at the deadline
                )
                runner = ProbeRunner(settings, store, config.state_dir, launcher=sources.probe_launcher)
                runners.append(runner)
                if not gave_up.is_set():
                    box.append(runner.run(gpus=set(gpus), baseline_mode="agent", wait_for_locks=False))
        except (NodeUnavailable, LockUnavailable, StateDirUnsafe) as exc:
            problem.append(str(exc))
        except Exception as exc:  # the health check still runs: an epilog must not fail for the probe
            problem.append(f"the probe failed unexpectedly: {type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run, name="slurm-epilog-probe", daemon=True)
    worker.start()
    worker.join(deadline.left())
    if worker.is_alive():
        gave_up.set()
        for runner in list(runners):  # kills every worker (and any it starts after); its round records them
            runner.stop(min(STOP_GRACE_SECONDS, overall.left() / 2))
        worker.join(min(STOP_GRACE_SECONDS, overall.left() / 2))
        if worker.is_alive():
            say("the probe did not end within the budget (its workers are killed); no results to hand over")
            return []
    if problem:
        say(f"cannot probe GPU {', '.join(map(str, gpus))}: {problem[0]}")
    return box[0] if box else []
