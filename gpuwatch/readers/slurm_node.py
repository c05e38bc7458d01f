"""One Slurm node's state and drain reason, as `scontrol show node NAME` prints them.

Slurm's own CLI, not its REST API or a library: scontrol is on every node that runs slurmd, speaks the cluster's
authentication (munge) and needs nothing else. The text is Slurm's `slurm_sprint_node_table` (src/api/node_info.c
in Slurm 22.05, which Debian 12 ships; the lines cited are of tag slurm-22-05-8-1):

* the state is one word, `State=BASE[+FLAG...]` (node_info.c:328, from `node_state_string_complete`), e.g.
  `IDLE+DRAIN`, `MIXED+DRAIN`, `DOWN+NOT_RESPONDING`;
* the reason is on a line of its own, last but Comment/Extra, `Reason=TEXT [USER@TIME]` (node_info.c:436-461):
  the text as set, then the user and time Slurm appends in brackets; a reason with newlines continues on indented
  lines, which this reader leaves out (gpuwatch's own reasons are one line).

Every scontrol run is bounded by a timeout and killed when it passes it: a slurmctld that does not answer must never
hold a health check or an epilog longer than its budget.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

SCONTROL = "scontrol"  # from PATH; Slurm runs prolog, epilog and HealthCheckProgram with no PATH: os.defpath's /usr/bin
_REASON_STAMP = re.compile(r" \[[^\]\[]*@[^\]\[]*\]$")  # " [root@2026-11-28T16:44:33]" (node_info.c:452-455)


class SlurmUnavailable(Exception):
    """scontrol could not answer (missing, timed out, or slurmctld unreachable); the message says what to do."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """What `scontrol show node` says of one node: its state words and its reason ('' when it has none)."""

    name: str
    base: str  # IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, ...
    reason: str

    @property
    def drained(self) -> bool:
        """Draining or drained: the DRAIN flag, whatever the base state (node_info.c prints both as +DRAIN)."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.base == "DOWN" or "FAIL" in self.flags


def parse_show_node(name: str, text: str) -> NodeState:
    """The node's state from scontrol's multi-line output; ValueError when the text has no State= for it."""
    state = ""
    reason = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            reason = _REASON_STAMP.sub("", stripped.removeprefix("Reason="))
        else:
            for field in stripped.split():
                if field.startswith("State="):
                    state = field.removeprefix("State=")
    if not state:
        raise ValueError(f"scontrol show node {name} printed no State= line: {text[:200]!r}")
    base, *flags = state.split("+")
    return NodeState(name, base.rstrip("*~#!%$@^-"), frozenset(flags), reason)


def scontrol(args: list[str], timeout_seconds: float) -> str:
    """Run scontrol with `args`, killed after `timeout_seconds`; its stdout, or SlurmUnavailable saying why not."""
    if timeout_seconds <= 0:
        raise SlurmUnavailable(f"no time left to run scontrol {' '.join(args)} (the budget is spent)")
    env = dict(os.environ)
    env.setdefault("PATH", os.defpath + ":/usr/sbin:/usr/local/bin")
    try:
        done = subprocess.run(
            [SCONTROL, *args], capture_output=True, text=True, timeout=timeout_seconds, env=env, check=False
        )
    except FileNotFoundError:
        raise SlurmUnavailable(
            "scontrol is not installed or not on PATH (Debian: apt-get install slurm-client)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            f"scontrol {' '.join(args)} did not answer within {timeout_seconds:.1f} s (killed): is slurmctld up "
            "(scontrol ping)?"
        ) from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmUnavailable(
            f"scontrol {' '.join(args)} failed ({done.returncode}): {said[-1] if said else 'no message'}"
        )
    return done.stdout


def show_node(name: str, timeout_seconds: float) -> NodeState:
    """The node's state now; SlurmUnavailable when slurmctld cannot tell (or has no such node)."""
    text = scontrol(["show", "node", name], timeout_seconds)
    try:
        return parse_show_node(name, text)
    except ValueError as exc:
        raise SlurmUnavailable(str(exc)) from None
