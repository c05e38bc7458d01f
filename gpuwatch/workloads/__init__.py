"""Whose job runs on a GPU: the workload a compute process belongs to (Slurm job, Kubernetes pod, container, systemd
unit or the process itself), read from /proc/PID/cgroup, and its user. See docs/workloads.md."""
