"""What `gpuwatch snapshot` says about the host sources: rails, supplies, temperatures, fans (`gpuwatch check`'s
lines are the host collectors' own: gpuwatch/collectors/host.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gpuwatch.collectors.sources import HostSource
from gpuwatch.core.model import HostSample
from gpuwatch.readers.ipmi import INACCESSIBLE, IpmiError


def read_host(sources: Sequence[HostSource]) -> tuple[list[HostSample], dict[str, str]]:
    """One read of every usable host source; a source that is absent is no problem unless it is required."""
    samples: list[HostSample] = []
    problems: dict[str, str] = {}
    for source in sources:
        found, detail = source.usable()
        if not found:
            if source.required or detail.startswith(INACCESSIBLE):  # absent is fine; present but unopenable is not
                problems[source.name] = detail
            continue
        try:
            samples.append(source.reader.read())
        except (IpmiError, OSError) as exc:
            problems[source.name] = str(exc)
    return samples, problems


def host_json(samples: Sequence[HostSample]) -> dict[str, Any]:
    out: dict[str, Any] = {"voltages": [], "psus": [], "psu_power": [], "temperatures": [], "fans": []}
    for sample in samples:
        for key in out:
            out[key].extend({"source": sample.source, **dataclasses.asdict(item)} for item in getattr(sample, key))
    out["psu_redundancy_lost"] = _redundancy_lost(samples)
    return out


def _redundancy_lost(samples: Sequence[HostSample]) -> bool | None:
    verdicts = [s.psu_redundancy_lost for s in samples if s.psu_redundancy_lost is not None]
    return any(verdicts) if verdicts else None


def print_host_table(samples: Sequence[HostSample], problems: dict[str, str]) -> None:
    for name, message in problems.items():
        print(f"{name}: unavailable: {message}")
    voltages = [v for s in samples for v in s.voltages]
    psus = [p for s in samples for p in s.psus]
    temps = [t for s in samples for t in s.temperatures]
    fans = [f for s in samples for f in s.fans]
    if not (voltages or psus or temps or fans):
        print("host sensors: none" + ("" if problems else " (no hwmon chips, no BMC)"))
        return
    if voltages:
        print(f"{'rail':<40} {'V':>8} {'nominal':>8} {'min':>8}  state")
        for v in voltages:
            # by magnitude, like HostPsuRailUndervoltage: -10.7 V is under a -12 V rail's -10.8 V, -11.3 V is not
            low = v.min_volts is not None and abs(v.volts) < abs(v.min_volts)
            raised = [limit for limit, flag in v.alarms if flag]
            state = "BELOW MIN" if low else (f"ALARM ({', '.join(raised)})" if raised else "ok")
            print(
                f"{(v.chip + ' ' + v.sensor)[:40]:<40} {v.volts:>8.3f} {_num(v.nominal_volts):>8} "
                f"{_num(v.min_volts):>8}  {state}"
            )
    for p in psus:
        print(f"power supply {p.psu}: {'ok' if p.up else 'DOWN'} ({p.states or '-'})")
    power = [w for s in samples for w in s.psu_power]
    if power:
        print("power supply load: " + ", ".join(f"{w.psu} {w.watts:.0f} W" for w in power))
    lost = _redundancy_lost(samples)
    if lost is not None:
        print(f"power supply redundancy: {'LOST' if lost else 'ok'}")
    if temps:
        print("temperatures: " + ", ".join(f"{t.chip} {t.sensor} {t.value:.1f}°C" for t in temps))
    if fans:
        print("fans: " + ", ".join(f"{f.chip} {f.sensor} {f.value:.0f} RPM" for f in fans))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
