#!/usr/bin/env bash
# Install gpuwatch as a hardened systemd service on this node (Debian, Ubuntu, RHEL and derivatives), or remove it.
#
#   sudo bash deploy/install.sh                       # from a checkout or an unpacked sdist: installs that tree
#   curl -fsSL "$INSTALL_SH_URL" | sudo bash -s -- --extras nvidia
#                                                     # alone (piped from wherever you host this file, or a lone
#                                                     # copy): gpuwatch-agent from PyPI
#   sudo bash deploy/install.sh --uninstall [--purge] # remove it (see below)
#
# Alone, the script installs the distribution gpuwatch-agent from PyPI (PyPI's "gpuwatch" is another project) and
# takes the unit, the drop-ins and the example config from the installed package (gpuwatch/_shipped/). From a tree
# it installs that tree (not editable) and takes them from the same place, so both ways install the same files.
# Packaging for a distribution: build the Debian package instead (bash scripts/build-deb.sh).
#
# Idempotent: run it again to upgrade; it never overwrites /etc/gpuwatch/config.toml. What it does:
#   1. finds (or installs) Python >= 3.11 and creates the venv /opt/gpuwatch with gpuwatch and the vendor extras
#      that match the GPUs on the PCI bus (nvidia, amd);
#   2. creates the system user `gpuwatch` (in the video/render groups that own /dev/kfd and /dev/dri/*);
#   3. writes /etc/gpuwatch/config.toml (if absent), the unit /etc/systemd/system/gpuwatch.service and the drop-ins
#      this node needs (IPMI when /dev/ipmi0 exists, nvidia-uvm + gpuwatch-nvidia-uvm.service when nvidia-modprobe
#      exists);
#   4. systemctl daemon-reload, enable --now (restart on an upgrade), where systemd runs.
# Options: --source SPEC (a pip requirement name or a path, without extras; default: the tree beside this script,
#   else gpuwatch-agent), --version V (pin: SPEC==V), --extras LIST (default: detected; "" for none),
#   --prefix DIR (the venv; default /opt/gpuwatch), --no-start (do not touch systemctl), --no-user (do not create the
#   user), --python PATH, --no-probe (NVIDIA: no CuPy probe engine, no nvidia-uvm oneshot), --probe-cuda 12|13
#   (default: 13 from driver 580, else 12; an unknown driver version gets 12), --dry-run (say what would be done,
#   change nothing).
# --uninstall: stops and disables the unit (where systemd runs), removes the unit, the installer's drop-ins, the
#   nvidia-uvm oneshot, the udev rule and the venv (--prefix); keeps /etc/gpuwatch, /var/lib/gpuwatch and the user.
#   --uninstall --purge also removes /etc/gpuwatch, /var/lib/gpuwatch, /var/cache/gpuwatch and the user gpuwatch.
#   Running it again finds nothing to remove and succeeds.
# On NVIDIA nodes the probe engine is CuPy for the driver's CUDA (the `probe` extra = cupy-cuda12x, or cupy-cuda13x).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: install.sh [--source SPEC] [--version V] [--extras LIST] [--prefix DIR] [--python PATH]
                  [--no-start] [--no-user] [--no-probe] [--probe-cuda 12|13] [--dry-run]
       install.sh --uninstall [--purge] [--prefix DIR] [--dry-run]

Installs gpuwatch as the systemd service gpuwatch.service: the venv /opt/gpuwatch (--prefix), the user gpuwatch,
/etc/gpuwatch/config.toml (kept if present), the unit and the drop-ins this node needs. From a checkout or an
unpacked sdist it installs that tree; alone (piped from curl) it installs gpuwatch-agent from PyPI.
--uninstall removes the service and the venv and keeps the config, the state and the user; --purge removes those too.
Packaging: use the Debian package (scripts/build-deb.sh), not this script.
USAGE
}

die() {
  echo "install.sh: $*" >&2
  exit 1
}
say() { echo "install.sh: $*"; }

# Where detection looks; tests point these at fixtures (as the Ansible role's gpuwatch_* detection variables do).
NVIDIA_VERSION_FILE="${GPUWATCH_NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}"
NVIDIA_MODPROBE="${GPUWATCH_NVIDIA_MODPROBE:-/usr/bin/nvidia-modprobe}"
IPMI_DEVICE="${GPUWATCH_IPMI_DEVICE:-/dev/ipmi0}"
PCI_DEVICES="${GPUWATCH_PCI_DEVICES:-/sys/bus/pci/devices}"

