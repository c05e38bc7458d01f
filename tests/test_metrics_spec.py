"""The metric catalogue holds to spec/metrics.md: every listed metric, its type and its labels."""

from __future__ import annotations

import re

import pytest
from conftest import shared_dir

from gpuwatch.metrics import CATALOGUE, COLLECTORS


def spec_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Parse the spec's tables: `name` | type | labels | meaning."""
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in (shared_dir() / "spec" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`gpuwatch_\w+`", cells[0]):
            continue
        labels = tuple(re.findall(r"`(\w+)`(?:\s*\([^)]*\))?", cells[2])) if cells[2] != "—" else ()
        rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def test_spec_is_parsed() -> None:
    rows = spec_metrics()
    assert len(rows) > 50
    assert rows["gpuwatch_gpu_throttle_seconds_total"] == ("counter", ("gpu", "uuid", "reason"))


@pytest.mark.parametrize("name", sorted(spec_metrics()))
def test_catalogue_has_every_spec_metric(name: str) -> None:
    type_, labels = spec_metrics()[name]
    spec = CATALOGUE.get(name)
    assert spec is not None, f"{name} is in spec/metrics.md but not in the catalogue"
    assert spec.type == type_
    assert spec.labels == labels


def test_catalogue_adds_nothing_unlisted() -> None:
    assert set(CATALOGUE) == set(spec_metrics())


def test_counters_end_in_total_and_units_are_base_units() -> None:
    for spec in CATALOGUE.values():
        assert (spec.type == "counter") == spec.name.endswith("_total"), spec.name
        assert not re.search(r"_(milli|micro|kilo|mega)", spec.name)


def test_collector_names_match_spec() -> None:
    text = (shared_dir() / "spec" / "metrics.md").read_text()
    line = next(row for row in text.splitlines() if row.startswith("`collector` values:"))
    assert tuple(re.findall(r"`(\w+)`", line.split(":", 1)[1])) == COLLECTORS
