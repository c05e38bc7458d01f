"""The agent's configuration: its sections, loading and validation (every problem named with its key)."""
