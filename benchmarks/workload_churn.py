#!/usr/bin/env python3
"""RSS under workload churn: the agent on a simulated node whose GPU processes come and go, as on a busy Slurm or
Kubernetes node (issue 31, item 7: RSS rose from 38 to 60 MiB over 10 minutes before it levelled off).

Run by hand. The agent runs in a child process (this script with --child): the real Agent, its HTTP server and poll
thread, over the simulated node, except that every `--churn-seconds` each GPU's compute processes are replaced by 1 to
`--max-processes` new ones: new PIDs (wrapping at pid_max, so PIDs are reused), each in a new workload (a Slurm job, a
pod, a container, a systemd unit or a bare process, in turn) of one of `--users` users, with /proc entries written as
the kernel prints them in a procfs root the workloads collector reads. The parent scrapes /metrics once a second, as
Prometheus does, and every `--sample-every` seconds prints the child's RSS (VmRSS) beside the sizes of what the churn
could grow: the fast renderer's prefix caches for the two workload families, the user-name cache and the workloads
the store holds (the child writes them to a file; they are read, never changed).

    .venv/bin/python benchmarks/workload_churn.py                          # 10 min, 8 GPUs, new workloads every poll
    .venv/bin/python benchmarks/workload_churn.py --duration 120 --sample-every 10
    .venv/bin/python benchmarks/workload_churn.py --json > churn.json
    .venv/bin/python benchmarks/workload_churn.py --tracemalloc       # and where the Python heap grew

Exit status: 0 measured, 1 the agent failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PID_MAX = 4_194_304  # the kernel's default pid_max on 64-bit: PIDs wrap and are reused past it
FIRST_PID = 300_000
KINDS = ("slurm_job", "k8s_pod", "container", "systemd_unit", "process")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


# --- the child: the agent over a churning simulated node ------------------------------------------------------------


def cgroup_of(serial: int) -> tuple[str, str]:
    """(cgroup file, comm) of the `serial`th workload: the kinds in turn, each id new."""
    digest = hashlib.sha256(str(serial).encode()).hexdigest()
    kind = KINDS[serial % len(KINDS)]
    if kind == "slurm_job":
        return f"0::/system.slice/slurmstepd.scope/job_{100_000 + serial}/step_0/user/task_0\n", "python3"
    if kind == "k8s_pod":
        uid = f"{digest[:8]}_{digest[8:12]}_{digest[12:16]}_{digest[16:20]}_{digest[20:32]}"
        pod = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
        return f"0::/{pod}/cri-containerd-{digest}.scope\n", "pt_main_thread"
    if kind == "container":
        return f"0::/system.slice/docker-{digest}.scope\n", "tritonserver"
    if kind == "systemd_unit":
        return f"0::/system.slice/inference-{serial}.service\n", "vllm"
    return f"0::/user.slice/user-2002.slice/session-{serial}.scope\n", f"run-{serial % 100_000}"


class ChurningProcfs:
    """/proc entries for each GPU's processes of the current generation; the last generation's are removed."""

    def __init__(self, root: Path, started_ticks: int, users: int) -> None:
        self.root, self._started, self._users = root, started_ticks, users
        self._entries: dict[int, list[int]] = {}  # GPU index -> its processes' PIDs now
        self.workloads_made = 0

    def replace(self, index: int, pids: list[int]) -> None:
        from gpuwatch.simulated.procfs import stat_line

        for pid in self._entries.get(index, ()):
            entry = self.root / str(pid)
            for name in ("stat", "cgroup", "comm", "status"):
                with contextlib.suppress(FileNotFoundError):
                    (entry / name).unlink()
            with contextlib.suppress(OSError):
                entry.rmdir()
        for pid in pids:
            serial = self.workloads_made
            self.workloads_made += 1
            cgroup, comm = cgroup_of(serial)
            uid = 10_000 + serial % self._users
            entry = self.root / str(pid)
            entry.mkdir(exist_ok=True)
            (entry / "stat").write_text(stat_line(pid, comm, self._started))
            (entry / "cgroup").write_text(cgroup)
            (entry / "comm").write_text(comm + "\n")
            (entry / "status").write_text(
                f"Name:\t{comm}\nState:\tR (running)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
                f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\n"
            )
        self._entries[index] = pids


def churning_node(args: argparse.Namespace, procfs: ChurningProcfs) -> Any:
    """A simulated node whose busy GPUs show new processes each generation (every --churn-seconds)."""
    from gpuwatch.simulated.scenarios import SimProcess, SimulatedNode

    class ChurningNode(SimulatedNode):
        def __init__(self) -> None:
            super().__init__(scenario="training", gpus=args.gpus)
            self._generation: dict[int, int] = {}
            self._processes: dict[int, tuple[SimProcess, ...]] = {}
            self._next_pid = FIRST_PID

        def _compute(self, index: int, t: float) -> Any:  # called under the node's lock
            state = super()._compute(index, t)
            generation = int(t / args.churn_seconds)
            if self._generation.get(index) != generation:
                self._generation[index] = generation
                count = 1 + (generation * 7 + index) % args.max_processes
                pids = []
                for _ in range(count):
                    pids.append(self._next_pid)
                    self._next_pid = FIRST_PID + (self._next_pid + 1 - FIRST_PID) % (PID_MAX - FIRST_PID)
                procfs.replace(index, pids)
                memory = 2**30 + (generation % 97) * 2**24
                self._processes[index] = tuple(SimProcess(pid, memory + n * 2**20) for n, pid in enumerate(pids))
            return dataclasses.replace(state, processes=self._processes[index])

    return ChurningNode()


def sizes(agent: Any, procfs: ChurningProcfs) -> dict[str, Any]:
    """What the churn could grow, read from the running agent (a snapshot; the poll thread may be mid-run)."""
    from gpuwatch.collectors.workloads import WorkloadsCollector
    from gpuwatch.exposition import fast

    workloads = agent.collectors.of_type(WorkloadsCollector)
    part = agent.store.snapshot().parts.get("workloads") or {}
    return {
        "workloads_made": procfs.workloads_made,
        "prefixes_workload_info": len(fast._PREFIXES.get("gpuwatch_gpu_workload_info", {})),
        "prefixes_workload_memory": len(fast._PREFIXES.get("gpuwatch_gpu_workload_memory_bytes", {})),
        "prefixes_all": sum(len(v) for v in fast._PREFIXES.values()),
        "prefix_limit": fast._PREFIX_LIMIT,
        "user_names": len(workloads._users._names) if workloads is not None else None,
        "stored_workloads": sum(len(v) for v in part.values()),
    }


def trace(args: argparse.Namespace, stop: threading.Event) -> None:
    """--tracemalloc: every --sample-every seconds, where the Python heap grew since the first minute of churn (the
    ten largest sites), into <sizes file>.trace. Tracing costs memory and CPU: its RSS rows are not the agent's."""
    import tracemalloc

    tracemalloc.start(1)
    if stop.wait(60.0):
        return
    base = tracemalloc.take_snapshot()
    while not stop.wait(args.sample_every):
        grown = tracemalloc.take_snapshot().compare_to(base, "lineno")[:10]
        Path(args.sizes_file + ".trace").write_text("\n".join(str(stat) for stat in grown) + "\n")


