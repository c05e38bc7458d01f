"""The `gpuwatch` command: its parser and each subcommand."""
