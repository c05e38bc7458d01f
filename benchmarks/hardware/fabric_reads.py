#!/usr/bin/env python3
"""Issue #34's reads on a real node, for issue #36: what the driver answers about the NVLink fabric, the NVSwitches and
the fabric manager, the RDMA ports, and MIG, beside what gpuwatch makes of it. Read-only: nothing is set.

For each GPU: nvmlDeviceGetGpuFabricInfoV at version 3 (where the installed nvidia-ml-py has it) and version 2, raw
(state, status, healthMask, healthSummary, or the NVML error: NotSupported is the vendor's answer on a GPU without a
fabric), then gpuwatch's NVML backend's reading (fabric_healthy, fabric_health), and the MIG mode (only read: a
disabled MIG is reported as such). For the node: NVSwitches on the PCI bus, nv-fabricmanager as the agent sees it,
and every RDMA port gpuwatch's reader finds. `nvidia-smi -q`'s Fabric section is kept beside them. `--dry-run` reads
the simulated HGX node of scenario fabric_degraded instead of the GPUs. Raw JSON to --out, a table to --markdown.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpuwatch.backends.nvml import NvmlBackend, load_pynvml  # noqa: E402
from gpuwatch.readers.fabric_manager import manager_state  # noqa: E402
from gpuwatch.readers.pci import count_nvswitches  # noqa: E402
from gpuwatch.readers.procfs import Procfs  # noqa: E402
from gpuwatch.readers.rdma import read_ports  # noqa: E402


def _raw(lib: Any, handle: Any, name: str) -> dict[str, Any]:
    struct = getattr(lib, name, None)
    if struct is None:
        return {"struct": name, "answer": "not in this nvidia-ml-py"}
    info = struct()
    try:
        lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except lib.NVMLError as exc:
        return {"struct": name, "answer": f"NVMLError: {exc}"}
    out = {"struct": name, "state": int(info.state), "status": int(info.status), "healthMask": int(info.healthMask)}
    if hasattr(info, "healthSummary"):
        out["healthSummary"] = int(info.healthSummary)
    return out


def read(dry_run: bool) -> dict[str, Any]:
    if dry_run:
        from gpuwatch.simulated.bindings import simulated_pynvml
        from gpuwatch.simulated.scenarios import SimulatedNode

        node = SimulatedNode("fabric_degraded", gpus=2)
        lib = simulated_pynvml(node)
        switches, manager, ports = node.nvswitch_count(), node.fabric_manager_running(), []
    else:
        lib = load_pynvml()
        state = manager_state(Procfs())  # as the agent reads it: the process table, else the API socket
        switches, manager, ports = count_nvswitches(), state.running, read_ports()
    lib.nvmlInit()
    gpus = []
    try:
        for index in range(lib.nvmlDeviceGetCount()):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            try:
                mig = list(lib.nvmlDeviceGetMigMode(handle))
            except lib.NVMLError as exc:
                mig = [f"NVMLError: {exc}"]
            gpus.append(
                {
                    "index": index,
                    "v3": _raw(lib, handle, "c_nvmlGpuFabricInfo_v3_t"),
                    "v2": _raw(lib, handle, "c_nvmlGpuFabricInfoV_t"),
                    "mig_mode_current_pending": mig,
                }
            )
    finally:
        lib.nvmlShutdown()
    backend = NvmlBackend(lib)
    backend.open()
    try:
        for reading in backend.poll(slow=True):
            sample = reading.sample
            if sample is not None and reading.identity.index < len(gpus):
                gpus[reading.identity.index]["gpuwatch"] = {
                    "fabric_healthy": sample.fabric_healthy,
                    "fabric_health": sample.fabric_health,
                    "fabric_misconfiguration": sample.fabric_misconfiguration,
                    "mig_enabled": sample.mig_enabled,
                }
    finally:
        backend.close()
    smi = ""
    if not dry_run:
        done = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60, check=False)
        lines = done.stdout.splitlines()
        smi = "\n".join(
            line
            for i, line in enumerate(lines)
            if "Fabric" in line or any("Fabric" in before for before in lines[max(0, i - 6) : i])
        )
    return {
        "gpus": gpus,
        "nvswitches": switches,
        "fabric_manager_running": manager,
        "rdma_ports": [
            {"device": p.device, "port": p.port, "up": p.up, "rate": p.rate_bits_per_second, "link_layer": p.link_layer}
            for p in ports
        ],
        "nvidia_smi_fabric": smi,
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| GPU | v3 | v2 | gpuwatch | MIG (current, pending) |", "| --- | --- | --- | --- | --- |"]
    for gpu in doc["gpus"]:
        lines.append(
            f"| {gpu['index']} | `{json.dumps(gpu['v3'])}` | `{json.dumps(gpu['v2'])}` | "
            f"`{json.dumps(gpu.get('gpuwatch'))}` | {mig_words(gpu['mig_mode_current_pending'])} |"
        )
    lines.append("")
    lines.append(
        f"- NVSwitches on the PCI bus: {doc['nvswitches']}; nv-fabricmanager running: {doc['fabric_manager_running']}"
    )
    ports = [f"{p['device']}/{p['port']} {'up' if p['up'] else 'down'} {p['link_layer']}" for p in doc["rdma_ports"]]
    lines.append(f"- RDMA ports: {len(ports)}{': ' + ', '.join(ports) if ports else ''}")
    return "\n".join(lines) + "\n"


def mig_words(mode: Any) -> str:
    """The MIG mode as issue #36 asks to see it: "reported disabled" (current and pending 0, NVML_DEVICE_MIG_DISABLE),
    else what NVML answered."""
    if isinstance(mode, (list, tuple)) and list(mode) == [0, 0]:
        return "reported disabled (0, 0)"
    return f"not reported disabled: {mode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    doc = read(args.dry_run)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    args.markdown.write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
