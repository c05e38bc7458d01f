"""One odd byte in a name from the hardware must not cost a collector or the scrape: a non-UTF-8 BMC sensor name
(it disabled IPMI for good: UnicodeDecodeError every run) and a non-UTF-8 hwmon directory name (every /metrics a
500) come out with U+FFFD in their place."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from hostfixtures import add_chip

from gpuwatch.core.model import HostReadingValue, HostSample
from gpuwatch.exposition.cache import CachedExposition
from gpuwatch.readers.hwmon import HwmonReader
from gpuwatch.readers.ipmi import IpmiReader, LocalBmc
from gpuwatch.state.store import SampleStore

SENSOR = b"12V\xff\xfe | 12.100 | Volts | ok | na | 10.8 | 11.2 | 12.8 | 13.2 | na\n"


def test_a_non_utf8_bmc_sensor_name_keeps_ipmi_working(tmp_path: Path) -> None:
    tool = tmp_path / "ipmitool"
    tool.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write({SENSOR!r} if sys.argv[3:] == ['sensor'] else b'')\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    device = tmp_path / "ipmi0"
    device.write_text("")
    sample = IpmiReader(LocalBmc(str(tool), device), timeout_s=30).read()
    assert [v.sensor for v in sample.voltages] == ["12V\ufffd\ufffd"]


def test_a_non_utf8_hwmon_directory_name_gives_encodable_labels(tmp_path: Path) -> None:
    files = {"in0_input": 12000, "in0_label": "12V", "temp1_input": 40000}
    add_chip(tmp_path, 0, "devices/platform/nct6775.656", "nct6798", files)
    add_chip(tmp_path, "7\udcff", "devices/platform/nct6775.656", "nct6798", files)  # type: ignore[arg-type]
    sample = HwmonReader(tmp_path).read()
    labels = {r.chip for r in [*sample.voltages, *sample.temperatures]}
    assert len(labels) == 2
    for label in labels:
        label.encode("utf-8")  # what the exposition does; it raised UnicodeEncodeError
    assert any("\ufffd" in label for label in labels)


OPENMETRICS = "application/openmetrics-text;version=1.0.0"
ENCODINGS = ["", OPENMETRICS, OPENMETRICS + ";escaping=dots"]


@pytest.mark.parametrize("accept", ENCODINGS)
def test_one_unencodable_label_never_breaks_the_scrape(accept: str) -> None:
    """Every encoder (the fast lines; the library for a name escaping the fast path does not write) and name[]."""
    store = SampleStore(poll_interval_seconds=1.0)
    temperatures = (HostReadingValue("good", "t1", 40.0), HostReadingValue("bad\udcff", "t1", 41.0))
    store.record_host(HostSample("hwmon", store.snapshot().now, temperatures=temperatures), 5.0)
    cache = CachedExposition(store)
    for _, body in (cache.render(accept, False), cache.render_filtered(accept, {"gpuwatch_host_temperature_celsius"})):
        assert 'chip="bad\ufffd"'.encode() in body and b'chip="good"' in body
