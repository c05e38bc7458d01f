"""The agent's configuration: frozen dataclasses loaded from TOML, overridden by command-line flags.

Every problem is a ConfigError that names the file, the key and what is wrong (exit 78): unknown sections and keys
are errors, because a misspelt key silently ignored is a setting the operator believes in and does not have.

The sections here are the agent's and those the layers below the collectors share. A registered collector's own
section is declared in its module (SETTINGS) and loaded with these by gpuwatch/collectors/configuration.py; code
reads it with `config.section(TheSection)`.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints

from gpuwatch.core.model import ProbeDtype, ProbeEngineChoice, Vendor
from gpuwatch.core.scenario_catalogue import SCENARIOS
from gpuwatch.files.tomlfile import TomlFileError, load_toml_file
from gpuwatch.registry import COLLECTORS

DEFAULT_CONFIG_PATH = Path("/etc/gpuwatch/config.toml")
DEFAULT_PORT = 9845
# The closed choices: a field typed with one of these Literals accepts exactly its values (checked by _coerce, which
# names them in its error, and by mypy in the code that reads them); the tuples feed argparse's choices.
Backend = Literal["auto", "nvml", "amdsmi", "simulated"]
LogLevel = Literal["debug", "info", "warning", "error"]
IpmiMode = Literal["auto", "on", "off"]  # auto: when ipmitool and the BMC device are usable; on: required; off
BACKENDS: tuple[Backend, ...] = get_args(Backend)
VENDORS: tuple[Vendor, ...] = get_args(Vendor)
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)


class ConfigError(Exception):
    """An invalid configuration; the message names the file (or the flag), the key and the problem — every problem
    found, not only the first (`more`); `source`, `key` and `problem` are the first one's."""

    def __init__(
        self, source: str, key: str, problem: str, *, flag: str = "", more: tuple[ConfigError, ...] = ()
    ) -> None:
        self.source, self.key, self.problem, self.flag = source, key, problem, flag
        self.problems: tuple[ConfigError, ...] = (self, *more)
        where = flag or key
        line = f"{source}: {where}: {problem}" if where else f"{source}: {problem}"
        super().__init__("\n  ".join([line, *(str(e) for e in more)]))  # a line per problem


# The flag that sets a key, so a bad flag is blamed on the flag, never on the file or the defaults.
FLAGS = {
    "agent.listen": "--listen",
    "agent.web_config": "--web-config",
    "agent.backend": "--backend",
    "agent.log_level": "--log-level",
    "agent.poll_interval_seconds": "--poll-interval",
    "agent.state_dir": "--state-dir",
    "agent.disable_collectors": "--disable-collector",
    "simulated.scenario": "--scenario",
    "simulated.vendor": "--vendor",
    "simulated.gpus": "--gpus",
    "probe.interval_seconds": "--probe-interval",
}


