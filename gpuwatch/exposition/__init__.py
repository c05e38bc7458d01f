"""The /metrics exposition: the metric catalogue, the families of a store snapshot, the fast text renderer,
the render cache and dcgm-exporter's names ([compat] dcgm)."""
