"""The `amdsmi` collector: every AMD GPU through AMD SMI (ROCm's amdsmi), read on the agent's poll job. Its
code is shared with its sibling in gpuwatch/collectors/vendors.py."""

from gpuwatch.collectors.vendors import check, collectors

__all__ = ["check", "collectors"]
