#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels that the GPU machine lacks into .whl/ (git-ignored), for its
# Python 3.12 on x86-64. device-run.sh installs them there into /tmp/site.
#
#   bash benchmarks/hardware/fetch-wheels.sh          # from the repository root
#
# What the GPU machine already has (torch, cupy, nvidia-ml-py, prometheus-client, psutil, PyYAML) is not fetched,
# except nvidia-ml-py, pinned so gpuwatch and nvitop-exporter read NVML through the same, tested version
# (nvitop 1.7.2 needs nvidia-ml-py < 13.616).
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"
rm -rf .whl && mkdir .whl

wheels=(
  # gpuwatch's own dependencies that the machine does not have
  APScheduler==3.11.3 tzlocal==5.4.5 bcrypt==5.0.0
  nvidia-ml-py==13.615.71
  # the peer measured beside gpuwatch (issues #2 and #9)
  nvitop==1.7.2 nvitop-exporter==1.7.2
)
platforms=()
# glibc 2.28 at most (what PyTorch's CUDA wheels need), so nothing refuses to install on an older machine.
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${wheels[@]}"
ls -1 .whl
du -sh .whl