def child(args: argparse.Namespace) -> int:
    from gpuwatch.collectors.configuration import load_config
    from gpuwatch.readers.procfs import Procfs
    from gpuwatch.service.agent import Agent
    from gpuwatch.simulated.node import simulated_sources
    from gpuwatch.simulated.procfs import CLOCK_TICKS, SimulatedProcfs

    state = tempfile.TemporaryDirectory(prefix="gpuwatch-churn-state-")
    overrides: dict[str, dict[str, Any]] = {
        "agent": {
            "backend": "simulated",
            "listen": f"127.0.0.1:{args.port}",
            "state_dir": state.name,
            "poll_interval_seconds": args.poll_interval,
            "disable_collectors": ["probe"],  # its workers are GPU processes of their own: only the churn's here
        },
    }
    config = load_config(None, overrides)
    # The node's processes need a procfs root, and the root (its boot time) the node: the root is set before a poll.
    procfs = ChurningProcfs(Path(), (3600 - 60) * CLOCK_TICKS, args.users)  # started a minute before the agent
    node = churning_node(args, procfs)
    skeleton = SimulatedProcfs(node)  # self/ and stat (the boot time), as the simulated node's own procfs has
    procfs.root = skeleton.root
    sources = simulated_sources(config, node)
    sources = dataclasses.replace(sources, procfs=Procfs(skeleton.root, host_pids=True, keep=skeleton))
    agent = Agent(config, sources)
    agent.handle_signals()
    agent.start()
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(1.0):
            tmp = Path(args.sizes_file + ".tmp")
            tmp.write_text(json.dumps(sizes(agent, procfs)))
            os.replace(tmp, args.sizes_file)

    threading.Thread(target=report, name="sizes", daemon=True).start()
    if args.tracemalloc:
        threading.Thread(target=trace, args=(args, stop), name="trace", daemon=True).start()
    try:
        agent.run_until_signalled()
    finally:
        stop.set()
        agent.stop()
        state.cleanup()
    return 0


