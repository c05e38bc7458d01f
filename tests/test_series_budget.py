"""The series budget (issue #34, docs/cost-and-sizing.md "The series budget"): a healthy 8×H100 HGX node serves at
most 700 series by default, its RDMA ports' series excluded and stated beside it; the opt-in groups add what the
configuration reference says they add. Measured the way the docs say: the real agent, backend and simulated
libnvidia-ml through the agent's own /metrics, 30 s of polls, one probe round, 30 s more."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from simnode import SimAgent

BUDGET = 700
GPUS, LINKS, PORTS = 8, 18, 9  # the simulated HGX node: 18 NVLinks per H100, a ConnectX-7 per GPU and a RoCE NIC
PER_LINK = 7  # a link's state, its four DL error counters, its two byte counters
DOCS = Path(__file__).resolve().parents[1] / "docs" / "cost-and-sizing.md"


def _served(tmp: Path, sections: dict[str, dict[str, object]] | None = None) -> Counter[str]:
    """Series per family on a healthy simulated HGX node."""
    sim = SimAgent(tmp, nvlink=True, sections=sections)
    try:
        sim.run(30)
        sim.probe_round()
        sim.run(30)
        return Counter(name for name, _labels in sim.samples())
    finally:
        sim.close()


def _gpu_side(families: Counter[str]) -> int:
    return sum(n for name, n in families.items() if not name.startswith("gpuwatch_network_"))


def test_a_healthy_hgx_node_serves_at_most_700_series_nics_excluded(tmp_path: Path) -> None:
    families = _served(tmp_path)
    node = _gpu_side(families)
    nics = sum(families.values()) - node
    biggest = families.most_common(12)
    assert node <= BUDGET, f"{node} series on a healthy HGX node, over the budget of {BUDGET}: {biggest}"
    # The verdict, compute-error and link-count series of the other issues are part of it.
    for included in ("gpuwatch_gpu_health", "gpuwatch_gpu_recommended_action", "gpuwatch_probe_compute_errors_total"):
        assert families[included] == GPUS, included
    assert families["gpuwatch_gpu_nvlinks_up"] == families["gpuwatch_gpu_nvlinks_expected"] == GPUS
    # The NICs' series, stated beside the budget: 16 a port, the RoCE port's carrier downs one more.
    assert families["gpuwatch_network_port_up"] == PORTS and families["gpuwatch_network_port_carrier_down_total"] == 1
    assert nics == 16 * PORTS + 1
    # docs/cost-and-sizing.md states both figures as measured here.
    text = DOCS.read_text()
    stated = re.search(r"\*\*(\d[\d,]*) series\*\* by default, NICs excluded; the (\d+) NICs? add \*\*(\d+)\*\*", text)
    assert stated, "docs/cost-and-sizing.md no longer states the measured budget"
    assert (int(stated[1].replace(",", "")), int(stated[2]), int(stated[3])) == (node, PORTS, nics)


def test_every_nvlink_per_link_adds_seven_series_a_link(tmp_path: Path) -> None:
    """[nvml] nvlink_per_link: what the docs say the switch costs, 7 series a link, 1,008 on the node."""
    default = _gpu_side(_served(tmp_path / "default"))
    per_link = _gpu_side(_served(tmp_path / "per-link", {"nvml": {"nvlink_per_link": True}}))
    assert per_link - default == GPUS * LINKS * PER_LINK


def test_the_opt_in_groups_add_what_the_docs_say(tmp_path: Path) -> None:
    """docs/cost-and-sizing.md's table of what each switch adds on this node."""
    default = _served(tmp_path / "default")
    pipes = _served(tmp_path / "pipes", {"nvml": {"gpm_per_pipe": True}})
    video = _served(tmp_path / "video", {"nvml": {"video_clock": True}})
    assert pipes - default == Counter({"gpuwatch_gpu_pipe_active_ratio": GPUS * 8})
    assert video - default == Counter({"gpuwatch_gpu_clock_hertz": GPUS})