class _Problems:
    """Every problem of one load, each blamed on the flag that set its key where a flag did."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.flags: dict[str, str] = {}  # key -> the flag that set it ("" for an override no flag names)
        self.found: list[ConfigError] = []

    def add(self, key: str, problem: str, source: str | None = None) -> None:
        flag = self.flags.get(key)
        source = "command line" if flag is not None else source or self.source
        self.found.append(ConfigError(source, key, problem, flag=flag or ""))

    def catch(self, error: ConfigError) -> None:
        self.add(error.key, error.problem, error.source)

    def raise_any(self) -> None:
        if self.found:
            first, *rest = self.found
            raise ConfigError(first.source, first.key, first.problem, flag=first.flag, more=tuple(rest))


@dataclass(frozen=True, slots=True)
class AgentSection:
    listen: str = f":{DEFAULT_PORT}"
    web_config: str = ""
    backend: Backend = "auto"
    poll_interval_seconds: float = 1.0
    slow_poll_interval_seconds: float = 30.0
    state_dir: str = ""  # empty: $STATE_DIRECTORY, else /var/lib/gpuwatch
    log_level: LogLevel = "info"
    disable_collectors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SimulatedSection:
    scenario: str = "mixed"
    vendor: Vendor = "nvidia"
    gpus: int = 8
    boot: int = 0  # which boot of the simulated node: another number is a reboot (its boot id changes)


@dataclass(frozen=True, slots=True)
class GpusSection:
    expected_nvidia: int | None = None  # None: count the vendor's GPUs on the PCI bus
    expected_amd: int | None = None
    power_limit_watts: float | None = None  # the limit the operator intends for this node's GPUs


@dataclass(frozen=True, slots=True)
class XidSection:
    kernel_log: str = "/dev/kmsg"  # empty string turns kernel-log XIDs off


@dataclass(frozen=True, slots=True)
class HostSection:
    """Host power delivery and sensors (gpuwatch/readers/hwmon.py, ipmi.py; the collectors hwmon and ipmi)."""

    sysfs_root: str = "/sys"
    sensor_maps: tuple[str, ...] = ()  # Super-I/O mapping files (deploy/sensor-maps/)
    hwmon_interval_seconds: float = 5.0
    ipmi: IpmiMode = "auto"
    ipmitool: str = "ipmitool"
    ipmi_device: str = "/dev/ipmi0"
    ipmi_interval_seconds: float = 60.0
    ipmi_timeout_seconds: float = 20.0


@dataclass(frozen=True, slots=True)
class ProbeSection:
    """The matmul probe (gpuwatch/probe/): when it runs and what it measures."""

    interval_seconds: float = 900.0  # 0 turns the probe off
    timeout_seconds: float = 60.0
    engine: ProbeEngineChoice = "auto"  # auto: CuPy when installed, else PyTorch
    dtype: ProbeDtype = "bf16"
    matrix_size: int = 8192
    warmup_min_seconds: float = 0.5
    warmup_max_seconds: float = 1.5
    measure_seconds: float = 1.0
    copy_mib: int = 256
    require_idle_node: bool = True
    idle_utilization_ratio: float = 0.1


@dataclass(frozen=True, slots=True)
class LedgerSection:
    """The fault ledger (gpuwatch/state/ledger.py): faults held until repaired, and when one escalates."""

    escalate_after: int = 2  # a fault that returns this many times takes the next action up the ladder


@dataclass(frozen=True, slots=True)
class CompatSection:
    """Other exporters' names beside gpuwatch's own (docs/migrating-from-dcgm-exporter.md)."""

    dcgm: bool = False  # also export dcgm-exporter's DCGM_FI_* names and labels
    dcgm_hostname: str = ""  # the Hostname label; empty: $NODE_NAME, else the machine's name (as dcgm-exporter)
    dcgm_hostname_label: str = "Hostname"  # dcgm-exporter's main after 4.5.3-4.8.2 says "hostname"; "" omits it


class CollectorSection(Protocol):
    """A registered collector's own section (its module's SETTINGS), a frozen dataclass with a default for every
    field: `[<SECTION>]` in the file. `problems` says what is wrong beyond the field types, as (key in the section,
    problem), so one load reports every problem of every section together."""

    SECTION: ClassVar[str]

    def problems(self) -> Iterable[tuple[str, str]]: ...


S = TypeVar("S", bound=CollectorSection)


@dataclass(frozen=True, slots=True)
class Config:
    agent: AgentSection = field(default_factory=AgentSection)
    simulated: SimulatedSection = field(default_factory=SimulatedSection)
    gpus: GpusSection = field(default_factory=GpusSection)
    xid: XidSection = field(default_factory=XidSection)
    host: HostSection = field(default_factory=HostSection)
    probe: ProbeSection = field(default_factory=ProbeSection)
    ledger: LedgerSection = field(default_factory=LedgerSection)
    compat: CompatSection = field(default_factory=CompatSection)
    collectors: Mapping[str, Any] = field(default_factory=dict)  # SECTION -> a registered collector's section
    source: str = "defaults"

    def section(self, cls: type[S]) -> S:
        """A registered collector's section as loaded, else its defaults (a Config built without it)."""
        found = self.collectors.get(cls.SECTION)
        return found if isinstance(found, cls) else cls()

    @property
    def state_dir(self) -> Path:
        if self.agent.state_dir:
            return Path(self.agent.state_dir)
        return Path(os.environ.get("STATE_DIRECTORY", "/var/lib/gpuwatch").split(":")[0])

    def expected_gpus(self, vendor: str) -> int | None:
        return self.gpus.expected_nvidia if vendor == "nvidia" else self.gpus.expected_amd


_SECTIONS: dict[str, type[Any]] = {
    "agent": AgentSection,
    "simulated": SimulatedSection,
    "gpus": GpusSection,
    "xid": XidSection,
    "host": HostSection,
    "probe": ProbeSection,
    "ledger": LedgerSection,
    "compat": CompatSection,
}


