"""Probe baselines: median of the first steady-state probes, never lowered by a degraded run, re-established on a
key change, persisted across restarts, and rebuilt (never fatal) from a corrupt file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gpuwatch.probe.baseline import BASELINES_FILE, BaselineKey, Baselines

KEY = BaselineKey("bf16", "8192x8192x8192", "torch", "2.11.0", "cublas 12.9.1.4", "580.159.04", 700.0)
UUID = "GPU-0"


def feed(b: Baselines, values: list[float], *, key: BaselineKey = KEY, mode: str = "agent", steady: bool = True):  # type: ignore[no-untyped-def]
    result = None
    for v in values:
        result, _ = b.observe(UUID, key, v, steady=steady, mode=mode, timestamp=1.0)  # type: ignore[arg-type]
    return result


def test_the_baseline_is_the_median_of_the_first_five_steady_probes_not_the_max(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    assert feed(b, [808e12, 690e12, 688e12, 689e12]).flops is None  # not yet: 4 of 5
    baseline = feed(b, [687e12])
    assert baseline.flops == 689e12  # the cold GPU's fast first probe never sets it
    assert feed(b, [720e12]).flops == 689e12  # established: later agent probes leave it alone


def test_probes_that_missed_steady_state_never_count(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    assert feed(b, [700e12] * 9, steady=False) is not None
    assert b.load()[UUID].samples == []


def test_a_degraded_run_never_lowers_the_baseline_even_when_asked(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    feed(b, [690e12] * 5)
    baseline, note = b.observe(UUID, KEY, 550e12, steady=True, mode="update", timestamp=2.0)
    assert baseline is not None and baseline.flops == 690e12 and "below 90%" in note
    assert feed(b, [700e12], mode="update").flops == 690e12  # median of 690 ×5 and 700
    assert feed(b, [550e12], mode="reset").flops is None  # an explicit reset starts over, with this probe
    assert b.load()[UUID].samples == [550e12]


def test_the_cli_without_flags_changes_nothing(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    feed(b, [690e12] * 3)
    feed(b, [100e12, 900e12], mode="none")
    assert b.load()[UUID].samples == [690e12] * 3


def test_a_changed_key_re_establishes_the_baseline(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    feed(b, [690e12] * 5)
    for change in ({"driver_version": "590.10"}, {"power_limit_watts": 500.0}, {"blas_version": "cublas 13.0"}):
        new_key = dataclasses.replace(KEY, **change)  # type: ignore[arg-type]
        baseline, note = b.observe(UUID, new_key, 600e12, steady=True, mode="agent", timestamp=3.0)
        assert baseline is not None and baseline.flops is None and baseline.samples == [600e12]
        assert "re-established" in note and next(iter(change)) in note
        feed(b, [690e12] * 5)  # back to the original key: learnt again


def test_a_new_key_keeps_the_baseline_it_replaces_so_a_rollout_regression_shows(tmp_path: Path) -> None:
    """A driver roll-out starts fresh baselines; the one before it stays as ``previous`` (persisted), so the fleet
    rule can compare a model's new baselines with its old ones — a fresh baseline alone hides the regression."""
    b = Baselines(tmp_path)
    feed(b, [690e12] * 5)
    new_driver = dataclasses.replace(KEY, driver_version="590.10")
    assert feed(b, [600e12] * 2, key=new_driver).previous_flops == 690e12  # while the new one is learnt
    assert feed(b, [600e12] * 3, key=new_driver).flops == 600e12
    again = Baselines(tmp_path).load()[UUID]
    assert (again.previous_key, again.previous_flops) == (KEY, 690e12)
    newer = dataclasses.replace(new_driver, blas_version="cublas 13.1")
    assert feed(b, [610e12], key=newer).previous_key == new_driver  # the last established one, not the oldest
    newest = dataclasses.replace(newer, engine_version="2.12.0")
    assert feed(b, [610e12], key=newest).previous_key == new_driver  # newer never established: kept as it was


def test_baselines_survive_a_restart(tmp_path: Path) -> None:
    feed(Baselines(tmp_path), [690e12] * 5)
    again = Baselines(tmp_path).load()[UUID]
    assert again.flops == 690e12 and again.key == KEY and again.established_timestamp == 1.0


def test_a_corrupt_file_is_moved_aside_and_rebuilt(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / BASELINES_FILE).write_text("{not json")
    b = Baselines(tmp_path)
    assert b.load() == {}
    assert "moved it to" in caplog.text
    assert list(tmp_path.glob(f"{BASELINES_FILE}.corrupt-*"))
    feed(b, [690e12] * 5)
    assert json.loads((tmp_path / BASELINES_FILE).read_text())["gpus"][UUID]["flops"] == 690e12