# --- the parent: scrape, measure, print ------------------------------------------------------------------------------


def scrape(port: int) -> int:
    """One scrape as Prometheus makes it; the workload series in it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return sum(line.startswith("gpuwatch_gpu_workload_info{") for line in body.splitlines())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parent(args: argparse.Namespace) -> int:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-churn-") as tmp:
        sizes_file = str(Path(tmp) / "sizes.json")
        argv = [sys.executable, __file__, "--child", "--port", str(port), "--sizes-file", sizes_file]
        argv += ["--gpus", str(args.gpus), "--poll-interval", str(args.poll_interval)]
        argv += ["--churn-seconds", str(args.churn_seconds), "--max-processes", str(args.max_processes)]
        argv += ["--users", str(args.users)] + (["--tracemalloc"] if args.tracemalloc else [])
        log = open(Path(tmp) / "agent.log", "w+b")  # noqa: SIM115 (read back on failure)
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        rows: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + 60
            while True:
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited with {agent.returncode}")
                try:
                    scrape(port)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the agent did not answer /metrics within 60 s") from None
                    time.sleep(0.3)
            began = time.monotonic()
            next_sample = began
            if not args.json:
                print(
                    f"{args.gpus} GPUs, new processes every {args.churn_seconds:g} s (1-{args.max_processes} per GPU),"
                )
                print(f"{args.users} users, a poll every {args.poll_interval:g} s, a scrape every second\n")
                print(
                    f"{'t (s)':>6} {'RSS MiB':>8} {'workloads':>10} {'series':>7} {'info pfx':>9} {'mem pfx':>8} "
                    f"{'all pfx':>8} {'users':>6} {'stored':>7}"
                )
            while True:
                now = time.monotonic()
                if now >= next_sample:
                    series = scrape(port)
                    seen = json.loads(Path(sizes_file).read_text()) if Path(sizes_file).exists() else {}
                    row = {"t": round(now - began), "rss_mib": round(rss_mib(agent.pid), 1), "series": series, **seen}
                    rows.append(row)
                    if not args.json:
                        print(
                            f"{row['t']:>6} {row['rss_mib']:>8.1f} {seen.get('workloads_made', 0):>10} {series:>7} "
                            f"{seen.get('prefixes_workload_info', 0):>9} {seen.get('prefixes_workload_memory', 0):>8} "
                            f"{seen.get('prefixes_all', 0):>8} {seen.get('user_names', 0):>6} "
                            f"{seen.get('stored_workloads', 0):>7}",
                            flush=True,
                        )
                    next_sample += args.sample_every
                    if now - began >= args.duration:
                        break
                else:
                    scrape(port)
                time.sleep(max(0.0, min(1.0, next_sample - time.monotonic())))
        except Exception as exc:  # the agent's own output says why
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            print(f"workload_churn: {exc}", file=sys.stderr)
            return 1
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGTERM)
                try:
                    agent.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(agent.pid, signal.SIGKILL)
                    agent.wait()
            log.close()
        traced = Path(sizes_file + ".trace")
        growth = traced.read_text() if traced.exists() else ""
    if args.json:
        print(json.dumps({"settings": vars(args), "samples": rows, "heap_growth": growth.splitlines()}, indent=2))
    elif growth:
        print("\nwhere the Python heap grew since the first minute (tracemalloc, largest first):\n" + growth)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of churn measured (default 600)")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between RSS rows (default 30)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--churn-seconds", type=float, default=1.0, help="each GPU's processes are replaced this often")
    parser.add_argument("--max-processes", type=int, default=4, help="processes per GPU: 1 to this many, each new")
    parser.add_argument("--users", type=int, default=20_000, help="distinct uids the processes run as, in turn")
    parser.add_argument("--tracemalloc", action="store_true", help="print where the Python heap grew, at the end")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    try:
        return child(args) if args.child else parent(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
