"""/healthz (the agent's liveness) and /health/gpus (the node's GPU health) answer exactly as the README's table says:
the table is parsed, and every row of it is a case here, run against a real agent over the simulated library."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_agent_faults import POLL, Running, wait_for

from gpuwatch.collectors.vendors import STUCK_MIN_SECONDS

README = Path(__file__).resolve().parent.parent / "README.md"


_PLACEHOLDERS = {"N": r"\d+", "C": r"\w+", "…": ".*?"}
_TOKENS = re.compile(r"(\bN\b|\bC\b|…)")


def _readme_states() -> dict[str, tuple[int, int, list[str]]]:
    """The node's state -> (/healthz status, /health/gpus status, what /health/gpus says as regexes: each `quoted`
    fragment of the last column, with N a number, C a call's name and … any text within the line)."""
    text = README.read_text()
    table = text[text.index("| the node | `/healthz` | `/health/gpus` |") :].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        says = [
            "".join(_PLACEHOLDERS.get(t, re.escape(t)) for t in _TOKENS.split(f))
            for f in re.findall(r"`([^`]+)`", cells[3])
        ]
        rows[cells[0]] = (int(cells[1]), int(cells[2]), says)
    return rows


class Starting(Running):
    """An agent whose first poll hangs in a vendor call: it never gets past starting."""

    def __init__(self, tmp_path: Path) -> None:
        from gpuwatch.simulated.scenarios import SimulatedNode

        original = SimulatedNode.__init__

        def hung_from_the_start(node: SimulatedNode, *args: object, **kwargs: object) -> None:
            original(node, *args, **kwargs)  # type: ignore[arg-type]
            node.faults.hang("nvmlDeviceGetPowerUsage")

        SimulatedNode.__init__ = hung_from_the_start  # type: ignore[method-assign]
        try:
            super().__init__(tmp_path)
        finally:
            SimulatedNode.__init__ = original  # type: ignore[method-assign]


def _healthy(tmp: Path) -> Running:
    return Running(tmp)


def _hung(tmp: Path) -> Running:
    r = Running(tmp)
    wait_for(lambda: r.get("/healthz")[0] == 200)
    r.node.faults.hang("nvmlDeviceGetPowerUsage", gpu=1)
    assert r.node.faults.wait_until_blocked(1, timeout=5)
    wait_for(lambda: r.get("/healthz")[0] == 503, timeout=3 * POLL + 5)
    # A call counts as hung after STUCK_MIN_SECONDS (1 s), longer than this test's 0.2 s poll takes to go stale.
    wait_for(lambda: "has not returned for" in r.get("/health/gpus")[1], timeout=STUCK_MIN_SECONDS + 5)
    return r


def _lost(tmp: Path) -> Running:
    r = Running(tmp)
    wait_for(lambda: r.get("/healthz")[0] == 200)
    r.node.faults.lose_gpu(2)
    wait_for(lambda: r.up().get("2") == 0.0)
    return r


def _scenario(name: str, ready: str) -> Callable[[Path], Running]:
    def make(tmp: Path) -> Running:
        r = Running(tmp, scenario=name)
        wait_for(lambda: ready in r.get("/health/gpus")[1], timeout=30)
        return r

    return make


CASES: dict[str, tuple[Callable[[Path], Running], str, str]] = {
    # README row: (the node in that state, words /healthz says, words /health/gpus says beyond the README's)
    "every expected GPU present, nothing an alert pages on": (_healthy, "ok", "ok: 4 GPUs healthy"),
    "starting: the first poll has not finished": (Starting, "starting", "0 of 4 expected GPUs detected"),
    "a poll hung in a vendor call (readings go stale)": (
        _hung,
        "hung vendor call",
        "node: the nvml call nvmlDeviceGetPowerUsage on GPU 1 (",
    ),
    "a GPU lost": (_lost, "ok", "GPU 2: lost"),
    "the vendor library down (driver missing)": (
        _scenario("backend_down", "library is down"),
        "ok",
        "none of the 4 expected NVIDIA GPUs can be read",
    ),
    "a GPU fault an alert pages on (overheating, XID 79, ...)": (
        _scenario("overheating", "overheating"),
        "ok",
        "GPU 2: overheating: ",
    ),
}


def test_the_readme_table_is_the_cases_here() -> None:
    assert set(_readme_states()) == set(CASES)
    assert all(says for _, _, says in _readme_states().values()), "every row says what /health/gpus answers"


@pytest.fixture(params=list(CASES))
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Running]]:
    make = CASES[request.param][0]
    r = make(tmp_path)
    try:
        yield request.param, r
    finally:
        r.node.faults.clear()
        r.agent.stop()


def test_each_state_answers_as_the_readme_says(state: tuple[str, Running]) -> None:
    name, r = state
    want_healthz, want_gpus, readme_says = _readme_states()[name]
    _, healthz_words, gpus_words = CASES[name]
    time.sleep(2 * POLL)  # a state that holds, not a moment of it
    healthz = r.get("/healthz")
    gpus = r.get("/health/gpus")
    assert (healthz[0], gpus[0]) == (want_healthz, want_gpus), (healthz, gpus)
    assert healthz_words in healthz[1] and gpus_words in gpus[1], (healthz[1], gpus[1])
    assert re.fullmatch(r"[^\n]+(\n[^\n]+)*\n", gpus[1]), gpus[1]  # a line per problem
    lines = gpus[1].splitlines()
    for says in readme_says:  # the README's words, each a whole line of the body
        assert any(re.fullmatch(says, line) for line in lines), (says, gpus[1])


def test_a_gpu_frozen_by_a_hung_call_is_not_readable_and_never_lost(tmp_path: Path) -> None:
    """The hang's GPU and every other GPU it froze each say so (no job belongs on a GPU whose state is unknown); none
    reads as lost or missing, and the node's line, the first, names the call and the GPU."""
    r = _hung(tmp_path)
    try:
        status, body, _ = r.get("/health/gpus")
        lines = body.splitlines()
        assert status == 503 and lines[0].startswith("node: the nvml call nvmlDeviceGetPowerUsage on GPU 1 ("), body
        gpus = sorted(line.split(":", 1)[0] for line in lines[1:])
        assert gpus == [f"GPU {i}" for i in range(4)], body
        assert all(": not readable: vendor call hung: nvmlDeviceGetPowerUsage" in line for line in lines[1:]), body
        assert "GPU 1: not readable: vendor call hung: nvmlDeviceGetPowerUsage on this GPU for " in body, body
        assert "lost" not in body and "expected GPUs detected" not in body, body
        # the call returns: the GPUs are read again, healthy
        r.node.faults.clear()
        wait_for(lambda: r.get("/health/gpus")[:2] == (200, "ok: 4 GPUs healthy\n"), timeout=3 * POLL + 10)
    finally:
        r.node.faults.clear()
        r.agent.stop()
