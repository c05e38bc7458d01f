"""The matmul probe: a short, periodic matrix multiply on idle GPUs, compared with each GPU's own baseline.

worker.py runs in a child process (the agent never imports an array library); runner.py is the policy (when, on
which GPUs, timeout, telemetry, locks); baseline.py keeps each GPU's healthy reference; gpuwatch/probebook.py (the state
layer) carries results from the runner through the store to the exporter.
"""
