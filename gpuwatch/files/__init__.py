"""Files on disk: atomic writes and careful reads, the TOML reader, the state directory and its state files, the
sensor-map format, and where the shipped files are."""
