#!/usr/bin/env python3
"""The agent's own work per GPU per poll: the NVML backend's poll minus the time spent inside the vendor library.

Run by hand. On a simulated node, NVIDIA's real pynvml over the simulated libnvidia-ml, in this thread's CPU time
(best of `--rounds`, interleaved, so time the shared machine gave other processes is not counted):

- poll: `NvmlBackend.poll` of every GPU (fast tier; `--slow` for polls that also read the slow tier);
- library: the very calls one such poll made (recorded: same functions, same arguments), replayed back to back;
- agent: the same poll over a stand-in whose functions answer at once what the library answered to that call
  (its answers are pynvml's own objects), minus what calling the stand-in costs: gpuwatch's work around NVML (the
  choke point, the tiers, reading the answers, building the sample). Poll - library measures the same thing, with
  the library's noise in it.

    python benchmarks/agent_overhead.py                 # 8 GPUs, healthy, fast polls
    python benchmarks/agent_overhead.py --gpus 64 --slow

On a real NVIDIA node, benchmarks/hardware/nvml_survey.py runs the same measurement over the real libnvidia-ml.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

Call = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Recording:
    """The pynvml module with every nvml* function recording its call and answer; attributes are copied onto the
    instance, so looking one up costs what a module attribute does."""

    def __init__(self, lib: ModuleType) -> None:
        self.calls: list[Call] = []
        self.answers: list[tuple[str, Any, BaseException | None]] = []
        self.recording = False
        for name in dir(lib):
            attr = getattr(lib, name)
            if name.startswith("nvml") and callable(attr) and not isinstance(attr, type):
                attr = self._recorded(name, attr)
            setattr(self, name, attr)

    def _recorded(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.recording:
                return function(*args, **kwargs)
            self.calls.append((name, function, args, kwargs))
            try:
                answer = function(*args, **kwargs)
            except Exception as exc:
                self.answers.append((name, None, exc))
                raise
            self.answers.append((name, answer, None))
            return answer

        return call


class Answering:
    """pynvml with every nvml* function answering, in order, what the recorded poll got (or raising what it raised):
    a library that costs nothing but the call."""

    def __init__(self, recording: Recording) -> None:
        for name, attr in vars(recording).items():
            setattr(self, name, attr)
        answers: dict[str, list[tuple[Any, BaseException | None]]] = {}
        for name, answer, exc in recording.answers:
            answers.setdefault(name, []).append((answer, exc))
        for name, recorded in answers.items():
            setattr(self, name, self._answering(recorded))

    @staticmethod
    def _answering(recorded: list[tuple[Any, BaseException | None]]) -> Callable[..., Any]:
        position = [0]

        def call(*args: Any, **kwargs: Any) -> Any:
            answer, exc = recorded[position[0] % len(recorded)]
            position[0] += 1
            if exc is not None:
                raise exc
            return answer

        return call


def best(work: Callable[[], object], repeat: int) -> float:
    """Mean seconds of `work` over `repeat` calls, in this thread's CPU time."""
    started = time.thread_time()
    for _ in range(repeat):
        work()
    return (time.thread_time() - started) / repeat


def replay(calls: list[Call], lib: Any = None) -> None:
    """The recorded calls again: the real functions, or `lib`'s of the same name."""
    for name, function, args, kwargs in calls:
        with contextlib.suppress(Exception):  # NotSupported and the like: the poll met them too
            (function if lib is None else getattr(lib, name))(*args, **kwargs)


def measure(plain_lib: Any, recording: Recording, *, slow: bool, repeat: int, rounds: int) -> dict[str, Any]:
    """CPU per poll of every GPU, the library's part of it and the agent's own, in seconds per poll (all GPUs).

    `plain_lib` and `recording` are two pynvml modules over the same GPUs (simulated or real); two backends are opened
    on them, so one keeps its library and the other can have its library swapped for the answering stand-in."""
    plain = NvmlBackend(plain_lib)
    stubbed = NvmlBackend(recording)
    for backend in (plain, stubbed):
        backend.open()
        for _ in range(3):
            backend.poll(slow=True)
    recording.recording = True
    stubbed.poll(slow=slow)
    recording.recording = False
    calls = recording.calls
    answering = Answering(recording)
    stubbed._lib, stubbed._resolved = answering, {}  # the same backend, its library now answering at once
    found = dict.fromkeys(("poll", "library", "stubbed poll", "stubs"), float("inf"))
    ways: dict[str, Callable[[], object]] = {
        "poll": lambda: plain.poll(slow=slow),
        "library": lambda: replay(calls),
        "stubbed poll": lambda: stubbed.poll(slow=slow),
        "stubs": lambda: replay(calls, answering),
    }
    gpus = len(plain.poll(slow=False))
    try:
        for _ in range(max(1, rounds)):  # interleaved, so all see the same machine
            for name, work in ways.items():
                found[name] = min(found[name], best(work, repeat))
    finally:
        stubbed._lib, stubbed._resolved = recording, {}
        for backend in (plain, stubbed):
            backend.close()
    return {
        "gpus": gpus,
        "calls_per_poll": len(calls),
        "seconds": found,
        "agent": found["stubbed poll"] - found["stubs"],
        "poll_minus_library": found["poll"] - found["library"],
    }


def report(label: str, slow: bool, measured: dict[str, Any]) -> str:
    n = measured["gpus"]
    us = {name: seconds * 1e6 / n for name, seconds in measured["seconds"].items()}
    kind = "slow" if slow else "fast"
    agent, difference = measured["agent"] * 1e6 / n, measured["poll_minus_library"] * 1e6 / n
    return "\n".join(
        (
            f"{n} GPUs, {label}, {kind} polls: {measured['calls_per_poll'] / n:.1f} NVML calls per GPU",
            f"  poll     {us['poll']:7.1f} µs per GPU",
            f"  library  {us['library']:7.1f} µs per GPU (the same calls replayed)",
            f"  agent    {agent:7.1f} µs per GPU (poll - library: {difference:.1f})",
            f"  poll / library: {us['poll'] / us['library']:.2f}",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="agent_overhead.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--slow", action="store_true", help="polls that read the slow tier too")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    node = SimulatedNode(scenario=args.scenario, gpus=args.gpus, vendor="nvidia")
    measured = measure(
        simulated_pynvml(node),
        Recording(simulated_pynvml(node)),
        slow=args.slow,
        repeat=args.repeat,
        rounds=args.rounds,
    )
    print(report(args.scenario, args.slow, measured))


if __name__ == "__main__":
    main()
