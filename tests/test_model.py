"""copy_sample copies dicts and shares the rest: right only while every GpuSample field is immutable or a dict of
immutables. These tests keep it so when a field is added."""

from __future__ import annotations

import copy
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Literal, get_args, get_origin

from simnode import SimAgent

from gpuwatch.core import model
from gpuwatch.core.model import GpuSample, copy_sample

# The model's closed vocabularies (Literal aliases of strings, e.g. ComputeMode) are as immutable as str.
LITERALS = [
    name
    for name, value in vars(model).items()
    if get_origin(value) is Literal and all(isinstance(arg, str) for arg in get_args(value))
]
SCALAR = "(" + "|".join(["str", "int", "float", "bool", *LITERALS]) + ")"
IMMUTABLE = re.compile(rf"^({SCALAR}( \| None)?|tuple\[{SCALAR}, \.\.\.\]( \| None)?|{SCALAR} \| None)$")
# The model's records (a MIG device, …) are as immutable as a scalar where they are frozen and hold only scalars.
RECORDS = [
    name
    for name, value in vars(model).items()
    if isinstance(value, type)
    and is_dataclass(value)
    and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
    and all(IMMUTABLE.match(str(f.type)) for f in fields(value))
]
SCALAR = "(" + "|".join(["str", "int", "float", "bool", *LITERALS, *RECORDS]) + ")"
IMMUTABLE = re.compile(rf"^({SCALAR}( \| None)?|tuple\[{SCALAR}, \.\.\.\]( \| None)?|{SCALAR} \| None)$")
DICT = re.compile(rf"^dict\[({SCALAR}|tuple\[{SCALAR}, {SCALAR}\]), {SCALAR}\]$")


def test_every_field_is_immutable_or_a_dict_of_immutables() -> None:
    for f in fields(GpuSample):
        annotation = str(f.type)
        if f.default_factory is dict:  # type: ignore[comparison-overlap]
            assert DICT.match(annotation), f"{f.name}: {annotation}: copy_sample copies dicts one level deep only"
        else:
            assert IMMUTABLE.match(annotation), f"{f.name}: {annotation}: copy_sample shares this field"


def test_a_copy_equals_a_deep_copy_and_shares_nothing_mutable(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="mixed", gpus=2)
    try:
        sim.run(3.0)
        samples = [s for s in (sim.agent.store.snapshot().fresh(u) for u in sim.agent.store.identities()) if s]
    finally:
        sim.close()
    assert samples
    for sample in samples:
        copied = copy_sample(sample)
        assert copied == copy.deepcopy(sample) and copied is not sample
        for f in fields(GpuSample):
            if f.default_factory is dict:  # type: ignore[comparison-overlap]
                value = getattr(copied, f.name)
                assert value is not getattr(sample, f.name)
                value["x"] = 1.0
                assert "x" not in getattr(sample, f.name)
