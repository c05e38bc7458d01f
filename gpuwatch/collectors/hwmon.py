"""The `hwmon` collector: the host's power delivery and sensors from hwmon sysfs, on a job of its own. Its
code is shared with its sibling in gpuwatch/collectors/host.py."""

from gpuwatch.collectors.host import check, collectors

__all__ = ["check", "collectors"]
