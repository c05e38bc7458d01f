"""Building blocks and one module per dashboard for dashboards/generate.py, the entry point.

Split by job so that each file stays small: `board` lays out panels with the SDK's builders, `promql` holds the
selectors, recording-rule names and joins every query shares, `utilization` the real-utilization rows that two
dashboards show, and `fleet`, `node` and `workloads` one dashboard each. Nothing outside dashboards/ imports this.
"""
