"""The simulated libnvidia-ml's one exception: inside the library, a C function's nvmlReturn_t to answer."""

from __future__ import annotations


class NvmlFailure(Exception):
    """Inside the library: return this nvmlReturn_t from the C function."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
