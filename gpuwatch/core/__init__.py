"""The product's own facts, below everything: the data model, thresholds, XID catalogue and classes, exit codes,
the scenario names and the log-once latch. Imports nothing of gpuwatch but the version."""
