#!/usr/bin/env bash
# Install gpuwatch as a hardened systemd service on this node (Debian, Ubuntu, RHEL and derivatives).
#
#   sudo bash deploy/install.sh                 # from a checkout: installs this checkout
#   curl -fsSL .../install.sh | sudo bash -s -- --source 'gpuwatch[nvidia]'   # from PyPI
#
# Idempotent: run it again to upgrade; it never overwrites /etc/gpuwatch/config.toml. What it does:
#   1. finds (or installs) Python >= 3.11 and creates the venv /opt/gpuwatch with gpuwatch and the vendor extras
#      that match the GPUs on the PCI bus (nvidia, amd);
#   2. creates the system user `gpuwatch` (in the video/render groups that own /dev/kfd and /dev/dri/*);
#   3. writes /etc/gpuwatch/config.toml (if absent), the unit /etc/systemd/system/gpuwatch.service and the drop-ins
#      this node needs (IPMI when /dev/ipmi0 exists, nvidia-uvm + gpuwatch-nvidia-uvm.service when nvidia-modprobe
#      exists);
#   4. systemctl daemon-reload, enable --now (restart on an upgrade).
# Options: --source SPEC (pip requirement or path; default: this checkout), --extras LIST (default: detected),
#   --root DIR (stage into DIR instead of /, for packaging and tests; implies --no-start --no-user),
#   --no-start (do not touch systemctl), --no-user (do not create the user), --python PATH,
#   --no-probe (NVIDIA: no CuPy probe engine, no nvidia-uvm oneshot), --probe-cuda 12|13 (default: 13 from driver
#   580, else 12; an unknown driver version gets 12), --dry-run (say what would be installed, change nothing).
# On NVIDIA nodes the probe engine is CuPy for the driver's CUDA (the `probe` extra = cupy-cuda12x, or cupy-cuda13x).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
root=""
source_spec=""
extras=""
start=1
make_user=1
python=""
prefix=/opt/gpuwatch
probe=1
probe_cuda=auto
dry_run=0

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --source) source_spec="$2"; shift 2 ;;
    --extras) extras="$2"; shift 2 ;;
    --root) root="$(mkdir -p "$2" && cd "$2" && pwd)"; start=0; make_user=0; shift 2 ;;
    --no-start) start=0; shift ;;
    --no-user) make_user=0; shift ;;
    --python) python="$2"; shift 2 ;;
    --no-probe) probe=0; shift ;;
    --probe-cuda) probe_cuda="$2"; shift 2; [[ "$probe_cuda" =~ ^(12|13|auto)$ ]] || die "--probe-cuda takes 12 or 13" ;;
    --dry-run) dry_run=1; start=0; make_user=0; shift ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[ -n "$root" ] || [ "$(id -u)" = 0 ] || die "run as root (sudo), or pass --root DIR to stage the files"
[ -f "$repo/systemd/gpuwatch.service" ] || die "systemd/gpuwatch.service not found beside this script; run it from a gpuwatch checkout"

# --- Python >= 3.11 ----------------------------------------------------------------------------------------------
python_ok() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
find_python() {
  for candidate in "$python" python3 python3.13 python3.12 python3.11; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate" && { command -v "$candidate"; return 0; }
  done
  return 1
}
if ! python="$(find_python)"; then
  [ -z "$root" ] || die "no Python >= 3.11 with venv found; pass --python PATH"
  say "installing Python >= 3.11"
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3 python3-venv >/dev/null
    find_python >/dev/null || apt-get install -y -qq python3.11 python3.11-venv >/dev/null  # Ubuntu 22.04
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3.11  # RHEL 8/9 ship 3.11 beside the system python
  else
    die "no apt-get or dnf: install Python >= 3.11 with venv, then pass --python PATH"
  fi
  python="$(find_python)" || die "Python >= 3.11 still not found after installing; pass --python PATH"
fi

