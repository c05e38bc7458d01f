"""The agent as a service: building this node's sources, scheduling the collectors, start, stop, reload,
health and systemd's notify protocol."""