def load_settings(
    path: Path | None,
    overrides: dict[str, dict[str, Any]] | None = None,
    collector_sections: Iterable[type[CollectorSection]] = (),
) -> Config:
    """Read the TOML file (None: defaults only), apply flag overrides, validate everything: this layer's sections
    and the registered collectors' (`collector_sections`; gpuwatch/collectors/configuration.py passes them)."""
    own = {cls.SECTION: cls for cls in collector_sections}
    known: dict[str, type[Any]] = {**_SECTIONS, **own}
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = load_toml_file(path)  # regular files only, size-capped, never blocks (gpuwatch.files.tomlfile)
        except FileNotFoundError:
            raise ConfigError(source, "", "file not found; create it or pass --config with an existing file") from None
        except TomlFileError as exc:
            raise ConfigError(source, "", str(exc)) from None
    problems = _Problems(source)
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in known:
            problems.add(f"[{name}]", _unknown("section", name, known))
        elif not isinstance(value, dict):
            problems.add(name, f"must be a [{name}] table, got {type(value).__name__}")
        else:
            sections[name] = _build_section(source, name, known[name], value, problems)
    for name, values in (overrides or {}).items():
        problems.flags.update({f"{name}.{key}": FLAGS.get(f"{name}.{key}", "") for key in values})
        current = sections.get(name, known[name]())
        given = _build_section("command line", name, known[name], values, problems)
        sections[name] = dataclasses.replace(current, **{k: getattr(given, k) for k in values if hasattr(given, k)})
    collectors = {name: sections.pop(name, cls()) for name, cls in own.items()}
    config = Config(**sections, collectors=collectors, source=source)
    _validate(config, problems)
    for name, section in collectors.items():
        for key, problem in section.problems():
            problems.add(f"{name}.{key}", problem)
    problems.raise_any()
    return config


def _unknown(kind: str, name: str, known: Any) -> str:
    import difflib  # only for a mistake: not loaded by every agent (0.2 MiB)

    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {kind}{hint}"


def _build_section(source: str, section: str, cls: type[Any], values: dict[str, Any], problems: _Problems) -> Any:
    hints = {f.name: hint for f in dataclasses.fields(cls) if (hint := get_type_hints(cls).get(f.name)) is not None}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            problems.add(f"{section}.{key}", _unknown("key", key, hints), source)
            continue
        try:
            kwargs[key] = _coerce(source, f"{section}.{key}", hints[key], value)
        except ConfigError as exc:
            problems.catch(exc)
    return cls(**kwargs)


