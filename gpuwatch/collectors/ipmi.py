"""The `ipmi` collector: the BMC's power supplies and sensors through ipmitool, on a job of its own. Its
code is shared with its sibling in gpuwatch/collectors/host.py."""

from gpuwatch.collectors.host import check, collectors

__all__ = ["check", "collectors"]
