"""One sysfs attribute read as the kernel serves it, for every reader of /sys (hwmon, RDMA ports)."""

from __future__ import annotations

import os
from pathlib import Path


def read_attribute(path: Path | str) -> str | None:
    """The file's first line, or None when it is missing, root-only, or the driver answers EIO/ENODATA.

    One os.read of the page sysfs serves (an attribute is at most a page: Documentation/filesystems/sysfs.rst)
    rather than a text file object: a hwmon read opens some 80 files, an 8-NIC RDMA read some 150, and the text
    layer was most of their CPU."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = data.splitlines()
    return lines[0].decode("utf-8", "replace").strip() if lines else ""
