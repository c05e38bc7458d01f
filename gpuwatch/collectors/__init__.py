"""The registered collectors (gpuwatch/registry.py), one module each and named as registered, the protocol they
keep (base.py) and the sources they read (sources.py)."""
