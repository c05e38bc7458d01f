#!/usr/bin/env python3
"""Print what breaks gpuwatch's layers: cycles between packages, imports up the layers (or across independent
siblings), cycles between modules, and modules outside every layer. Exit 1 when any is found.

The layers are the ones pyproject.toml's import-linter contract names (docs/development.md, "The tree"). This reads
the source itself, so it counts what import-linter may be told to ignore: imports inside functions and under
TYPE_CHECKING. Usage: python scripts/layers.py [--quiet] [--root CHECKOUT]
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "gpuwatch"


def layers(root: Path) -> list[list[str]]:
    """The contract's layers, top first; each a list of independent siblings."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in line.split(":")] for line in contract["layers"]]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name); the wheel's copied files left out."""
    found: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "_shipped" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The gpuwatch modules `name` imports anywhere in its source: at the top, in functions, under TYPE_CHECKING."""
    known = set(known)
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:  # `from a.b import name`: the module a.b
                target = target.rpartition(".")[0]
            if (target and target != name and target.startswith(PACKAGE + ".")) or target == PACKAGE:
                out.add(target)
    out.discard(name)
    return out


def layer_of(module: str, placed: list[list[str]]) -> tuple[int, str] | None:
    """(layer index from the top, the layer entry) holding `module`, or None."""
    for index, siblings in enumerate(placed):
        for entry in siblings:
            if module == entry or module.startswith(entry + "."):
                return index, entry
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else Path(__file__).resolve().parent.parent
    placed = layers(root)
    found = modules(root)
    graph = {name: imports(name, path, found) for name, path in found.items()}

    outside = [m for m in found if m != PACKAGE and layer_of(m, placed) is None]
    upward: list[str] = []
    packages: dict[str, set[str]] = {}
    for source, targets in sorted(graph.items()):
        here = layer_of(source, placed)
        for target in sorted(targets):
            there = layer_of(target, placed)
            if here is None or there is None or here[1] == there[1]:
                continue
            packages.setdefault(here[1], set()).add(there[1])
            if there[0] < here[0]:
                upward.append(f"{source} -> {target} (up: {there[1]} is above {here[1]})")
            elif there[0] == here[0]:
                upward.append(f"{source} -> {target} (across: {here[1]} and {there[1]} are independent siblings)")
    package_cycles = cycles(packages)
    module_cycles = cycles({m: {t for t in ts if t != PACKAGE} for m, ts in graph.items()})

    print(f"{len(found)} modules in {sum(len(line) for line in placed)} layer entries on {len(placed)} layers")
    for title, items in (
        ("package cycles", [" <-> ".join(c) for c in package_cycles]),
        ("imports up the layers", upward),
        ("module cycles", [" <-> ".join(c) for c in module_cycles]),
        ("modules outside every layer", outside),
    ):
        print(f"{title}: {len(items)}")
        if not quiet:
            for item in items:
                print(f"  {item}")
    return 1 if package_cycles or upward or module_cycles or outside else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
