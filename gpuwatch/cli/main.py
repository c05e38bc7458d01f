"""The `gpuwatch` command line (README, "Commands"): parses flags, calls into the rest, prints.

Exit statuses: gpuwatch/core/exitcodes.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import (
    BACKENDS,
    DEFAULT_CONFIG_PATH,
    DEFAULT_PORT,
    LOG_LEVELS,
    VENDORS,
    Config,
    ConfigError,
    parse_listen,
)
from gpuwatch.core.exitcodes import (
    EXIT_BROKEN_PIPE,
    EXIT_CONFIG,
    EXIT_NOT_OK,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    MEANINGS,
    NPD_MAX_OUTPUT_LENGTH,
    NPD_NON_OK,
    NPD_OK,
    NPD_UNKNOWN,
)
from gpuwatch.registry import COLLECTORS

log = logging.getLogger("gpuwatch")


# A few words per scenario for --help, one line each (the full descriptions: docs/simulation.md).
SCENARIO_SUMMARIES = {
    "healthy": "every GPU idle and healthy",
    "mixed": "the demo: GPU 2 overheats, GPU 5 power-capped at 500 W, GPU 6 probes 20 % slow",
    "busy": "every GPU at full load at its power cap: healthy",
    "overheating": "GPU 2 climbs past its slowdown threshold in ~8 s",
    "memory_overheating": "GPU 2's HBM at its 95 °C limit",
    "thermal_throttling": "GPU 2 thermally throttled 70 % of the time",
    "power_brake": "GPU 2 held down by the hardware power brake",
    "power_limit_low": "GPU 2's power limit at 450 W of 700 W, under load",
    "psu_undervoltage": "a supply's 12 V rail sags to 11.2 V; every GPU power-braked",
    "underperforming": "GPU 2 probes 20 % slow (the probe runs every 10 s)",
    "corrupt": "GPU 2's matmul results are wrong in a few elements (the probe runs every 10 s)",
    "fabric_degraded": "an HGX node: GPU 2's NVLink fabric reports degraded bandwidth, limited capacity",
    "ib_port_down": "an HGX node: the InfiniBand NIC beside GPU 2 loses its link at 1 s",
    "ib_flapping": "an HGX node: the InfiniBand NIC beside GPU 2 drops its link every 20 s",
    "pcie_degraded": "GPU 2's link at gen 3 x8 of gen 5 x16, under load",
    "xid": "GPU 2 raises XID 13, then XID 79 (fallen off the bus)",
    "ecc_uncorrectable": "GPU 2 counts uncorrectable ECC errors",
    "row_remap_failure": "GPU 2: a row remap failed, one pending",
    "gpu_lost": "GPU 2 stops answering at 6 s",
    "nvml_hang": "from 5 s, GPU 2's temperature call never returns: the poll hangs",
    "backend_down": "the vendor library is missing (no driver)",
    "training": "every GPU trains: tensor pipes active ~0.8",
    "dataloader_starved": "GPU 2 at 100 % utilization with SM active ~0.13 (starved of input)",
    "idle_allocated": "GPU 2: a process holds 72 GiB, nothing runs",
    "mig": "GPU 2 in MIG mode: a 3g.40gb (a job in it) and two 2g.20gb instances",
}
PROBE_SCENARIO_INTERVAL_SECONDS = 10.0  # scenarios that show their fault in the probe probe this often under `run`


def _scenario_help() -> str:
    from gpuwatch.core.scenario_catalogue import SCENARIOS

    width = max(map(len, SCENARIOS))
    return "\n".join(
        f"  {name:<{width}}  {SCENARIO_SUMMARIES.get(name, info.description)}" for name, info in SCENARIOS.items()
    )


def _add_agent_flags(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    parser.add_argument("--config", type=Path, help=f"TOML config file (default {DEFAULT_CONFIG_PATH} when it exists)")
    listen = "127.0.0.1:9845, this machine only; with --alerting a free port" if demo else ":9845"
    state = "~/.cache/gpuwatch/demo-<vendor>" if demo else "$STATE_DIRECTORY, else /var/lib/gpuwatch"
    parser.add_argument("--listen", help=f"HOST:PORT to serve on (default {listen})")
    parser.add_argument("--web-config", metavar="PATH", help="TLS / basic auth file (exporter-toolkit web-config.yml)")
    parser.add_argument("--state-dir", type=Path, help=f"where known GPUs and probe baselines live (default {state})")
    parser.add_argument("--log-level", choices=LOG_LEVELS)
    parser.add_argument("--poll-interval", type=float, metavar="SECONDS", help="fast poll interval (default 1)")
    parser.add_argument(
        "--probe-interval",
        type=float,
        metavar="SECONDS",
        help="matmul probe interval (default 900; 10 in demo); 0 turns the probe off",
    )
    if not demo:
        parser.add_argument("--backend", choices=BACKENDS, help="vendor library to use (default auto)")
        parser.add_argument(
            "--disable-collector",
            action="append",
            choices=COLLECTORS,
            default=None,
            metavar="NAME",
            help=f"turn a collector off (repeatable): {', '.join(COLLECTORS)}",
        )
    _add_simulation_flags(parser)


def _add_simulation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        metavar="NAME",
        help="simulated scenario (with --backend simulated); listed by `gpuwatch demo --help`",
    )
    parser.add_argument("--vendor", choices=VENDORS, help="simulated GPU vendor (default nvidia)")
    parser.add_argument("--gpus", type=int, metavar="N", help="simulated GPUs (default 8)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="GPU fleet health agent for Prometheus.",
        epilog="exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in MEANINGS.items()),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="the agent: poll GPUs and serve /metrics")
    _add_agent_flags(run)
    demo = sub.add_parser(
        "demo",
        help="the agent on a simulated 8-GPU node (default scenario mixed)",
        description="The agent on a simulated 8-GPU node.\n\nscenarios (--scenario NAME):\n" + _scenario_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_agent_flags(demo, demo=True)
    demo.add_argument(
        "--alerting",
        action="store_true",
        help="also run Prometheus and Alertmanager from PATH with the shipped rules and routing, on free loopback "
        "ports, and print each alert as it fires (Debian: apt-get install prometheus prometheus-alertmanager)",
    )
    snap = sub.add_parser("snapshot", help="one reading of every GPU, printed, then exit")
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--config", type=Path)
    snap.add_argument("--backend", choices=BACKENDS)
    _add_simulation_flags(snap)
    check = sub.add_parser("check", help="validate the configuration and the environment")
    check.add_argument("--config", type=Path)
    check.add_argument("--backend", choices=BACKENDS)
    check.add_argument("--listen")
    check.add_argument("--web-config", metavar="PATH", help="TLS / basic auth file to validate")
    check.add_argument("--state-dir", type=Path)
    sub.add_parser("version", help="versions of gpuwatch and the vendor libraries found")
    health = sub.add_parser(
        "health",
        help="ask the local agent for its GPUs' verdicts; the exit status says healthy or not",
        description="Ask the agent for each GPU's verdict (/health/gpus as JSON: state, action, evidence) and exit "
        f"{EXIT_OK} when the node is healthy, {EXIT_NOT_OK} when a GPU (or the node) needs action, {EXIT_USAGE} on bad "
        f"usage, {EXIT_UNAVAILABLE} when it cannot tell (the agent unreachable, asking for credentials, or a bad "
        "answer). For scripts, NHC and Slurm's HealthCheckProgram.",
    )
    health.add_argument(
        "--url", metavar="URL", help="the agent's base URL, http(s)://HOST:PORT (default: the configured --listen)"
    )
    answer = health.add_mutually_exclusive_group()
    answer.add_argument("--json", action="store_true", help="print the agent's JSON document instead of a summary")
    answer.add_argument(
        "--npd",
        action="store_true",
        help=f"answer as a node-problem-detector custom plugin: exit {NPD_OK} OK (healthy), {NPD_NON_OK} NonOK (a GPU "
        f"needs action), {NPD_UNKNOWN} Unknown (cannot tell, or bad usage), and one line of at most "
        f"{NPD_MAX_OUTPUT_LENGTH} bytes (NPD's default max_output_length) naming the GPU, its action and its first "
        "evidence: the node condition's message (docs/kubernetes.md)",
    )
    health.add_argument("--config", type=Path)
    repair = sub.add_parser(
        "repair",
        help="record that a GPU's held faults are mended, so its verdict clears",
        description="Close every fault the ledger holds for a GPU (docs/verdicts.md), keeping who and why. A running "
        "agent reads it at its next poll. A fault that shows again opens again and counts as returned; one that "
        f"returns escalates. Exit {EXIT_OK} when done (or nothing was held), {EXIT_USAGE} on bad usage or an unknown "
        f"GPU, {EXIT_UNAVAILABLE} when the state dir cannot be written.",
    )
    repair.add_argument("--gpu", required=True, metavar="INDEX|UUID", help="the GPU, by index or UUID")
    repair.add_argument("--note", required=True, metavar="TEXT", help="what was done (kept in the ledger)")
    repair.add_argument("--state-dir", type=Path, help="the agent's state dir (default: the configured one)")
    repair.add_argument("--config", type=Path)
    _add_report_parser(sub)
    _add_probe_parser(sub)
    _add_diag_parser(sub)
    _add_fleet_parser(sub)
    _add_slurm_parser(sub)
    return parser


def _add_report_parser(sub: Any) -> None:
    report = sub.add_parser(
        "report",
        help="write a GPU's case file for the vendor (RMA): <uuid>.html and its JSON twin <uuid>.json",
        description="Write one GPU's case file, what a vendor's RMA desk asks for (docs/case-file.md): identity "
        "(serial, board part number, VBIOS, InfoROM, driver), the fault ledger across reboots, XIDs in NVIDIA's "
        "catalogue's words, row remaps and ECC, the probe against its baseline and (with --prometheus) its fleet "
        "peers, temperature, power and clocks around each fault (with --prometheus), and the last diag run. Reads "
        "the state dir only; the agent need not run. Exit "
        f"{EXIT_OK} when written, {EXIT_USAGE} for an unknown GPU or a bad URL, {EXIT_UNAVAILABLE} when --out cannot "
        "be written, the vendor library cannot be used, or Prometheus did not answer (the files are written then).",
    )
    report.add_argument("--gpu", required=True, metavar="INDEX|UUID", help="the GPU, by index or UUID")
    report.add_argument("--prometheus", metavar="URL", help="Prometheus' base URL, for history: http(s)://HOST:PORT")
    report.add_argument("--out", type=Path, default=Path("."), metavar="DIR", help="where to write (default: .)")
    report.add_argument("--state-dir", type=Path, help="the agent's state dir (default: the configured one)")
    report.add_argument("--config", type=Path)
    report.add_argument("--backend", choices=BACKENDS)
    _add_simulation_flags(report)


def _add_slurm_parser(sub: Any) -> None:
    slurm = sub.add_parser(
        "slurm",
        help="act on the agent's verdicts in Slurm: drain, resume; probe between jobs (docs/slurm.md)",
        description="Slurm's side of the verdicts (docs/slurm.md): health-check for HealthCheckProgram or a prolog, "
        "epilog for Epilog=.",
    )
    modes = slurm.add_subparsers(dest="slurm_command", required=True, metavar="MODE")
    check = modes.add_parser(
        "health-check",
        help="drain the node for a GPU that needs action, resume it when gpuwatch drained it and all is clean",
        description="Ask the local agent for its verdicts and drain the node (reason 'gpuwatch: GPU <i> (<uuid>) "
        "<action>') when a GPU needs more than restart_app; resume only a node gpuwatch drained, once every verdict "
        "is clean; never touch a node drained or down by anyone else. Exit "
        f"{EXIT_OK} when it did its job, {EXIT_UNAVAILABLE} when it could not reach the agent or Slurm, {EXIT_USAGE} "
        "on bad usage.",
    )
    epilog = modes.add_parser(
        "epilog",
        help="probe the GPUs the finished job released (SLURM_JOB_GPUS), then the health check",
        description="For Epilog=: probe the GPUs the job released ($SLURM_JOB_GPUS) as the agent probes, hand the "
        "results to the running agent, then run the health check, all within --budget. Exits "
        f"{EXIT_OK} unless its command line is wrong ({EXIT_USAGE}): a failing epilog drains the node in Slurm.",
    )
    for mode, default in ((check, 10.0), (epilog, 10.0)):
        mode.add_argument(
            "--url", metavar="URL", help="the agent's base URL, http(s)://HOST:PORT (default: the configured --listen)"
        )
        mode.add_argument(
            "--node", metavar="NAME", help="the Slurm node (default $SLURMD_NODENAME, else this host's short name)"
        )
        mode.add_argument(
            "--budget",
            type=float,
            default=default,
            metavar="SECONDS",
            help=f"the most it may take, everything included (default {default:g})",
        )
        mode.add_argument("--config", type=Path)
    epilog.add_argument("--backend", choices=BACKENDS)
    epilog.add_argument("--state-dir", type=Path, help="the agent's state dir (baselines, locks, hand-over)")
    _add_simulation_flags(epilog)
    check.add_argument(
        "--diag-before-resume",
        action="store_true",
        help="before resuming a node gpuwatch drained, run gpuwatch diag --level 1 on it and resume only when no test "
        "failed; it needs 45 s of --budget (and of the HealthCheckProgram/prolog time limit) more (docs/diag.md)",
    )
    check.add_argument("--backend", choices=BACKENDS)
    check.add_argument("--state-dir", type=Path, help="the agent's state dir (diag results, probe locks)")
    _add_simulation_flags(check)


def _add_fleet_parser(sub: Any) -> None:
    fleet = sub.add_parser(
        "simulate-fleet",
        help="serve N simulated agents on loopback and write a Prometheus file_sd targets file",
        description="Serve N simulated agents on 127.0.0.1:P..P+N-1 and write a file_sd targets file (a `node` label "
        "per target). --fault NODE=SCENARIO runs a scenario on a whole node; --fault NODE/GPU=SCENARIO gives one GPU "
        "of a healthy node that scenario's fault. NODE is 0-based (or node-003).\n\nscenarios:\n" + _scenario_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fleet.add_argument("--nodes", type=int, required=True, metavar="N")
    fleet.add_argument("--gpus", type=int, required=True, metavar="G", help="GPUs per node")
    fleet.add_argument("--port-base", type=int, required=True, metavar="P", help="node i listens on P+i")
    fleet.add_argument("--targets", type=Path, required=True, metavar="FILE", help="file_sd targets file to write")
    fleet.add_argument("--vendor", choices=VENDORS, default="nvidia")
    fleet.add_argument("--fault", action="append", default=[], metavar="NODE[/GPU]=SCENARIO", help="repeatable")
    fleet.add_argument("--poll-interval", type=float, metavar="SECONDS", help="per node (default 5 in a fleet)")
    fleet.add_argument("--state-dir", type=Path, help="per-node state dirs go under it (default: a temp dir)")
    fleet.add_argument("--config", type=Path, help="a config file every node reads (e.g. [probe] settings)")
    fleet.add_argument(
        "--node-config", action="append", default=[], metavar="NODE=FILE", help="that node reads FILE instead"
    )
    fleet.add_argument("--log-level", choices=LOG_LEVELS, default="warning")
    fleet.add_argument("--nodes-per-process", type=int, default=50, metavar="N", help="nodes per process (default 50)")


def _add_probe_parser(sub: Any) -> None:
    probe = sub.add_parser(
        "probe",
        help="run the matmul probe now and print the result beside the baseline",
        description="Run the matmul probe now on the given GPUs (default: every idle one) and print each result "
        "beside the GPU's baseline. Waits for, never overlaps, a probe the agent is running. Baselines change only "
        f"with --update-baseline or --reset-baseline. Exit {EXIT_OK} when every GPU probed ok, {EXIT_NOT_OK} "
        f"otherwise, {EXIT_UNAVAILABLE} when the GPU backend or the state dir's lock files are unavailable.",
    )
    probe.add_argument("--gpu", type=int, action="append", default=[], metavar="N", help="GPU index (repeatable)")
    probe.add_argument("--json", action="store_true", help="print JSON instead of a table")
    probe.add_argument("--update-baseline", action="store_true", help="let this result count toward the baseline")
    probe.add_argument("--reset-baseline", action="store_true", help="forget the baseline; start over with this run")
    probe.add_argument("--config", type=Path)
    probe.add_argument("--backend", choices=BACKENDS)
    probe.add_argument("--state-dir", type=Path, help="the agent's state dir (baselines, locks)")
    _add_simulation_flags(probe)


def _add_diag_parser(sub: Any) -> None:
    diag = sub.add_parser(
        "diag",
        help="deep tests on idle GPUs: memory patterns, PCIe bandwidth, a sustained matmul (docs/diag.md)",
        description="Run deep tests on idle GPUs (default: all of the node's), each GPU's in a child process pinned "
        "to it, under deadlines: an HBM pattern test, host<->device bandwidth against the link's nominal, a sustained "
        "matmul at the power cap with the vendor library's clocks, power and temperature; an all-reduce and dcgmi "
        "diag where they can run. Level 1 takes at most 30 s per GPU, level 3 minutes. Refuses a busy GPU unless "
        "--force; never overlaps the agent's probe. The results go to the state dir, where the agent exports them. "
        f"Exit {EXIT_OK} when no test failed, {EXIT_NOT_OK} when one did, {EXIT_USAGE} on bad usage (a GPU the node "
        f"does not have), {EXIT_UNAVAILABLE} when it cannot run (no GPU, a busy GPU without --force, no test could "
        "run).",
    )
    diag.add_argument("--level", type=int, choices=(1, 2, 3), default=1, help="1: ≤30 s per GPU; 3: minutes")
    diag.add_argument("--gpu", type=int, action="append", default=[], metavar="N", help="GPU index (repeatable)")
    diag.add_argument("--json", action="store_true", help="print JSON instead of a table")
    diag.add_argument("--force", action="store_true", help="test a busy GPU too (it disturbs its work)")
    diag.add_argument("--config", type=Path)
    diag.add_argument("--backend", choices=BACKENDS)
    diag.add_argument("--state-dir", type=Path, help="the agent's state dir (results, probe locks)")
    _add_simulation_flags(diag)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Flags win over the file."""
    agent: dict[str, Any] = {}
    simulated: dict[str, Any] = {}
    for flag, key in (
        ("listen", "listen"),
        ("web_config", "web_config"),
        ("backend", "backend"),
        ("log_level", "log_level"),
        ("poll_interval", "poll_interval_seconds"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            agent[key] = value
    if getattr(args, "state_dir", None) is not None:
        agent["state_dir"] = str(args.state_dir)
    if getattr(args, "disable_collector", None):
        agent["disable_collectors"] = list(args.disable_collector)
    for flag in ("scenario", "vendor", "gpus"):
        value = getattr(args, flag, None)
        if value is not None:
            simulated[flag] = value
    out: dict[str, dict[str, Any]] = {}
    if getattr(args, "probe_interval", None) is not None:
        out["probe"] = {"interval_seconds": args.probe_interval}
    if agent:
        out["agent"] = agent
    if simulated:
        out["simulated"] = simulated
    return out


def _config_path(args: argparse.Namespace) -> Path | None:
    if args.config is not None:
        return Path(args.config)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # APScheduler logs every job run at INFO and warns on every skipped run while a poll hangs; the agent reports
    # that itself, once.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        words = list(sys.argv[1:] if argv is None else argv)
        if exc.code == EXIT_USAGE and "health" in words and "--npd" in words:
            # argparse's exit 2 is NPD's Unknown already; the condition's message says why (argparse's words: stderr).
            print("cannot tell: bad usage of gpuwatch health --npd (NPD's log has the error)")
        raise
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # short output still sits in the buffer: a closed pipe must show here, not at exit
        return code
    except ConfigError as exc:
        print(f"gpuwatch: invalid configuration: {exc}", file=sys.stderr)
        if getattr(args, "npd", False):
            from gpuwatch.cli.health_command import fit

            print(fit(f"cannot tell: invalid configuration: {exc}"))
            return NPD_UNKNOWN
        return EXIT_CONFIG
    except BrokenPipeError:  # `gpuwatch snapshot | head`: the reader left; stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace) -> int:
    # Each command imports what it uses: `run` never loads the one-shot commands' host report and verdicts (RSS).
    if args.command == "version":
        from gpuwatch.cli import commands

        return commands.version()
    if args.command == "simulate-fleet":
        from gpuwatch.cli.fleet import simulate_fleet

        return simulate_fleet(args)
    if args.command == "demo":
        overrides = _overrides(args)
        overrides.setdefault("agent", {})["backend"] = "simulated"
        overrides.setdefault("probe", {}).setdefault("interval_seconds", 10.0)  # probe scenarios show within a minute
        if args.alerting:
            return _demo_alerting(args, overrides)
        overrides["agent"].setdefault("listen", f"127.0.0.1:{DEFAULT_PORT}")  # a demo is for this machine only
        if "state_dir" not in overrides["agent"] and not _use_demo_state_dir(args, overrides, "demo"):
            return EXIT_UNAVAILABLE
        path = _config_path(args) if args.config else None
        config = load_config(path, overrides)
        return _run_agent(config, path, overrides, announce=True)
    path = _config_path(args)
    overrides = _overrides(args)
    config = load_config(path, overrides)
    if args.command == "run":
        if "probe" not in overrides and _scenario_needs_probe(config):
            overrides["probe"] = {"interval_seconds": PROBE_SCENARIO_INTERVAL_SECONDS}
            config = load_config(path, overrides)
            print(
                f"gpuwatch: scenario {config.simulated.scenario!r} shows its fault in the probe: probing every "
                f"{PROBE_SCENARIO_INTERVAL_SECONDS:g} s (--probe-interval to change); the first results come after "
                "one interval, a GPU's own baseline after 5 probes, and the status page compares it with its peers "
                "before that",
                file=sys.stderr,
            )
        return _run_agent(config, path, overrides, announce=False)
    if args.command in ("snapshot", "check"):
        from gpuwatch.cli import commands

        return commands.snapshot(config, as_json=args.json) if args.command == "snapshot" else commands.check(config)
    if args.command == "health":
        from gpuwatch.cli.health_command import health, npd_health

        return npd_health(config, args.url) if args.npd else health(config, args.url, args.json)
    if args.command == "repair":
        from gpuwatch.cli.repair_command import repair_gpu

        return repair_gpu(config, args.gpu, args.note)
    if args.command == "report":
        from gpuwatch.cli.report_command import report

        return report(config, args.gpu, args.out, args.prometheus)
    if args.command == "slurm":
        from gpuwatch.cli import slurm_command

        if args.slurm_command == "epilog":
            return slurm_command.epilog(config, args.url, args.node, args.budget)
        return slurm_command.health_check(
            config, args.url, args.node, args.budget, diag_before_resume=args.diag_before_resume
        )
    if args.command == "diag":
        from gpuwatch.cli.diag_command import diag

        if config.agent.backend == "simulated" and not config.agent.state_dir and "STATE_DIRECTORY" not in os.environ:
            if not _use_demo_state_dir(args, overrides, "diag"):  # the demo's state dir, never /var/lib/gpuwatch
                return EXIT_UNAVAILABLE
            config = load_config(path, overrides)
        return diag(config, level=args.level, gpus=args.gpu, as_json=args.json, force=args.force)
    if args.command == "probe":
        from gpuwatch.cli.probe_command import probe

        if config.agent.backend == "simulated" and not config.agent.state_dir and "STATE_DIRECTORY" not in os.environ:
            # the simulated node's probe: the demo's baselines, in the user's cache, never /var/lib/gpuwatch as root
            if not _use_demo_state_dir(args, overrides, "probe"):
                return EXIT_UNAVAILABLE
            config = load_config(path, overrides)

        if args.update_baseline and args.reset_baseline:
            print("gpuwatch probe: --update-baseline and --reset-baseline exclude each other", file=sys.stderr)
            return EXIT_USAGE
        return probe(
            config,
            gpus=args.gpu,
            as_json=args.json,
            update_baseline=args.update_baseline,
            reset_baseline=args.reset_baseline,
        )
    raise AssertionError(args.command)


def _use_demo_state_dir(args: argparse.Namespace, overrides: dict[str, dict[str, Any]], command: str) -> bool:
    """Point `overrides` at the simulated node's state dir, made private if new; False (said why) if it cannot be."""
    from gpuwatch.files.statedir import StateDirUnsafe, demo_state_dir, make_private_dir

    try:  # per vendor: the known GPUs of one simulated node are not another's lost ones
        demo_dir = demo_state_dir(config_vendor(args))
        make_private_dir(demo_dir)  # 0700 in the user's own cache, never a guessable name in /tmp
    except (StateDirUnsafe, OSError) as exc:
        print(f"gpuwatch {command}: cannot make its state dir: {exc}; pass --state-dir", file=sys.stderr)
        return False
    overrides.setdefault("agent", {})["state_dir"] = str(demo_dir)
    return True


def _demo_alerting(args: argparse.Namespace, overrides: dict[str, dict[str, Any]]) -> int:
    from gpuwatch.cli.demo_alerting import demo_alerting

    if args.web_config is not None:  # Prometheus would need the CA and the credentials too: not a demo's job
        print("gpuwatch demo: --alerting serves plain HTTP on loopback; leave out --web-config", file=sys.stderr)
        return EXIT_USAGE
    overrides["agent"].setdefault("listen", "127.0.0.1:0")  # a free port; Prometheus is told which
    code = demo_alerting(_config_path(args) if args.config else None, overrides, _setup_logging)
    _exit_even_if_a_vendor_call_hangs(code)
    return code


def _scenario_needs_probe(config: Config) -> bool:
    """A simulated scenario whose fault only the probe shows, with the probe at its production default (900 s: five
    probes for a baseline would take over an hour): it probes every PROBE_SCENARIO_INTERVAL_SECONDS instead."""
    from gpuwatch.config.settings import ProbeSection
    from gpuwatch.core.scenario_catalogue import SCENARIOS

    info = SCENARIOS.get(config.simulated.scenario)
    return (
        config.agent.backend == "simulated"
        and info is not None
        and bool(info.probe_slowdown or info.probe_corrupt)
        and config.probe.interval_seconds == ProbeSection().interval_seconds
    )


def config_vendor(args: argparse.Namespace) -> str:
    return str(getattr(args, "vendor", None) or "nvidia")


def _run_agent(config: Config, path: Path | None, overrides: dict[str, dict[str, Any]], *, announce: bool) -> int:
    from gpuwatch.service.agent import Agent
    from gpuwatch.service.nodes import build_sources
    from gpuwatch.service.startup import StartupError, load_for_reload
    from gpuwatch.web.server import ListenError

    _setup_logging(config.agent.log_level)
    agent = Agent(config, build_sources(config), reload_config=load_for_reload(path, overrides))
    agent.handle_signals()
    try:
        agent.start()
    except (StartupError, ListenError) as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        agent.stop()
        return EXIT_UNAVAILABLE
    quiet = threading.Event()  # ends the demo's findings log; set after the agent stops, never by a signal handler
    if announce:
        scenario = config.simulated.scenario
        print(f"gpuwatch demo: simulated {config.simulated.gpus}-GPU node, scenario {scenario!r}", flush=True)
        host = parse_listen(config.agent.listen)[0]
        shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
        print(f"  metrics:     http://{shown}:{agent.port}/metrics", flush=True)
        print(f"  status page: http://{shown}:{agent.port}/", flush=True)
        print("  stop with Ctrl-C", flush=True)
        from gpuwatch.cli.demo_findings import announce_findings

        announce_findings(agent.store, lambda line: print(line, flush=True), quiet)
    agent.run_until_signalled()
    quiet.set()
    agent.stop()
    _exit_even_if_a_vendor_call_hangs()
    return EXIT_OK


def _exit_even_if_a_vendor_call_hangs(code: int = EXIT_OK) -> None:
    """A poll thread stuck in a driver call would block interpreter exit forever; leave without joining it. Daemon
    threads count too: APScheduler's pool workers are daemons (its scheduler thread is), yet concurrent.futures joins
    every worker at interpreter exit (threading._register_atexit), so a worker hung in NVML held the exit forever."""
    if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
