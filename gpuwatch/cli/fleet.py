"""`gpuwatch simulate-fleet`: N simulated agents on loopback and a Prometheus file_sd targets file (spec/cli.md).

Every node is the real Agent (collectors, store, HTTP server) over its own SimulatedNode, seeded by its number so
that every GPU of the fleet has its own UUID. A fault goes to a whole node (`NODE=SCENARIO`, the scenario as
`gpuwatch demo --scenario` runs it) or to one GPU of an otherwise healthy node (`NODE/GPU=SCENARIO`). Every node
reads `--config`, or the file `--node-config NODE=FILE` gives it (a fleet whose nodes differ: one probing every few
seconds among nodes that probe rarely, as a test of the probe's alerts wants without the cost). Fleets poll
more slowly than one agent does, and large fleets run in several processes (NODES_PER_PROCESS nodes each), so the
simulator never starves the machine that runs Prometheus beside it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gpuwatch.core.exitcodes import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from gpuwatch.core.scenario_catalogue import SCENARIOS
from gpuwatch.service.signal_inbox import SignalInbox, StopRequest
from gpuwatch.simulated.scenarios import NODE_ONLY_SCENARIOS

log = logging.getLogger(__name__)

NODES_PER_PROCESS = 50
DEFAULT_POLL_INTERVAL_SECONDS = 5.0  # one agent polls every 1 s; a fleet of hundreds on one machine cannot
HOST = "127.0.0.1"
_FAULT = re.compile(r"^(?P<node>[^/=]+)(?:/(?P<gpu>[^=]+))?=(?P<scenario>.+)$")


class FleetError(Exception):
    """Bad usage of simulate-fleet (exit 2): the message says what is wrong and what to do."""


class FleetStartError(Exception):
    """A node could not start (exit 69): its port is taken, its state dir is not writable."""


@dataclass(frozen=True, slots=True)
class NodeFault:
    node: int
    gpu: int | None  # None: the scenario runs on the whole node
    scenario: str


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """What to serve: validated, picklable (child processes get it as it is)."""

    nodes: int
    gpus: int
    port_base: int
    vendor: str
    poll_interval_seconds: float
    state_dir: Path
    faults: tuple[NodeFault, ...] = ()
    config_path: Path | None = None
    log_level: str = "warning"
    nodes_per_process: int = NODES_PER_PROCESS
    node_configs: tuple[tuple[int, Path], ...] = ()  # (node, its config file instead of config_path)

    def node_name(self, index: int) -> str:
        return f"node-{index:0{max(3, len(str(self.nodes - 1)))}d}"

    def port(self, index: int) -> int:
        return self.port_base + index

    def scenario_of(self, index: int) -> str:
        return next((f.scenario for f in self.faults if f.node == index and f.gpu is None), "healthy")

    def config_of(self, index: int) -> Path | None:
        return next((path for node, path in self.node_configs if node == index), self.config_path)

    def gpu_scenarios_of(self, index: int) -> dict[int, str]:
        return {f.gpu: f.scenario for f in self.faults if f.node == index and f.gpu is not None}

    def targets(self) -> list[dict[str, Any]]:
        """The file_sd document: one target per node, labelled with its name."""
        return [
            {"targets": [f"{HOST}:{self.port(i)}"], "labels": {"node": self.node_name(i)}} for i in range(self.nodes)
        ]

    def groups(self) -> list[range]:
        step = self.nodes_per_process
        return [range(s, min(s + step, self.nodes)) for s in range(0, self.nodes, step)]


def parse_fault(text: str, nodes: int, gpus: int) -> NodeFault:
    """`NODE=SCENARIO` or `NODE/GPU=SCENARIO`; NODE is a number (0-based) or a name such as node-003."""
    match = _FAULT.match(text.strip())
    if match is None:
        raise FleetError(
            f"--fault {text!r}: expected NODE=SCENARIO or NODE/GPU=SCENARIO, e.g. 3=overheating or 3/2=gpu_lost"
        )
    node_text, gpu_text, scenario = match["node"], match["gpu"], match["scenario"]
    node = _node_number(f"--fault {text!r}", node_text, nodes)
    if scenario not in SCENARIOS:
        raise FleetError(f"--fault {text!r}: unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    gpu: int | None = None
    if gpu_text is not None:
        if not gpu_text.isdigit():
            raise FleetError(f"--fault {text!r}: GPU {gpu_text!r} is not a number")
        gpu = int(gpu_text)
        if gpu >= gpus:
            raise FleetError(
                f"--fault {text!r}: there is no GPU {gpu} on a node of {gpus} GPUs (GPUs are 0-{gpus - 1})"
            )
        if scenario in NODE_ONLY_SCENARIOS:
            raise FleetError(f"--fault {text!r}: {scenario!r} is about a whole node; give it as {node}={scenario}")
    return NodeFault(node, gpu, scenario)


def parse_node_config(text: str, nodes: int) -> tuple[int, Path]:
    """`NODE=FILE`: the config file that node reads instead of --config."""
    node_text, sep, path = text.partition("=")
    if not sep or not node_text.strip() or not path.strip():
        raise FleetError(f"--node-config {text!r}: expected NODE=FILE, e.g. 4=fast-probe.toml")
    return _node_number(f"--node-config {text!r}", node_text.strip(), nodes), Path(path.strip())


def _node_number(flag: str, node_text: str, nodes: int) -> int:
    """A node given as a number (0-based) or a name such as node-003, within the fleet."""
    node_match = re.fullmatch(r"(?:node-)?(\d+)", node_text)
    if node_match is None:
        raise FleetError(f"{flag}: node {node_text!r} is neither a number nor a name like node-003")
    node = int(node_match[1])
    if node >= nodes:
        raise FleetError(f"{flag}: there is no node {node} in a fleet of {nodes} (nodes are 0-{nodes - 1})")
    return node


def make_plan(
    *,
    nodes: int,
    gpus: int,
    port_base: int,
    vendor: str = "nvidia",
    faults: list[str] | tuple[str, ...] = (),
    poll_interval_seconds: float | None = None,
    state_dir: Path | None = None,
    config_path: Path | None = None,
    log_level: str = "warning",
    nodes_per_process: int = NODES_PER_PROCESS,
    node_configs: list[str] | tuple[str, ...] = (),
) -> FleetPlan:
    """Validate the command line into a plan; FleetError says what is wrong."""
    if nodes < 1:
        raise FleetError("--nodes must be at least 1")
    if gpus < 1:
        raise FleetError("--gpus must be at least 1")
    if port_base < 1 or port_base + nodes - 1 > 65535:
        raise FleetError(f"--port-base {port_base} with {nodes} nodes needs ports {port_base}-{port_base + nodes - 1}")
    if vendor not in ("nvidia", "amd"):
        raise FleetError(f"--vendor {vendor!r}: expected nvidia or amd")
    parsed = [parse_fault(f, nodes, gpus) for f in faults]
    seen: dict[tuple[int, int | None], str] = {}
    for f in parsed:
        key = (f.node, f.gpu)
        if key in seen:
            where = f"node {f.node}" + (f" GPU {f.gpu}" if f.gpu is not None else "")
            raise FleetError(f"--fault: {where} is given two scenarios ({seen[key]}, {f.scenario}); keep one")
        seen[key] = f.scenario
    per_node = [parse_node_config(c, nodes) for c in node_configs]
    given = [node for node, _ in per_node]
    twice = sorted({node for node in given if given.count(node) > 1})
    if twice:
        raise FleetError(f"--node-config: node {twice[0]} is given two config files; keep one")
    interval = DEFAULT_POLL_INTERVAL_SECONDS if poll_interval_seconds is None else poll_interval_seconds
    if interval <= 0:
        raise FleetError("--poll-interval must be > 0")
    if nodes_per_process < 1:
        raise FleetError("--nodes-per-process must be at least 1")
    directory = state_dir or Path(tempfile.gettempdir()) / f"gpuwatch-fleet-{os.getuid()}-{port_base}"
    return FleetPlan(
        nodes,
        gpus,
        port_base,
        vendor,
        interval,
        directory,
        tuple(parsed),
        config_path,
        log_level,
        nodes_per_process,
        tuple(per_node),
    )


# --- serving ---------------------------------------------------------------------------------------------------


def start_node(plan: FleetPlan, index: int) -> Any:
    """One node: its simulated GPUs, the real agent over them, listening on its own port. Returns the Agent."""
    from gpuwatch.collectors.configuration import load_config
    from gpuwatch.config.settings import ConfigError
    from gpuwatch.service.agent import Agent
    from gpuwatch.service.nodes import build_sources
    from gpuwatch.service.startup import StartupError
    from gpuwatch.simulated.scenarios import SimulatedNode
    from gpuwatch.web.server import ListenError

    state_dir = plan.state_dir / plan.node_name(index)
    state_dir.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, dict[str, Any]] = {
        "agent": {
            "backend": "simulated",
            "listen": f"{HOST}:{plan.port(index)}",
            "state_dir": str(state_dir),
            "poll_interval_seconds": plan.poll_interval_seconds,
            "log_level": plan.log_level,
        },
        "simulated": {"scenario": plan.scenario_of(index), "gpus": plan.gpus, "vendor": plan.vendor},
    }
    try:
        config = load_config(plan.config_of(index), overrides)
    except ConfigError as exc:
        raise FleetError(f"invalid configuration: {exc}") from None
    node = SimulatedNode(
        scenario=plan.scenario_of(index),
        gpus=plan.gpus,
        vendor=plan.vendor,
        seed=index,
        gpu_scenarios=plan.gpu_scenarios_of(index),
    )
    agent = Agent(config, build_sources(config, simulated_node=node))
    try:
        agent.start()
    except (StartupError, ListenError) as exc:
        agent.stop()
        raise FleetStartError(
            f"{plan.node_name(index)} (port {plan.port(index)}): {exc}; pick a free range with --port-base"
        ) from None
    return agent


def _start_group(plan: FleetPlan, indices: range) -> list[Any]:
    agents: list[Any] = []
    try:
        for index in indices:
            agents.append(start_node(plan, index))
    except BaseException:
        _stop_all(agents)
        raise
    return agents


def _stop_all(agents: list[Any]) -> None:
    threads = [threading.Thread(target=a.stop, daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5.0)


def _serve_group(plan: FleetPlan, indices: range, conn: Connection) -> None:
    """A child process: serve its nodes until the parent says stop or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    logging.basicConfig(level=plan.log_level.upper(), format=f"%(levelname)s fleet[{indices.start}]: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    try:
        agents = _start_group(plan, indices)
    except (FleetError, FleetStartError) as exc:
        conn.send(("error", str(exc)))
        return
    conn.send(("ok", ""))
    with contextlib.suppress(EOFError, OSError):
        conn.recv()
    _stop_all(agents)


@dataclass(slots=True)
class _Child:
    process: multiprocessing.process.BaseProcess
    conn: Connection


def write_targets(path: Path, plan: FleetPlan) -> None:
    """Atomically, so Prometheus never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(plan.targets(), indent=1) + "\n")
    os.replace(tmp, path)


def run_fleet(
    plan: FleetPlan,
    targets: Path,
    stop: StopRequest,
    *,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve the fleet until `stop` is set; the targets file exists while every node serves."""
    groups = plan.groups()
    children: list[_Child] = []
    local: list[Any] = []
    try:
        if len(groups) == 1:
            local = _start_group(plan, groups[0])
        else:
            ctx = multiprocessing.get_context("spawn")
            for indices in groups:
                parent_conn, child_conn = ctx.Pipe()
                process = ctx.Process(
                    target=_serve_group, args=(plan, indices, child_conn), name=f"fleet-{indices.start}", daemon=True
                )
                process.start()
                child_conn.close()
                children.append(_Child(process, parent_conn))
            for child in children:
                status, message = _wait_ready(child, stop)
                if status != "ok":
                    raise FleetStartError(message)
        write_targets(targets, plan)
        last = plan.port(plan.nodes - 1)
        announce(
            f"gpuwatch simulate-fleet: {plan.nodes} nodes x {plan.gpus} GPUs on {HOST}:{plan.port_base}-{last} "
            f"in {max(1, len(children))} process(es), poll every {plan.poll_interval_seconds:g} s; "
            f"targets in {targets}"
        )
        while not stop.wait(0.5):
            dead = [c for c in children if not c.process.is_alive()]
            if dead:
                raise FleetStartError(f"a fleet process ({dead[0].process.name}) died; stopping the fleet")
    finally:
        targets.unlink(missing_ok=True)
        for child in children:
            with contextlib.suppress(BrokenPipeError, OSError):
                child.conn.send("stop")
        _stop_all(local)
        for child in children:
            child.process.join(10.0)
            if child.process.is_alive():
                child.process.terminate()
                child.process.join(2.0)


def _wait_ready(child: _Child, stop: StopRequest) -> tuple[str, str]:
    while not stop.is_set():
        if child.conn.poll(0.2):
            try:
                status, message = child.conn.recv()
            except EOFError:
                return "error", f"fleet process {child.process.name} exited while starting"
            return str(status), str(message)
        if not child.process.is_alive():
            return "error", f"fleet process {child.process.name} exited while starting (exit {child.process.exitcode})"
    return "error", "stopped while starting"


def simulate_fleet(args: Any) -> int:
    """The `simulate-fleet` command: exit 0 after SIGTERM/SIGINT, 2 on bad usage, 69 when a node cannot start."""
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    try:
        plan = make_plan(
            nodes=args.nodes,
            gpus=args.gpus,
            port_base=args.port_base,
            vendor=args.vendor,
            faults=args.fault,
            poll_interval_seconds=args.poll_interval,
            state_dir=args.state_dir,
            config_path=args.config,
            log_level=args.log_level,
            nodes_per_process=args.nodes_per_process,
            node_configs=args.node_config,
        )
    except FleetError as exc:
        print(f"gpuwatch simulate-fleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = SignalInbox()  # its handlers only set a flag: a threading.Event's set() takes a lock (signal_inbox.py)
    stop.install(stop=(signal.SIGTERM, signal.SIGINT))
    try:
        run_fleet(plan, args.targets, stop, announce=lambda line: print(line, flush=True))
    except FleetError as exc:
        print(f"gpuwatch simulate-fleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FleetStartError as exc:
        print(f"gpuwatch simulate-fleet: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK
