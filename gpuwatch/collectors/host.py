"""The host collectors `hwmon` and `ipmi`: which readers the node gets, their schedules, and their runs.

Each runs as its own scheduler job, never on the scrape path: hwmon every few seconds (cheap sysfs reads, but the
drivers refresh their registers only every 1-2 s, so polling faster reads the same values), the BMC every minute
(`ipmitool sensor` can take seconds on a busy BMC). A machine without hwmon or a BMC (VMs, cloud nodes) gets a
successful run with no series; only `host.ipmi = "on"` makes a missing BMC an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every, collector_logger
from gpuwatch.collectors.sources import HostSource, NodeSources
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import HostSample
from gpuwatch.files.sensormap import load_sensor_maps
from gpuwatch.readers.hwmon import HwmonReader
from gpuwatch.readers.ipmi import INACCESSIBLE, IpmiError, IpmiReader, LocalBmc

if TYPE_CHECKING:
    from gpuwatch.config.settings import Config
    from gpuwatch.state.store import SampleStore


PSU_STATE_FILE = "host_psus.json"


def hwmon_usable(reader: HwmonReader) -> Callable[[], tuple[bool, str]]:
    def usable() -> tuple[bool, str]:
        chips = reader.chips()
        if not chips:
            return False, f"no hwmon chips under {reader.hwmon_dir} (usual in VMs and cloud instances)"
        return True, ", ".join(c.label + (" (unmapped Super-I/O)" if _unmapped(reader, c) else "") for c in chips)

    return usable


def _unmapped(reader: HwmonReader, chip: Any) -> bool:
    from gpuwatch.files.sensormap import has_mapping

    return bool(chip.super_io) and not has_mapping(reader.maps, chip.label, reader.board_name())


def build_host_sources(config: Config, *, clock: Callable[[], float] = time.time) -> list[HostSource]:
    """The host collectors of a real node, from the [host] section; disabled collectors are left out."""
    host = config.host
    disabled = config.agent.disable_collectors
    sources: list[HostSource] = []
    if "hwmon" not in disabled:
        reader = HwmonReader(Path(host.sysfs_root), load_sensor_maps(host.sensor_maps), clock=clock)
        sources.append(HostSource("hwmon", reader, host.hwmon_interval_seconds, hwmon_usable(reader)))
    if "ipmi" not in disabled and host.ipmi != "off":
        ipmi = IpmiReader(
            LocalBmc(host.ipmitool, Path(host.ipmi_device)),
            timeout_s=host.ipmi_timeout_seconds,
            state_path=config.state_dir / PSU_STATE_FILE,
            clock=clock,
        )
        sources.append(HostSource("ipmi", ipmi, host.ipmi_interval_seconds, ipmi.usable, required=host.ipmi == "on"))
    return sources


class HostCollector:
    """The `hwmon` or `ipmi` collector: one host source on its own scheduler job, isolated like the GPU backends."""

    def __init__(self, source: HostSource, store: SampleStore, *, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self._store = store
        self._clock = clock
        # A problem is said once, a different one too (timeouts, then the device gone), and once when it clears.
        self._log = collector_logger(source.name)
        self._problem = Latch(self._log, repeat_when_changed=True)
        self.schedule = Every(f"host-{source.name}")

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def interval_seconds(self) -> float:
        return self.source.interval_seconds

    def update(self) -> bool:
        return self._run(self.source)

    def _run(self, source: HostSource) -> bool:
        try:
            found, detail = source.usable()
            if not found:
                self._say(source, f"{source.name}: {detail}" + ("" if source.required else "; nothing to export"))
                self._store.record_host(HostSample(source.name, self._clock()), source.interval_seconds)
                return not source.required
            sample = source.reader.read()
        except IpmiError as exc:
            self._say(source, f"{source.name} read failed: {exc}")
            return False
        except Exception:
            self._log.exception("%s read failed unexpectedly", source.name)
            return False
        self._say(source, "")
        self._store.record_host(sample, source.interval_seconds)
        return True

    def _say(self, source: HostSource, message: str) -> None:
        """Log a source's problem ("" when there is none) once, and once when it clears, not at every run."""
        if message:
            self._problem.fail("%s", message)
        else:
            self._problem.recover("%s reads again", source.name)


def collectors(context: CollectorContext, name: str) -> list[HostCollector]:
    return [HostCollector(s, context.store, clock=context.clock) for s in context.sources.host if s.name == name]


_FIXES = {
    "hwmon": "give the agent's user read access to /sys/class/hwmon (docs/host-power.md), or --disable-collector hwmon",
    "ipmi": "give the agent's user the BMC device (the unit's ipmi.conf drop-in, docs/host-power.md), or set "
    'host.ipmi = "off"',
}


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`'s line for the hwmon or ipmi collector."""
    source = next((s for s in sources.host if s.name == name), None)
    if source is None:  # disabled collectors are said by the registry; this is host.ipmi = "off"
        return [CheckLine("ok", f"host {name}", 'off (host.ipmi = "off")')]
    return [check_source(source)]


def check_source(source: HostSource) -> CheckLine:
    """Found: ok. Absent (VMs, cloud nodes): ok, nothing to export, unless required. Present but not openable by this
    user: a deployment problem (warn; FAIL when required)."""
    found, detail = source.usable()
    what, fix = f"host {source.name}", _FIXES[source.name]
    if found:
        return CheckLine("ok", what, f"{detail} (every {source.interval_seconds:g} s)")
    if detail.startswith(INACCESSIBLE):
        return CheckLine("FAIL" if source.required else "warn", what, detail, fix)
    if source.required:
        return CheckLine("FAIL", what, detail, fix)
    return CheckLine("ok", what, f"{detail}; nothing to export, not an error")
