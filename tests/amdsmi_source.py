"""The public interface of an ``amdsmi`` package, read from its source with ast (importing it needs ROCm).

    python tests/amdsmi_source.py path/to/amdsmi > tests/data/amdsmi-6.4.3-interface.json

wrote the vendored 6.4.3 snapshot (from amdsmi-6.4.3-py3-none-any.whl, see PROVENANCE in the file); the 7.0.2
interface is read live from the package the dev extra installs.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any


def _params(node: ast.FunctionDef) -> list[list[Any]]:
    """[name, has_default] for every parameter after self."""
    args = node.args
    names = [a.arg for a in args.args]
    defaults = [False] * (len(names) - len(args.defaults)) + [True] * len(args.defaults)
    params = [[n, d] for n, d in zip(names, defaults, strict=True) if n != "self"]
    params += [[a.arg, d is not None] for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return params


def _constants(tree: ast.Module) -> dict[str, int]:
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                found[node.targets[0].id] = value.value
            elif isinstance(value, ast.Name) and value.id in found:
                found[node.targets[0].id] = found[value.id]
    return found


def read_interface(package: Path) -> dict[str, Any]:
    """functions, enums, event reader and exception classes of the package at `package`."""
    interface = ast.parse((package / "amdsmi_interface.py").read_text())
    wrapper = _constants(ast.parse((package / "amdsmi_wrapper.py").read_text()))
    exceptions = ast.parse((package / "amdsmi_exception.py").read_text())
    out: dict[str, Any] = {"functions": {}, "enums": {}, "classes": {}, "exceptions": {}, "status": {}}
    out["status"] = {k: v for k, v in wrapper.items() if k.startswith("AMDSMI_STATUS_")}
    for node in interface.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("amdsmi_"):
            out["functions"][node.name] = _params(node)
        elif isinstance(node, ast.ClassDef):
            bases = {b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases}
            if bases & {"IntEnum", "Enum"}:
                members: dict[str, int | None] = {}
                for item in node.body:
                    if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                        value = item.value
                        if isinstance(value, ast.Attribute):
                            members[item.targets[0].id] = wrapper.get(value.attr)
                        elif isinstance(value, ast.Constant) and isinstance(value.value, int):
                            members[item.targets[0].id] = value.value
                        else:
                            members[item.targets[0].id] = None
                out["enums"][node.name] = members
            else:
                out["classes"][node.name] = {
                    item.name: _params(item) for item in node.body if isinstance(item, ast.FunctionDef)
                }
    for node in exceptions.body:
        if isinstance(node, ast.ClassDef):
            init = next((i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"), None)
            out["exceptions"][node.name] = {
                "bases": [b.id for b in node.bases if isinstance(b, ast.Name)],
                "init": _params(init) if init is not None else None,
                "methods": sorted(i.name for i in node.body if isinstance(i, ast.FunctionDef)),
            }
    return out


if __name__ == "__main__":
    snapshot = read_interface(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        snapshot = {"PROVENANCE": sys.argv[2], **snapshot}
    json.dump(snapshot, sys.stdout, indent=1, sort_keys=True)
    print()
