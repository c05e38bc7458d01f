"""The in-memory state the collectors write and every page reads: the sample store and the probe's book."""