# --- what this node has ------------------------------------------------------------------------------------------
if [ -z "$extras" ]; then
  list=()
  for dev in /sys/bus/pci/devices/*; do
    [ -r "$dev/class" ] || continue
    case "$(cat "$dev/class")" in 0x03*|0x12*) ;; *) continue ;; esac  # display or processing accelerator
    case "$(cat "$dev/vendor")" in
      0x10de) [[ " ${list[*]:-} " == *" nvidia "* ]] || list+=(nvidia) ;;
      0x1002) [[ " ${list[*]:-} " == *" amd "* ]] || list+=(amd) ;;
    esac
  done
  extras="$(IFS=,; echo "${list[*]:-}")"
fi
if [ -z "$source_spec" ]; then
  source_spec="$repo"
fi
# The probe's engine on NVIDIA nodes: CuPy built for the driver's CUDA major (CUDA 13 needs driver >= 580).
probe_requirement=""
if [ "$probe" = 1 ] && [[ ",$extras," == *",nvidia,"* ]] && [[ ",$extras," != *",probe,"* ]]; then
  version_file="$root/proc/driver/nvidia/version"
  driver="$(head -n1 "$version_file" 2>/dev/null | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1 || true)"
  if [ -z "$driver" ] && [ -z "$root" ] && command -v nvidia-smi >/dev/null 2>&1; then
    driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
  fi
  cuda="$probe_cuda"
  if [ "$cuda" = auto ]; then
    major="${driver%%.*}"
    if [ -z "$driver" ]; then cuda=12
    elif [ "$major" -ge 580 ]; then cuda=13
    elif [ "$major" -ge 525 ]; then cuda=12
    else cuda=""
    fi
  fi
  if [ -z "$cuda" ]; then
    say "WARNING: NVIDIA driver $driver is older than CUDA 12 (525): no probe engine installed, every probe will be" \
      "skipped_unsupported (install PyTorch for your CUDA into $prefix, or upgrade the driver)"
  elif [ "$cuda" = 12 ]; then
    extras="$extras,probe"  # pyproject: probe = ["cupy-cuda12x>=13"]
  else
    probe_requirement="cupy-cuda${cuda}x>=13"
  fi
  say "probe engine: cupy-cuda${cuda:-?}x (NVIDIA driver ${driver:-unknown, assuming CUDA 12}; --no-probe to skip)"
elif [ "$probe" = 0 ] && [[ ",$extras," == *",nvidia,"* ]]; then
  say "WARNING: --no-probe: no probe engine, every probe will be skipped_unsupported (set probe.interval_seconds = 0)"
fi
[ -n "$extras" ] && source_spec="${source_spec}[${extras}]"
if [ "$dry_run" = 1 ]; then
  say "would install into $prefix: $source_spec${probe_requirement:+ $probe_requirement}"
  exit 0
fi

# --- venv --------------------------------------------------------------------------------------------------------
venv="$root$prefix"
if [ ! -x "$venv/bin/python" ]; then
  say "creating $prefix with $python"
  "$python" -m venv "$venv"
fi
say "installing $source_spec into $prefix"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q --upgrade "$source_spec" ${probe_requirement:+"$probe_requirement"}
install -d -m 0755 "$venv/share/doc/gpuwatch"
install -m 0644 "$repo/README.md" "$venv/share/doc/gpuwatch/README.md"
install -m 0644 "$repo/systemd/README.md" "$venv/share/doc/gpuwatch/systemd.md"
install -m 0644 "$repo/deploy/config.example.toml" "$venv/share/doc/gpuwatch/config.example.toml"

# --- user --------------------------------------------------------------------------------------------------------
if [ "$make_user" = 1 ]; then
  if ! getent passwd gpuwatch >/dev/null; then
    say "creating system user gpuwatch"
    nologin="$(command -v nologin || echo /usr/sbin/nologin)"
    useradd --system --user-group --no-create-home --home-dir /var/lib/gpuwatch --shell "$nologin" gpuwatch
  fi
  for group in video render; do
    getent group "$group" >/dev/null && usermod -aG "$group" gpuwatch
  done
fi

# --- config, unit, drop-ins --------------------------------------------------------------------------------------
install -d -m 0755 "$root/etc/gpuwatch" "$root/etc/systemd/system/gpuwatch.service.d"
if [ ! -e "$root/etc/gpuwatch/config.toml" ]; then
  say "writing /etc/gpuwatch/config.toml (every key: $prefix/share/doc/gpuwatch/config.example.toml)"
  cat > "$root/etc/gpuwatch/config.toml" <<'TOML'
# gpuwatch configuration. Every key, its default and its meaning: /opt/gpuwatch/share/doc/gpuwatch/config.example.toml
# Apply a change with: systemctl reload gpuwatch (listen, web_config, backend and state_dir need a restart).
[agent]
listen = ":9845"
# web_config = "/etc/gpuwatch/web-config.yml"   # TLS and basic auth, exporter-toolkit format
TOML
  chmod 0644 "$root/etc/gpuwatch/config.toml"
fi
install -m 0644 "$repo/systemd/gpuwatch.service" "$root/etc/systemd/system/gpuwatch.service"
dropins="$root/etc/systemd/system/gpuwatch.service.d"
if [ -e "$root/dev/ipmi0" ] || { [ -z "$root" ] && [ -e /dev/ipmi0 ]; }; then
  install -m 0644 "$repo/systemd/drop-ins/ipmi.conf" "$dropins/ipmi.conf"
  install -d -m 0755 "$root/etc/udev/rules.d"
  echo 'KERNEL=="ipmi[0-9]*", GROUP="gpuwatch", MODE="0660"' > "$root/etc/udev/rules.d/60-gpuwatch-ipmi.rules"
  [ -z "$root" ] && command -v udevadm >/dev/null && udevadm trigger --subsystem-match=ipmi || true
fi
if [ "$probe" = 1 ] && { [ -x "$root/usr/bin/nvidia-modprobe" ] || { [ -z "$root" ] && [ -x /usr/bin/nvidia-modprobe ]; }; }; then
  # nvidia_uvm must be loaded before the agent's DeviceAllow=char-nvidia* is resolved: a oneshot unit outside its
  # sandbox does it (systemd/gpuwatch-nvidia-uvm.service), pulled in by the drop-in.
  install -m 0644 "$repo/systemd/gpuwatch-nvidia-uvm.service" "$root/etc/systemd/system/gpuwatch-nvidia-uvm.service"
  install -m 0644 "$repo/systemd/drop-ins/nvidia-uvm.conf" "$dropins/nvidia-uvm.conf"
fi

# --- start -------------------------------------------------------------------------------------------------------
if [ "$start" = 0 ]; then
  say "files in place under ${root:-/}; not starting (systemctl enable --now gpuwatch)"
  exit 0
fi
if [ ! -d /run/systemd/system ]; then
  say "systemd is not running here (a container?); start the agent with: $prefix/bin/gpuwatch run"
  exit 0
fi
systemctl daemon-reload
if systemctl is-active --quiet gpuwatch; then
  systemctl restart gpuwatch
else
  systemctl enable --now gpuwatch
fi
systemctl enable gpuwatch >/dev/null 2>&1
say "gpuwatch is running: curl -s http://127.0.0.1:9845/healthz; journalctl -u gpuwatch"
