"""The matmul probe: a short, periodic matrix multiply on idle GPUs, compared with each GPU's own baseline.

worker.py runs in a child process (the agent never imports an array library); launch.py says what that child is and
whether it can run here (the composition layer may give another launcher, as the simulated node does); runner.py is
the policy (when, on which GPUs, locks); supervisor.py starts, watches and kills the children (timeout, memory,
telemetry); conclude.py makes each child's output a result; baseline.py keeps each GPU's healthy reference;
gpuwatch/state/probebook.py (the state layer) carries results from the runner through the store to the exporter.
"""
