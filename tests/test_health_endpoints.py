"""/healthz (the agent's liveness) and /health/gpus (the node's GPU health) answer exactly as the README's table says:
the table is parsed, and every row of it is a case here, run against a real agent over the simulated library."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_agent_faults import POLL, Running, wait_for

README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_states() -> dict[str, tuple[int, int]]:
    text = README.read_text()
    table = text[text.index("| the node | `/healthz` | `/health/gpus` |") :].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = (int(cells[1]), int(cells[2]))
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
    # README row: (the node in that state, words /healthz says, words /health/gpus says)
    "every expected GPU present, nothing an alert pages on": (_healthy, "ok", "ok: 4 GPUs healthy"),
    "starting: the first poll has not finished": (Starting, "starting", "0 of 4 expected GPUs detected"),
    "a poll hung in a vendor call (readings go stale)": (_hung, "hung vendor call", "GPU 1: lost"),
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
    want_healthz, want_gpus = _readme_states()[name]
    _, healthz_words, gpus_words = CASES[name]
    time.sleep(2 * POLL)  # a state that holds, not a moment of it
    healthz = r.get("/healthz")
    gpus = r.get("/health/gpus")
    assert (healthz[0], gpus[0]) == (want_healthz, want_gpus), (healthz, gpus)
    assert healthz_words in healthz[1] and gpus_words in gpus[1], (healthz[1], gpus[1])
    assert re.fullmatch(r"[^\n]+(\n[^\n]+)*\n", gpus[1]), gpus[1]  # a line per problem