UNITS=/etc/systemd/system
DROPINS="$UNITS/gpuwatch.service.d"
UDEV_RULE=/etc/udev/rules.d/60-gpuwatch-ipmi.rules
DEFAULT_PREFIX=/opt/gpuwatch
DISTRIBUTION=gpuwatch-agent

systemd_runs() { [ -d /run/systemd/system ]; }

# The tree this script belongs to, if any: a checkout or an unpacked sdist has systemd/gpuwatch.service and the
# build files beside deploy/. Piped into bash there is no script file (BASH_SOURCE is empty), hence no tree.
script_tree() {
  local script="${BASH_SOURCE[0]:-}"
  [ -n "$script" ] && [ -f "$script" ] || return 1
  local tree
  tree="$(cd "$(dirname "$script")/.." && pwd)"
  [ -f "$tree/systemd/gpuwatch.service" ] && [ -f "$tree/pyproject.toml" ] && [ -f "$tree/setup.py" ] || return 1
  echo "$tree"
}

# --- Python >= 3.11 ----------------------------------------------------------------------------------------------
python_ok() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
find_python() {
  local candidate
  for candidate in "$python" python3 python3.13 python3.12 python3.11; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate" && {
      command -v "$candidate"
      return 0
    }
  done
  return 1
}
ensure_python() {
  if python="$(find_python)"; then return 0; fi
  say "installing Python >= 3.11"
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq </dev/null
    apt-get install -y -qq python3 python3-venv </dev/null >/dev/null
    find_python >/dev/null || apt-get install -y -qq python3.11 python3.11-venv </dev/null >/dev/null # Ubuntu 22.04
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3.11 </dev/null # RHEL 8/9 ship 3.11 beside the system python
  else
    die "no apt-get or dnf: install Python >= 3.11 with venv, then pass --python PATH"
  fi
  python="$(find_python)" || die "Python >= 3.11 still not found after installing; pass --python PATH"
}