def _coerce(source: str, key: str, hint: Any, value: Any) -> Any:
    """Check a TOML value against the field's type; ints are accepted where floats are expected."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        (hint,) = [arg for arg in args if arg is not type(None)]
        return _coerce(source, key, hint, value)
    if value is None:
        raise ConfigError(source, key, "must be set")
    if origin is Literal:
        if not isinstance(value, str) or value not in args:
            raise ConfigError(source, key, f"must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise ConfigError(source, key, "must be a list of strings")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"must be true or false, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, key, f"must be a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # TOML integers may exceed what a float holds
            raise ConfigError(source, key, "must be a number within range, got a huge integer") from None
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"must be a whole number, got {value!r}")
        return value
    if hint is not str:
        raise TypeError(f"{key}: no check for fields of type {hint!r}")  # a new field type needs a branch here
    if not isinstance(value, str):
        raise ConfigError(source, key, f"must be a string, got {value!r}")
    return value


def _validate(config: Config, problems: _Problems) -> None:
    agent = config.agent

    def check(ok: bool, key: str, problem: str) -> None:
        if not ok:
            problems.add(key, problem)

    check(
        0.05 <= agent.poll_interval_seconds <= 3600,
        "agent.poll_interval_seconds",
        "must be between 0.05 and 3600 seconds",
    )
    check(
        agent.poll_interval_seconds <= agent.slow_poll_interval_seconds <= 86400,
        "agent.slow_poll_interval_seconds",
        "must be at least the poll interval and at most a day",
    )
    for name in agent.disable_collectors:
        check(
            name in COLLECTORS, "agent.disable_collectors", f"{name!r} is no collector; known: {', '.join(COLLECTORS)}"
        )
    try:
        parse_listen(agent.listen)
    except ValueError as exc:
        check(False, "agent.listen", str(exc))
    sim = config.simulated
    check(sim.scenario in SCENARIOS, "simulated.scenario", f"must be one of {', '.join(SCENARIOS)}")
    check(
        not (sim.scenario == "mig" and sim.vendor == "amd"),
        "simulated.scenario",
        "'mig' splits an NVIDIA GPU with MIG: run it with the vendor nvidia (--vendor nvidia)",
    )
    check(1 <= sim.gpus <= 64, "simulated.gpus", "must be between 1 and 64")
    check(0 <= sim.boot <= 1_000_000, "simulated.boot", "must be between 0 and 1000000")
    check(
        1 <= config.ledger.escalate_after <= 100,
        "ledger.escalate_after",
        "must be between 1 and 100 (returns of a fault before it escalates)",
    )
    gpus = config.gpus
    for key, value in (("gpus.expected_nvidia", gpus.expected_nvidia), ("gpus.expected_amd", gpus.expected_amd)):
        check(value is None or 0 <= value <= 1024, key, "must be between 0 and 1024")
    check(
        gpus.power_limit_watts is None or 1 <= gpus.power_limit_watts <= 10000,
        "gpus.power_limit_watts",
        "must be between 1 and 10000 watts",
    )
    _validate_probe(config.probe, check)
    _validate_host(config, check)
    _validate_compat(config.compat, check)


DCGM_HOSTNAME_LABELS = ("Hostname", "hostname", "")


def _validate_compat(compat: CompatSection, check: Any) -> None:
    check(
        compat.dcgm_hostname_label in DCGM_HOSTNAME_LABELS,
        "compat.dcgm_hostname_label",
        f'must be "Hostname" (dcgm-exporter up to 4.5.3-4.8.2), "hostname" (its later releases) or "" (no '
        f"host label, as dcgm-exporter --no-hostname), got {compat.dcgm_hostname_label!r}",
    )
    check(
        len(compat.dcgm_hostname) <= 253 and compat.dcgm_hostname.isprintable(),
        "compat.dcgm_hostname",
        "must be a host name of at most 253 printable characters, or empty for $NODE_NAME, else the machine's name",
    )
    custom = compat.dcgm_hostname != "" or compat.dcgm_hostname_label != "Hostname"
    check(
        compat.dcgm or not custom,
        "compat.dcgm",
        "is false, so dcgm_hostname and dcgm_hostname_label have no effect: set dcgm = true, or remove them",
    )


def _validate_host(config: Config, check: Any) -> None:
    from gpuwatch.files.sensormap import SensorMapError, load_sensor_maps

    host = config.host
    check(
        0.5 <= host.hwmon_interval_seconds <= 3600,
        "host.hwmon_interval_seconds",
        "must be between 0.5 and 3600 seconds",
    )
    check(5 <= host.ipmi_interval_seconds <= 3600, "host.ipmi_interval_seconds", "must be between 5 and 3600 seconds")
    check(
        1 <= host.ipmi_timeout_seconds < host.ipmi_interval_seconds,
        "host.ipmi_timeout_seconds",
        "must be at least 1 s and below host.ipmi_interval_seconds",
    )
    try:
        load_sensor_maps(host.sensor_maps)
    except SensorMapError as exc:
        check(False, "host.sensor_maps", str(exc))


def _validate_probe(probe: ProbeSection, check: Any) -> None:
    check(
        probe.interval_seconds == 0 or 1 <= probe.interval_seconds <= 7 * 86400,
        "probe.interval_seconds",
        "must be 0 (off) or between 1 second and a week",
    )
    check(1 <= probe.timeout_seconds <= 3600, "probe.timeout_seconds", "must be between 1 and 3600 seconds")
    check(16 <= probe.matrix_size <= 65536, "probe.matrix_size", "must be between 16 and 65536")
    check(0 <= probe.warmup_min_seconds <= 60, "probe.warmup_min_seconds", "must be between 0 and 60 seconds")
    check(
        probe.warmup_min_seconds <= probe.warmup_max_seconds <= 120,
        "probe.warmup_max_seconds",
        "must be at least probe.warmup_min_seconds and at most 120 seconds",
    )
    check(0.01 <= probe.measure_seconds <= 60, "probe.measure_seconds", "must be between 0.01 and 60 seconds")
    check(0 <= probe.copy_mib <= 16384, "probe.copy_mib", "must be between 0 (no copies) and 16384 MiB")
    check(0 <= probe.idle_utilization_ratio <= 1, "probe.idle_utilization_ratio", "must be a share between 0 and 1")
    busy = probe.warmup_max_seconds + probe.measure_seconds
    check(
        probe.timeout_seconds > busy,
        "probe.timeout_seconds",
        f"must exceed warmup_max_seconds + measure_seconds ({busy:g} s) plus the engine's start-up",
    )


def parse_listen(listen: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` / ``:PORT`` / ``[v6]:PORT`` the way Prometheus exporters take --web.listen-address."""
    host, sep, port_text = listen.rpartition(":")
    if not sep:
        raise ValueError(f"{listen!r} is not HOST:PORT (e.g. ':9845' or '127.0.0.1:9845')")
    host = host.strip("[]")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} in {listen!r} must be a number from 0 to 65535")
    return host, int(port_text)
