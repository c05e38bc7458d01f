"""gpuwatch: a GPU fleet health agent that serves NVML / AMD SMI readings and probe results to Prometheus."""

__version__ = "0.1.0"
