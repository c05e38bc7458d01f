"""``import amdsmi`` on a simulated node: AMD's own package (a release of our choice) over a simulated libamd_smi.so.

    amdsmi = simulated_amdsmi(SimulatedNode("overheating", vendor="amd"), binding="6.4.3")
    amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS); h = amdsmi.amdsmi_get_processor_handles()[2]
    amdsmi.amdsmi_get_temp_metric(h, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT)

Everything above the C functions is the vendor's code, so what differs between releases (6.4's power_info_v2 and
raw event handles, 7.0's socket_power) differs here by construction. Without the library (the ``backend_down``
scenario, or a node of another vendor) the import fails as on a host without ROCm: KeyError('libamd_smi.so').
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from gpuwatch.simulated.amdsmi_binding import (
    LIBRARY_NAME,
    binding_package,
    bound_symbols,
    import_amdsmi,
    package_version,
)
from gpuwatch.simulated.amdsmi_clib import SimulatedLibAmdSmi
from gpuwatch.simulated.scenarios import SimulatedNode

INSTALLED = "7.0.2"  # the release the dev extra installs
BINDINGS: tuple[str, ...] = (INSTALLED, "6.4.3")  # releases the tests run the backend over
_LIB_VERSION = {"7": (25, 5, 1), "6": (25, 3, 0)}  # libamd_smi.so of ROCm 7.0.2 / 6.4.3 (major.minor.release)


def simulated_amdsmi(
    node: SimulatedNode,
    *,
    binding: str | Path | None = None,
    partition: str = "SPX",
    latency_scale: float = 0.0,
) -> ModuleType:
    """A fresh ``amdsmi`` package over this node's libamd_smi.so.

    ``binding``: a release ("6.4.3": <venv>/bindings/amdsmi-6.4.3), a package directory, or None for the
    installed package. ``partition``: the compute partition mode of every socket. ``latency_scale``: the share of
    violation status's real ~100 ms it sleeps.
    """
    package = binding if isinstance(binding, Path) else binding_package(binding)
    version = package_version(package)
    library = SimulatedLibAmdSmi(
        node,
        bound_symbols(package),
        partition=partition,
        latency_scale=latency_scale,
        lib_version=_LIB_VERSION.get(version.split(".")[0], _LIB_VERSION["7"]),
    )

    def load() -> SimulatedLibAmdSmi:
        if node.library_missing or node.vendor != "amd":
            raise OSError(f"{LIBRARY_NAME}: cannot open shared object file: No such file or directory")
        return library

    module = import_amdsmi(package, load)
    library.attach(module.amdsmi_wrapper)
    return module


def library_of(amdsmi: ModuleType) -> SimulatedLibAmdSmi:
    """The simulated libamd_smi.so under a package from simulated_amdsmi (where its own wrapper keeps it)."""
    library = amdsmi.amdsmi_wrapper._libraries[LIBRARY_NAME]
    assert isinstance(library, SimulatedLibAmdSmi)
    return library
