#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs what the tests need (Debian's prometheus for promtool and the
# end-to-end tests, the Python dev extras into .venv), then runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# tests/test_slurm.py runs Slurm's daemons as root, so only root needs them (it skips otherwise, outside CI)
slurm_missing() {
  [ "$(id -u)" = 0 ] && { ! command -v slurmctld || ! command -v slurmd || ! command -v scontrol \
    || ! command -v munged; } >/dev/null 2>&1
}
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1 \
  || ! command -v chromium >/dev/null 2>&1 || ! command -v systemd-analyze >/dev/null 2>&1 \
  || ! command -v vmalert >/dev/null 2>&1 || slurm_missing; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # chromium: the status page test renders the agent's landing page headless
    # systemd: systemd-analyze verify/security check the shipped unit (no systemd as PID 1 needed)
    # victoria-metrics: victoria-metrics, vmagent, vmalert for tests/test_victoriametrics_e2e.py (the remote_write path)
    # slurmctld slurmd slurm-client munge: tests/test_slurm.py runs a one-node Slurm on loopback
    apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager chromium systemd \
      victoria-metrics slurmctld slurmd slurm-client munge >/dev/null
  else
    echo "scripts/test.sh: one of promtool, prometheus-alertmanager, chromium, systemd-analyze, vmalert is missing;" \
      "run: sudo apt-get install prometheus prometheus-alertmanager chromium systemd victoria-metrics" >&2
    exit 1
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
# The probe worker's real code runs on the CPU in CI: PyTorch's CPU build (this pin installs it from the local
# package mirror; an unpinned torch would download a multi-GB CUDA build). Not in the dev extra for that reason.
.venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
# The vendors' bindings the simulation also runs under, beside the installed ones (tests/bindings.py finds them):
# the oldest nvidia-ml-py pyproject allows and an amdsmi 6.x. Pure-Python wheels, unpacked, never installed.
for pinned in nvidia-ml-py==12.570.86 amdsmi==6.4.3; do
  target=".venv/bindings/${pinned/==/-}"
  if [ ! -d "$target" ]; then
    wheels=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "$pinned" >/dev/null
    .venv/bin/python -m zipfile -e "$wheels"/*.whl "$target.partial" && mv "$target.partial" "$target"
    rm -rf "$wheels"
  fi
done
exec .venv/bin/python -m pytest -q "$@"