def test_a_foreign_file_and_a_malformed_entry_are_reported_not_fatal(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / BASELINES_FILE).write_text(json.dumps({"kind": "known_gpus", "version": 1, "gpus": {}}))
    assert Baselines(tmp_path).load() == {}
    doc = {"kind": "probe_baselines", "version": 1, "gpus": {"GPU-x": {"key": {"dtype": 1}}, UUID: "nonsense"}}
    (tmp_path / BASELINES_FILE).write_text(json.dumps(doc))
    assert Baselines(tmp_path).load() == {}
    assert "malformed baseline" in caplog.text


def uncapped(b: Baselines, values: list[float], *, mode: str = "agent"):  # type: ignore[no-untyped-def]
    result, note = None, ""
    for v in values:
        result, note = b.observe(UUID, KEY, v, steady=False, mode=mode, timestamp=1.0, uncapped=True)  # type: ignore[arg-type]
    return result, note


def test_a_gpu_that_never_reaches_its_power_limit_gets_a_baseline_from_uncapped_probes(
    tmp_path: Path,
    caplog,  # type: ignore[no-untyped-def]
) -> None:
    """Without this, slow-GPU detection was silently off forever on a GPU that never reached 97 % of its limit."""
    b = Baselines(tmp_path)
    baseline, note = uncapped(b, [600e12, 610e12, 605e12, 602e12])
    assert baseline.flops is None and "4 of 5 uncapped probes" in note
    with caplog.at_level("WARNING", logger="gpuwatch.probe.baseline"):
        baseline, note = uncapped(b, [604e12])
    assert baseline.flops == 604e12 and baseline.key == dataclasses.replace(KEY, uncapped=True)
    assert "never reached the power limit" in note
    assert caplog.text.count("never reached the power limit") == 1  # said once
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpuwatch.probe.baseline"):
        baseline, _ = uncapped(b, [500e12, 606e12])  # later uncapped probes are judged against it as usual
    assert baseline.flops == 604e12 and caplog.text == ""
    assert Baselines(tmp_path).load()[UUID].key.uncapped  # persisted with its mark


def test_a_capped_probe_never_mixes_with_an_uncapped_baseline(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    uncapped(b, [604e12] * 5)
    baseline, note = b.observe(UUID, KEY, 690e12, steady=True, mode="agent", timestamp=2.0)
    assert baseline.key == KEY and baseline.flops is None and baseline.samples == [690e12]
    assert "uncapped True -> False" in note
    assert feed(b, [689e12] * 4).flops == 689e12


def test_uncapped_probes_must_be_consecutive_and_never_touch_a_capped_baseline(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    uncapped(b, [600e12] * 4)
    feed(b, [690e12])  # one probe reached the cap: the run of uncapped probes starts over
    baseline, _ = uncapped(b, [600e12] * 4)
    assert baseline.flops is None and not baseline.key.uncapped
    feed(b, [690e12] * 4)  # the capped baseline is established from 5 capped probes
    baseline, _ = uncapped(b, [600e12] * 10)
    assert baseline.flops == 690e12 and not baseline.key.uncapped


def test_a_baseline_file_without_the_uncapped_mark_still_loads(tmp_path: Path) -> None:
    b = Baselines(tmp_path)
    feed(b, [690e12] * 5)
    doc = json.loads((tmp_path / BASELINES_FILE).read_text())
    del doc["gpus"][UUID]["key"]["uncapped"]
    del doc["gpus"][UUID]["uncapped_samples"]
    (tmp_path / BASELINES_FILE).write_text(json.dumps(doc))
    assert b.load()[UUID].flops == 690e12


def test_the_previous_baseline_is_exported_beside_the_current_one() -> None:
    from gpuwatch.exposition.exporter import export_probe
    from gpuwatch.state.probebook import ProbeBook

    book = ProbeBook()
    book.configure(enabled=True, interval_seconds=600.0)
    book.set_baseline(UUID, "bf16", 600e12, ("bf16", 690e12))
    added: dict[str, tuple[tuple[str, ...], object]] = {}

    class Out:
        def add(self, name: str, labels: tuple[str, ...], value: float | int | bool | None) -> None:
            added[name] = (labels, value)

    export_probe(("0", UUID), UUID, book.view(), Out())
    assert added["gpuwatch_probe_baseline_flops"] == (("0", UUID, "bf16"), 600e12)
    assert added["gpuwatch_probe_baseline_previous_flops"] == (("0", UUID, "bf16"), 690e12)
    book.set_baseline(UUID, "bf16", None)  # a reset with nothing before it: neither is exported
    added.clear()
    export_probe(("0", UUID), UUID, book.view(), Out())
    assert "gpuwatch_probe_baseline_previous_flops" not in added
