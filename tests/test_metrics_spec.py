"""The metric catalogue holds to the names first agreed (tests/fixtures/spec-names.json): every listed metric with its
type and its labels, and the collector names."""

from __future__ import annotations

import re

import pytest
from repofiles import SPEC_NAMES, spec_names

from gpuwatch.exposition.catalogue import CATALOGUE, COLLECTORS


def spec_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Metric name -> (type, labels), as first agreed."""
    return {name: (m["type"], tuple(m["labels"])) for name, m in spec_names()["metrics"].items()}


def test_spec_is_parsed() -> None:
    rows = spec_metrics()
    assert len(rows) > 50
    assert rows["gpuwatch_gpu_throttle_seconds_total"] == ("counter", ("gpu", "uuid", "reason"))


@pytest.mark.parametrize("name", sorted(spec_metrics()))
def test_catalogue_has_every_spec_metric(name: str) -> None:
    type_, labels = spec_metrics()[name]
    spec = CATALOGUE.get(name)
    assert spec is not None, f"{name} is in {SPEC_NAMES.name} but not in the catalogue: names are never removed"
    assert spec.type == type_
    assert spec.labels == labels


def test_catalogue_adds_nothing_unlisted() -> None:
    unlisted = sorted(set(CATALOGUE) - set(spec_metrics()))
    assert not unlisted, f"add the new metrics to tests/fixtures/{SPEC_NAMES.name} too: {unlisted}"
    assert set(CATALOGUE) == set(spec_metrics())


def test_counters_end_in_total_and_units_are_base_units() -> None:
    for spec in CATALOGUE.values():
        assert (spec.type == "counter") == spec.name.endswith("_total"), spec.name
        assert not re.search(r"_(milli|micro|kilo|mega)", spec.name)


def test_collector_names_match_spec() -> None:
    assert tuple(spec_names()["collectors"]) == COLLECTORS
