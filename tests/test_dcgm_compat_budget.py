"""[compat] dcgm answers what it answered before the series budget (issue #34): the budget serves less of gpuwatch's
own families by default (zeros of exclusive sets and idle flags, constants, opt-in detail), and the DCGM mapping
(gpuwatch/exposition/dcgm_fields.py) is computed from those families. With [compat] dcgm on, the agent serves what the
mapping reads whole. tests/golden/dcgm-dataloader_starved.prom is the DCGM families as the agent served them before
the budget's cuts: scenario dataloader_starved, whose GPU 1 holds no clock event reason (DCGM's bitmask 0, not
absent) and whose other GPUs are idle, at 10 s."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

GOLDEN = Path(__file__).parent / "golden" / "dcgm-dataloader_starved.prom"


def dcgm_lines(text: str) -> str:
    """The DCGM_FI_* samples of a scrape, one per line, sorted; the host name fixed."""
    lines = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("DCGM_"):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{labels}}} {sample.value!r}")
    return "\n".join(sorted(lines)) + "\n"


def test_dcgm_names_answer_as_before_the_budget(tmp_path: Path) -> None:
    sim = SimAgent(
        tmp_path,
        scenario="dataloader_starved",
        probe={"interval_seconds": 0},
        sections={"compat": {"dcgm": True, "dcgm_hostname": "gpu-node-07"}},
    )
    try:
        sim.run(10.0)
        served = dcgm_lines(sim.text())
    finally:
        sim.close()
    if os.environ.get("GPUWATCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(served)
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS{" in served and "} 0.0\n" in served
    assert served == GOLDEN.read_text(), "the DCGM names answer differently: a cut starves [compat] dcgm"
