"""The `nvml` collector: every NVIDIA GPU through NVML (NVIDIA's nvidia-ml-py), read on the agent's poll job. Its
code is shared with its sibling in gpuwatch/collectors/vendors.py."""

from gpuwatch.collectors.vendors import check, collectors

__all__ = ["check", "collectors"]
