"""Super-I/O input mappings: what each raw pin of a board's monitoring chip is, like lm-sensors' sensors.conf.

A Super-I/O chip (nct67xx, it87 …) reports pins, not rails: `in4` may be the 12 V rail behind a 1:12 divider on one
board and nothing at all on the next. Only the operator (or a shipped example for the board) can say, so these
chips' voltages are exported only through a mapping file listed in `host.sensor_maps`:

    [[chip]]
    match = "nct6798-isa-*"          # glob on the chip label (name-bus-address)
    board = "Pro WS WRX80E-SAGE*"     # optional glob on /sys/class/dmi/id/board_name
    [chip.in4]
    label = "+12V"
    compute = "@*12"                  # sensors.conf syntax; "@*12, @/12" is accepted too
    nominal = 12.0
    min = 11.4                        # optional lower critical threshold
    [chip.temp7]
    ignore = true
"""

from __future__ import annotations

import ast
import fnmatch
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.files.tomlfile import TomlFileError, load_toml_file

INPUT_RE = re.compile(r"(in|temp|fan)[0-9]+")  # fullmatch: the sysfs names the hwmon reader looks up, no more
INPUT_KEYS = ("label", "compute", "nominal", "min", "ignore")
MAX_COMPUTE_CHARS = 200  # sensors.conf's real ones are under 30 characters