# --- what this node has ------------------------------------------------------------------------------------------
detect_extras() {
  local list=() dev
  for dev in "$PCI_DEVICES"/*; do
    [ -r "$dev/class" ] || continue
    case "$(cat "$dev/class")" in 0x03* | 0x12*) ;; *) continue ;; esac # display or processing accelerator
    case "$(cat "$dev/vendor")" in
      0x10de) [[ " ${list[*]:-} " == *" nvidia "* ]] || list+=(nvidia) ;;
      0x1002) [[ " ${list[*]:-} " == *" amd "* ]] || list+=(amd) ;;
    esac
  done
  (
    IFS=,
    echo "${list[*]:-}"
  )
}

# The probe's engine on NVIDIA nodes: CuPy built for the driver's CUDA major (CUDA 13 needs driver >= 580).
choose_probe_engine() {
  probe_requirement=""
  if [ "$probe" = 1 ] && [[ ",$extras," == *",nvidia,"* ]] && [[ ",$extras," != *",probe,"* ]]; then
    local driver cuda major
    driver="$(head -n1 "$NVIDIA_VERSION_FILE" 2>/dev/null | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1 || true)"
    if [ -z "$driver" ] && [ -z "${GPUWATCH_NVIDIA_VERSION_FILE:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
      driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    fi
    cuda="$probe_cuda"
    if [ "$cuda" = auto ]; then
      major="${driver%%.*}"
      if [ -z "$driver" ]; then
        cuda=12
      elif [ "$major" -ge 580 ]; then
        cuda=13
      elif [ "$major" -ge 525 ]; then
        cuda=12
      else
        cuda=""
      fi
    fi
    if [ -z "$cuda" ]; then
      say "WARNING: NVIDIA driver $driver is older than CUDA 12 (525): no probe engine installed, every probe will be" \
        "skipped_unsupported (install PyTorch for your CUDA into $prefix, or upgrade the driver)"
    elif [ "$cuda" = 12 ]; then
      extras="${extras:+$extras,}probe" # pyproject: probe = ["cupy-cuda12x>=13"]
    else
      probe_requirement="cupy-cuda${cuda}x>=13"
    fi
    say "probe engine: cupy-cuda${cuda:-?}x (NVIDIA driver ${driver:-unknown, assuming CUDA 12}; --no-probe to skip)"
  elif [ "$probe" = 0 ] && [[ ",$extras," == *",nvidia,"* ]]; then
    say "WARNING: --no-probe: no probe engine, every probe will be skipped_unsupported (set probe.interval_seconds = 0)"
  fi
}

# A shipped file (named as in the repository) from the package installed in the venv: the same files whichever
# source was installed. -I: the current directory (a checkout, perhaps) is not on sys.path.
shipped() {
  "$prefix/bin/python" -I -c 'import sys; from gpuwatch.files.shipped import shipped_file; print(shipped_file(sys.argv[1]))' \
    "$1" || die "the installed gpuwatch in $prefix lacks $1: is $source_spec a gpuwatch-agent release?"
}

install_node() {
  [ "$(id -u)" = 0 ] || [ "$dry_run" = 1 ] || die "run as root (sudo)"
  local tree=""
  if tree="$(script_tree)"; then
    [ -n "$source_spec" ] || source_spec="$tree"
    say "installing from $source_spec (the tree beside this script unless --source says otherwise)"
  else
    local from="--source"
    [ -n "$source_spec" ] || { source_spec="$DISTRIBUTION" && from="PyPI"; }
    say "no gpuwatch tree beside this script (piped, or a lone copy): installing $source_spec from $from; the unit," \
      "drop-ins and example config come from the installed package"
  fi
  [ "$extras_given" = 1 ] || extras="$(detect_extras)"
  choose_probe_engine
  local requirement="$source_spec${extras:+[$extras]}${version:+==$version}"

  local want_ipmi=0 want_uvm=0
  [ -e "$IPMI_DEVICE" ] && want_ipmi=1
  [ "$probe" = 1 ] && [ -x "$NVIDIA_MODPROBE" ] && want_uvm=1
  if [ "$dry_run" = 1 ]; then
    say "would install into $prefix: $requirement${probe_requirement:+ $probe_requirement}"
    say "would write $UNITS/gpuwatch.service$([ -e /etc/gpuwatch/config.toml ] || echo ' and /etc/gpuwatch/config.toml')"
    [ "$want_ipmi" = 0 ] || say "would add the drop-in ipmi.conf and $UDEV_RULE ($IPMI_DEVICE exists)"
    [ "$want_uvm" = 0 ] || say "would add the drop-in nvidia-uvm.conf and gpuwatch-nvidia-uvm.service ($NVIDIA_MODPROBE exists)"
    return 0
  fi

  ensure_python
  # --- venv ------------------------------------------------------------------------------------------------------
  if [ ! -x "$prefix/bin/python" ]; then
    say "creating $prefix with $python"
    "$python" -m venv "$prefix"
  fi
  say "installing $requirement${probe_requirement:+ $probe_requirement} into $prefix"
  "$prefix/bin/python" -m pip install -q --upgrade pip </dev/null >/dev/null
  "$prefix/bin/python" -m pip install -q --upgrade "$requirement" ${probe_requirement:+"$probe_requirement"} </dev/null
  install -d -m 0755 "$prefix/share/doc/gpuwatch"
  install -m 0644 "$(shipped README.md)" "$prefix/share/doc/gpuwatch/README.md"
  install -m 0644 "$(shipped systemd/README.md)" "$prefix/share/doc/gpuwatch/systemd.md"
  install -m 0644 "$(shipped deploy/config.example.toml)" "$prefix/share/doc/gpuwatch/config.example.toml"

  # --- user ------------------------------------------------------------------------------------------------------
  if [ "$make_user" = 1 ]; then
    if ! getent passwd gpuwatch >/dev/null; then
      say "creating system user gpuwatch"
      local nologin
      nologin="$(command -v nologin || echo /usr/sbin/nologin)"
      useradd --system --user-group --no-create-home --home-dir /var/lib/gpuwatch --shell "$nologin" gpuwatch
    fi
    local group
    for group in video render; do
      if getent group "$group" >/dev/null; then usermod -aG "$group" gpuwatch; fi
    done
  fi

  # --- config, unit, drop-ins ------------------------------------------------------------------------------------
  install -d -m 0755 /etc/gpuwatch "$DROPINS"
  if [ ! -e /etc/gpuwatch/config.toml ]; then
    say "writing /etc/gpuwatch/config.toml (every key: $prefix/share/doc/gpuwatch/config.example.toml)"
    cat >/etc/gpuwatch/config.toml <<TOML
# gpuwatch configuration. Every key, its default and its meaning: $prefix/share/doc/gpuwatch/config.example.toml
# Apply a change with: systemctl reload gpuwatch (listen, web_config, backend and state_dir need a restart).
[agent]
listen = ":9845"
# web_config = "/etc/gpuwatch/web-config.yml"   # TLS and basic auth, exporter-toolkit format
TOML
    chmod 0644 /etc/gpuwatch/config.toml
  fi
  # The shipped unit runs $DEFAULT_PREFIX/bin/gpuwatch; another --prefix is written into the copy.
  sed "s#$DEFAULT_PREFIX/#$prefix/#g" "$(shipped systemd/gpuwatch.service)" >"$UNITS/gpuwatch.service.new"
  chmod 0644 "$UNITS/gpuwatch.service.new"
  mv -f "$UNITS/gpuwatch.service.new" "$UNITS/gpuwatch.service"
  # An upgrade removes what this node no longer needs (the BMC gone, --no-probe now): the drop-ins match detection.
  [ "$want_ipmi" = 1 ] || rm -f "$DROPINS/ipmi.conf" "$UDEV_RULE"
  [ "$want_uvm" = 1 ] || rm -f "$DROPINS/nvidia-uvm.conf" "$UNITS/gpuwatch-nvidia-uvm.service"
  if [ "$want_ipmi" = 1 ]; then
    install -m 0644 "$(shipped systemd/drop-ins/ipmi.conf)" "$DROPINS/ipmi.conf"
    install -d -m 0755 "$(dirname "$UDEV_RULE")"
    echo 'KERNEL=="ipmi[0-9]*", GROUP="gpuwatch", MODE="0660"' >"$UDEV_RULE"
    if command -v udevadm >/dev/null 2>&1; then udevadm trigger --subsystem-match=ipmi || true; fi
  fi
  if [ "$want_uvm" = 1 ]; then
    # nvidia_uvm must be loaded before the agent's DeviceAllow=char-nvidia* is resolved: a oneshot unit outside its
    # sandbox does it (systemd/gpuwatch-nvidia-uvm.service), pulled in by the drop-in.
    install -m 0644 "$(shipped systemd/gpuwatch-nvidia-uvm.service)" "$UNITS/gpuwatch-nvidia-uvm.service"
    install -m 0644 "$(shipped systemd/drop-ins/nvidia-uvm.conf)" "$DROPINS/nvidia-uvm.conf"
  fi

  # --- start -----------------------------------------------------------------------------------------------------
  if [ "$start" = 0 ]; then
    say "files in place; not starting (systemctl enable --now gpuwatch)"
    return 0
  fi
  if ! systemd_runs; then
    say "systemd is not running here (a container?); start the agent with: $prefix/bin/gpuwatch run"
    return 0
  fi
  systemctl daemon-reload
  if systemctl is-active --quiet gpuwatch; then
    systemctl restart gpuwatch
  else
    systemctl enable --now gpuwatch
  fi
  systemctl enable gpuwatch >/dev/null 2>&1
  say "gpuwatch is running: curl -s http://127.0.0.1:9845/healthz; journalctl -u gpuwatch"
}

# Remove a path if it is there, saying so (or, in a dry run, saying it would).
remove() {
  local path
  for path in "$@"; do
    [ -e "$path" ] || [ -L "$path" ] || continue
    if [ "$dry_run" = 1 ]; then
      say "would remove $path"
    else
      rm -rf -- "$path"
      say "removed $path"
    fi
    removed=$((removed + 1))
  done
}

uninstall_node() {
  [ "$(id -u)" = 0 ] || [ "$dry_run" = 1 ] || die "run as root (sudo)"
  removed=0
  if [ -e "$prefix" ] && [ ! -f "$prefix/pyvenv.cfg" ]; then
    die "$prefix is not a venv (no pyvenv.cfg): not removing it; check --prefix"
  fi
  if systemd_runs && [ "$dry_run" = 0 ]; then
    local unit
    for unit in gpuwatch.service gpuwatch-nvidia-uvm.service; do # one at a time: a missing one fails only itself
      if [ -e "$UNITS/$unit" ]; then systemctl disable --now "$unit" >/dev/null 2>&1 || systemctl stop "$unit" || true; fi
    done
  fi
  # The enablement links too: systemctl cannot remove them where systemd is not running.
  remove "$UNITS/multi-user.target.wants/gpuwatch.service" "$UNITS/gpuwatch.service.wants"
  remove "$UNITS/gpuwatch.service" "$UNITS/gpuwatch-nvidia-uvm.service"
  if [ "$purge" = 1 ]; then
    remove "$DROPINS"
  else
    remove "$DROPINS/ipmi.conf" "$DROPINS/nvidia-uvm.conf"
    if [ -d "$DROPINS" ] && [ "$dry_run" = 0 ]; then
      rmdir "$DROPINS" 2>/dev/null || say "kept your own drop-ins in $DROPINS ($(ls -A "$DROPINS" | tr '\n' ' '))"
    fi
  fi
  remove "$UDEV_RULE"
  remove "$prefix"
  if systemd_runs && [ "$dry_run" = 0 ]; then
    systemctl daemon-reload
    systemctl reset-failed gpuwatch.service >/dev/null 2>&1 || true
  fi
  if [ "$purge" = 0 ]; then
    local kept=() path
    for path in /etc/gpuwatch /var/lib/gpuwatch /var/cache/gpuwatch; do
      if [ -e "$path" ]; then kept+=("$path"); fi
    done
    if getent passwd gpuwatch >/dev/null; then kept+=("the user gpuwatch"); fi
    [ ${#kept[@]} = 0 ] || say "kept $(printf '%s, ' "${kept[@]}" | sed 's/, $//') (--uninstall --purge removes them)"
  else
    remove /etc/gpuwatch /var/lib/gpuwatch /var/cache/gpuwatch
    if getent passwd gpuwatch >/dev/null; then
      if [ "$dry_run" = 1 ]; then say "would remove the user gpuwatch"; else userdel gpuwatch && say "removed the user gpuwatch"; fi
      removed=$((removed + 1))
    fi
    if getent group gpuwatch >/dev/null; then
      if [ "$dry_run" = 1 ]; then say "would remove the group gpuwatch"; else groupdel gpuwatch && say "removed the group gpuwatch"; fi
      removed=$((removed + 1))
    fi
  fi
  [ "$removed" != 0 ] || say "nothing of gpuwatch to remove"
  return 0
}

main() {
  source_spec=""
  version=""
  extras=""
  extras_given=0
  start=1
  make_user=1
  python=""
  prefix="$DEFAULT_PREFIX"
  probe=1
  probe_cuda=auto
  dry_run=0
  uninstall=0
  purge=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --source | --version | --extras | --prefix | --python | --probe-cuda)
        [ $# -ge 2 ] || die "$1 needs a value (see --help)"
        ;;&
      --source) source_spec="$2" && shift 2 ;;
      --version) version="$2" && shift 2 ;;
      --extras) extras="$2" extras_given=1 && shift 2 ;;
      --prefix)
        [[ "$2" == /* ]] || die "--prefix takes an absolute path, not $2"
        prefix="${2%/}" && shift 2
        ;;
      --python) python="$2" && shift 2 ;;
      --probe-cuda)
        probe_cuda="$2" && shift 2
        [[ "$probe_cuda" =~ ^(12|13|auto)$ ]] || die "--probe-cuda takes 12 or 13"
        ;;
      --no-start) start=0 && shift ;;
      --no-user) make_user=0 && shift ;;
      --no-probe) probe=0 && shift ;;
      --dry-run) dry_run=1 start=0 make_user=0 && shift ;;
      --uninstall) uninstall=1 && shift ;;
      --purge) purge=1 && shift ;;
      --root) die "--root is gone: the tree it staged did not work once moved; to package gpuwatch build the Debian package (bash scripts/build-deb.sh), to install elsewhere use --prefix" ;;
      -h | --help) usage && exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
  done
  [ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"
  [[ "$source_spec" != *"["* ]] || die "--source takes no extras ($source_spec): give them with --extras"
  if [ "$uninstall" = 1 ]; then
    uninstall_node
  else
    install_node
  fi
}

# Everything runs from main, called on the last line: piped into bash, the whole script is read before anything
# runs, so no command (pip, apt-get) can swallow the rest of it from stdin, and a cut-off download runs nothing.
main "$@"