class SensorMapError(Exception):
    """A mapping file that cannot be used; the message names the file, the key and the problem."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}" if key else f"{path}: {problem}")


@dataclass(frozen=True, slots=True)
class Compute:
    """A sensors.conf-style expression in `@` (the raw reading): + - * / and parentheses only."""

    text: str
    _tree: ast.Expression

    @classmethod
    def parse(cls, text: str) -> Compute:
        expr = text.split(",")[0].strip()  # sensors.conf gives "from, to"; only the first direction matters here
        if len(expr) > MAX_COMPUTE_CHARS:  # bounds the nesting too, far below Python's recursion limit
            raise ValueError(
                f"{text[:40]!r}… is {len(expr):,} characters; a compute expression has at most {MAX_COMPUTE_CHARS} "
                "(a divider is '@*(1+120/56)')"
            )
        try:
            tree = ast.parse(expr.replace("@", "x"), mode="eval")
        except (SyntaxError, ValueError):
            raise ValueError(f"{text!r} is not an expression like '@*12' or '@*(1+120/56)'") from None
        except (RecursionError, MemoryError):
            raise ValueError(f"{text[:40]!r}… is nested too deeply to be an expression like '@*12'") from None
        for node in ast.walk(tree):
            allowed = (
                ast.Expression,
                ast.BinOp,
                ast.UnaryOp,
                ast.Add,
                ast.Sub,
                ast.Mult,
                ast.Div,
                ast.USub,
                ast.UAdd,
                ast.Load,
            )
            if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
                continue
            if isinstance(node, ast.Name) and node.id == "x":
                continue
            if not isinstance(node, allowed):
                raise ValueError(f"{text!r}: only numbers, @, + - * / and parentheses are allowed")
        return cls(text, tree)

    def apply(self, raw: float) -> float:
        return float(_evaluate(self._tree.body, raw))


def _evaluate(node: ast.expr, x: float) -> float:
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int | float)
        return float(node.value)
    if isinstance(node, ast.Name):
        return x
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, x)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.BinOp)
    left, right = _evaluate(node.left, x), _evaluate(node.right, x)
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    return left / right if right else float("nan")


@dataclass(frozen=True, slots=True)
class InputMap:
    label: str | None = None
    compute: Compute | None = None
    nominal: float | None = None
    min: float | None = None
    ignore: bool = False

    def scale(self, raw: float) -> float:
        return raw if self.compute is None else self.compute.apply(raw)


@dataclass(frozen=True, slots=True)
class ChipMap:
    match: str
    board: str | None
    inputs: dict[str, InputMap] = field(default_factory=dict)
    source: str = ""

    def applies(self, chip: str, board_name: str) -> bool:
        if not fnmatch.fnmatchcase(chip, self.match):
            return False
        return self.board is None or fnmatch.fnmatchcase(board_name, self.board)


def load_sensor_maps(paths: Iterable[str]) -> tuple[ChipMap, ...]:
    """Read and validate every mapping file; raise SensorMapError naming the first problem."""
    maps: list[ChipMap] = []
    for path in paths:
        try:
            raw = load_toml_file(Path(path))  # the config's own reader: the same limits and messages
        except FileNotFoundError:
            raise SensorMapError(path, "", "file not found; fix host.sensor_maps or create the file") from None
        except TomlFileError as exc:
            raise SensorMapError(path, "", str(exc)) from None
        maps.extend(_parse_file(path, raw))
    return tuple(maps)


def _parse_file(path: str, raw: dict[str, object]) -> list[ChipMap]:
    unknown = set(raw) - {"chip"}
    if unknown:
        raise SensorMapError(path, sorted(unknown)[0], "unknown key; a mapping file holds [[chip]] tables only")
    chips = raw.get("chip", [])
    if not isinstance(chips, list) or not all(isinstance(c, dict) for c in chips):
        raise SensorMapError(path, "chip", "must be an array of tables ([[chip]])")
    return [_parse_chip(path, f"chip[{n}]", chip) for n, chip in enumerate(chips)]


def _parse_chip(path: str, where: str, chip: dict[str, object]) -> ChipMap:
    match = chip.get("match")
    if not isinstance(match, str) or not match:
        raise SensorMapError(path, f"{where}.match", "required: a glob on the chip label, e.g. 'nct6798-isa-*'")
    board = chip.get("board")
    if board is not None and not isinstance(board, str):
        raise SensorMapError(path, f"{where}.board", "must be a string (a glob on the DMI board name)")
    inputs: dict[str, InputMap] = {}
    for key, value in chip.items():
        if key in ("match", "board"):
            continue
        if not INPUT_RE.fullmatch(key):
            raise SensorMapError(path, f"{where}.{key}", "unknown key; inputs are named like in4, temp2, fan1")
        if not isinstance(value, dict):
            raise SensorMapError(path, f"{where}.{key}", "must be a table ([chip.in4])")
        inputs[key] = _parse_input(path, f"{where}.{key}", value)
    return ChipMap(match, board, inputs, path)


def _parse_input(path: str, where: str, table: dict[str, object]) -> InputMap:
    for key in table:
        if key not in INPUT_KEYS:
            raise SensorMapError(path, f"{where}.{key}", f"unknown key; known: {', '.join(INPUT_KEYS)}")
    label, compute, ignore = table.get("label"), table.get("compute"), table.get("ignore", False)
    if label is not None and (not isinstance(label, str) or not label):
        raise SensorMapError(path, f"{where}.label", "must be a non-empty string")
    if not isinstance(ignore, bool):
        raise SensorMapError(path, f"{where}.ignore", "must be true or false")
    parsed: Compute | None = None
    if compute is not None:
        if not isinstance(compute, str):
            raise SensorMapError(path, f"{where}.compute", "must be a string like '@*12'")
        try:
            parsed = Compute.parse(compute)
        except ValueError as exc:
            raise SensorMapError(path, f"{where}.compute", str(exc)) from None
    numbers: dict[str, float | None] = {}
    for key in ("nominal", "min"):
        value = table.get(key)
        numbers[key] = None if value is None else _volts(value)
        if value is not None and numbers[key] is None:
            raise SensorMapError(path, f"{where}.{key}", "must be a positive, finite number of volts")
    return InputMap(label, parsed, numbers["nominal"], numbers["min"], ignore)


def _volts(value: object) -> float | None:
    """A positive finite number of volts, else None: TOML also has nan, inf and integers past a float's range, and
    a NaN limit is one no alert can compare against."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        volts = float(value)
    except OverflowError:
        return None
    return volts if math.isfinite(volts) and volts > 0 else None


def find_input(maps: Iterable[ChipMap], chip: str, board_name: str, key: str) -> InputMap | None:
    """The first mapping of `key` on `chip` (files in the order configured, chips in file order)."""
    for chip_map in maps:
        if chip_map.applies(chip, board_name) and key in chip_map.inputs:
            return chip_map.inputs[key]
    return None


def has_mapping(maps: Iterable[ChipMap], chip: str, board_name: str) -> bool:
    return any(m.applies(chip, board_name) for m in maps)
