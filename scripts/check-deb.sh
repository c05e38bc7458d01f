#!/usr/bin/env bash
# The Debian package's life cycle on this machine, as CI runs it (root, Debian 12, systemd not PID 1):
#
#   bash scripts/check-deb.sh
#
# build (scripts/build-deb.sh) -> lintian (fails on any E:) -> dpkg -i -> the user, state dir, conffile, unit and
# command are as they should be -> `gpuwatch check --backend simulated` and a simulated agent, as the user gpuwatch,
# on the package's config and state dir -> dpkg -i again over itself (an upgrade: the config edit and the state
# survive, no prompt) -> dpkg -r (binaries and venv gone, config and state kept) -> dpkg -P (config and state gone;
# /opt /etc /lib/systemd /usr/bin /usr/share/doc /var/lib list exactly as before the install).
# The system user stays after a purge, as Debian's packages leave their system users; when this check's install
# created it, the check removes it at the end, so the machine is left as it was found.
# It refuses to start where gpuwatch is already installed (by dpkg or deploy/install.sh): it would purge it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export DEBIAN_FRONTEND=noninteractive
step_no=0
step() { step_no=$((step_no + 1)); echo "check-deb [$step_no] $*"; }
ok() { echo "check-deb     ok: $*"; }
die() { echo "check-deb: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: it installs, upgrades, removes and purges the package on this machine"
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this check runs on Debian 12 (bookworm) or later"

work="$(mktemp -d "${TMPDIR:-/tmp}/gpuwatch-check-deb.XXXXXX")"
agent_pid=""
installed=0
cleanup() {
  local rc=$?
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then kill -TERM "$agent_pid" 2>/dev/null || true; fi
  rm -rf "$work"
  if [ "$rc" != 0 ] && [ "$installed" = 1 ]; then
    echo "check-deb: the package is left as the failure found it, to look at; to clean up: dpkg -P gpuwatch$(
      [ "${user_existed:-1}" = 0 ] && echo "; deluser --system gpuwatch")" >&2
  fi
}
trap cleanup EXIT

# dpkg and apt-get wait for the dpkg lock (another apt run on the machine) rather than fail on it.
with_dpkg_lock() {
  local tries=0 out
  while :; do
    if out="$("$@" 2>&1 </dev/null)"; then printf '%s\n' "$out"; return 0; fi
    if grep -qE 'dpkg frontend lock|Could not get lock|lock-frontend' <<<"$out" && [ $((tries += 1)) -lt 60 ]; then
      sleep 5
      continue
    fi
    printf '%s\n' "$out"
    return 1
  done
}

# What the package may touch, listed before the install and after the purge (dpkg's and apt's own bookkeeping and
# the account files, which keep the system user, left out).
listing() {
  { find /opt /etc /lib/systemd /usr/bin /usr/sbin /usr/share/doc /usr/share/gpuwatch /usr/share/man/man1 \
    /usr/share/lintian/overrides /var/lib /var/cache -xdev 2>/dev/null || true; } \
    | grep -vE '^/var/lib/(dpkg|apt|ucf)(/|$)|^/var/cache/(apt|man|debconf)(/|$)|^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-?$|^/etc/ld\.so\.cache$' \
    | LC_ALL=C sort
}

# --- 1. preflight ------------------------------------------------------------------------------------------------
step "preflight: gpuwatch is not installed here"
if dpkg-query -W -f='${Status}\n' gpuwatch 2>/dev/null | grep -qv '^unknown ok not-installed$'; then
  die "the package gpuwatch is already on this machine ($(dpkg-query -W -f='${Status}' gpuwatch)): this check would purge it; remove it first (dpkg -P gpuwatch)"
fi
for path in /opt/gpuwatch /etc/gpuwatch /var/lib/gpuwatch /etc/systemd/system/gpuwatch.service; do
  [ ! -e "$path" ] || die "$path exists (deploy/install.sh?): this check would overwrite and purge it; uninstall that first"
done
user_existed=0
getent passwd gpuwatch >/dev/null && user_existed=1
ok "nothing of gpuwatch here; the user gpuwatch $([ "$user_existed" = 1 ] && echo exists already || echo does not exist)"

# --- 2. build ----------------------------------------------------------------------------------------------------
step "build: scripts/build-deb.sh"
started=$SECONDS
bash scripts/build-deb.sh
version="$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' gpuwatch/__init__.py)"
arch="$(dpkg --print-architecture)"
deb="$repo/dist/gpuwatch_${version}_${arch}.deb"
[ -f "$deb" ] || die "scripts/build-deb.sh did not leave $deb"
ok "$deb in $((SECONDS - started)) s"

# --- 3. lintian --------------------------------------------------------------------------------------------------
step "lintian: no errors (overrides, each with its reason: debian/gpuwatch.lintian-overrides)"
if ! command -v lintian >/dev/null 2>&1; then
  echo "check-deb     installing lintian"
  with_dpkg_lock apt-get update -qq >/dev/null
  with_dpkg_lock apt-get install -y -qq --no-install-recommends lintian >/dev/null
fi
lintian_rc=0
lintian --display-info --pedantic --fail-on error "$deb" >"$work/lintian.txt" 2>&1 || lintian_rc=$?
grep -v '^running with root privileges' "$work/lintian.txt" | sed 's/^/    lintian: /' || true
# The overridden tags, counted (with --show-overrides lintian would fail on the overridden errors, so a second run).
lintian --pedantic --show-overrides "$deb" 2>/dev/null | sed -n 's/^O: gpuwatch: \([a-z0-9-]*\).*/\1/p' | sort | uniq -c \
  | while read -r count tag; do echo "    lintian: overridden (debian/gpuwatch.lintian-overrides): $tag x$count"; done || true
errors="$(grep -c '^E: ' "$work/lintian.txt" || true)"
[ "$errors" = 0 ] || die "lintian reports $errors error(s) (E: lines above)"
[ "$lintian_rc" = 0 ] || die "lintian exited $lintian_rc (see its output above)"
summary="$(grep -oE '^[EWIP]: ' "$work/lintian.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ' ' || true)"
ok "no errors; not overridden: ${summary:-nothing}"

# --- 4. install --------------------------------------------------------------------------------------------------
step "install: dpkg -i"
listing >"$work/before.txt"  # after the build and lintian, which may install their own dependencies
if ! with_dpkg_lock dpkg -i "$deb" >"$work/install.txt"; then
  cat "$work/install.txt"
  echo "check-deb     dpkg -i left dependencies to install: apt-get install -f -y"
  with_dpkg_lock apt-get install -f -y -qq >"$work/install-f.txt" || { cat "$work/install-f.txt"; die "apt-get install -f failed"; }
fi
installed=1
sed 's/^/    dpkg: /' "$work/install.txt"
[ "$(dpkg-query -W -f='${Status}' gpuwatch)" = "install ok installed" ] || die "gpuwatch is not installed after dpkg -i"
ok "gpuwatch $version installed"

# --- 5. what it installed ----------------------------------------------------------------------------------------
step "the system user, the state dir, the conffile, the unit, the command"
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd gpuwatch) || die "no user gpuwatch after the install"
[ "$uid" -lt 1000 ] || die "gpuwatch has UID $uid: not a system user"
[ "$home" = /var/lib/gpuwatch ] || die "gpuwatch's home is $home, not /var/lib/gpuwatch"
[[ "$shell" == */nologin ]] || die "gpuwatch's shell is $shell, not nologin"
getent group gpuwatch >/dev/null || die "no group gpuwatch"
for group in video render; do
  if getent group "$group" >/dev/null; then
    id -nG gpuwatch | tr ' ' '\n' | grep -qx "$group" || die "gpuwatch is not in the group $group (it exists here)"
  fi
done
ok "user gpuwatch: system UID $uid, home $home, shell $shell, groups $(id -nG gpuwatch)"
owner_mode="$(stat -c '%U:%G %a' /var/lib/gpuwatch)"
[ "$owner_mode" = "gpuwatch:gpuwatch 750" ] || die "/var/lib/gpuwatch is $owner_mode, not gpuwatch:gpuwatch 750"
ok "/var/lib/gpuwatch gpuwatch:gpuwatch 0750"
[ -f /etc/gpuwatch/config.toml ] || die "/etc/gpuwatch/config.toml is missing"
dpkg-query -W -f='${Conffiles}\n' gpuwatch | grep -q '^ /etc/gpuwatch/config.toml ' \
  || die "/etc/gpuwatch/config.toml is not a conffile of gpuwatch"
grep -q '^\[agent\]' /etc/gpuwatch/config.toml || die "/etc/gpuwatch/config.toml has no [agent] table"
ok "/etc/gpuwatch/config.toml is a conffile"
unit=/lib/systemd/system/gpuwatch.service
[ -f "$unit" ] || die "$unit is missing"
grep -qx 'ExecStart=/opt/gpuwatch/bin/gpuwatch run --config /etc/gpuwatch/config.toml' "$unit" \
  || die "$unit's ExecStart= is not /opt/gpuwatch/bin/gpuwatch run --config /etc/gpuwatch/config.toml"
while read -r path; do
  [ -e "$path" ] || die "$unit names $path, which the package did not install"
done < <(grep -oE '(/opt|/usr|/etc|/lib)/[^ ]*' "$unit" | sort -u)
[ -L /etc/systemd/system/multi-user.target.wants/gpuwatch.service ] \
  || die "gpuwatch.service is not enabled (no /etc/systemd/system/multi-user.target.wants/gpuwatch.service)"
[ -f /lib/systemd/system/gpuwatch-nvidia-uvm.service ] || die "gpuwatch-nvidia-uvm.service is missing"
ok "$unit (enabled), gpuwatch-nvidia-uvm.service (not enabled: drop-ins/nvidia-uvm.conf pulls it in)"
[ "$(readlink /usr/bin/gpuwatch)" = /opt/gpuwatch/bin/gpuwatch ] || die "/usr/bin/gpuwatch is not a symlink to /opt/gpuwatch/bin/gpuwatch"
/usr/bin/gpuwatch version >"$work/version.txt" 2>&1 || { cat "$work/version.txt"; die "gpuwatch version failed"; }
head -n 1 "$work/version.txt" | grep -q "^gpuwatch.* $version " || { cat "$work/version.txt"; die "gpuwatch version does not say $version"; }
ok "/usr/bin/gpuwatch -> /opt/gpuwatch/bin/gpuwatch: $(head -n 1 "$work/version.txt")"
[ -n "$(find /opt/gpuwatch/lib -path '*/gpuwatch/__pycache__/*.pyc' -print -quit)" ] \
  || die "postinst did not byte-compile the venv (no gpuwatch/__pycache__/*.pyc)"
ok "byte code compiled by postinst"

# --- 6. run it as the service would ------------------------------------------------------------------------------
step "gpuwatch check --backend simulated, as the user gpuwatch, on the package's config and state dir"
listen=()
if ! python3 -c 'import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9845))' 2>/dev/null; then
  free="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  listen=(--listen "127.0.0.1:$free")
  echo "check-deb     port 9845 is taken on this machine (by something else): checking with --listen 127.0.0.1:$free"
fi
# As the unit runs it: the user gpuwatch with its groups, a clean environment, from / (setpriv execs in place, so a
# signal reaches the agent itself).
as_gpuwatch() {
  cd / && exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/var/lib/gpuwatch \
    setpriv --reuid=gpuwatch --regid=gpuwatch --init-groups -- "$@"
}
check_rc=0
(as_gpuwatch /usr/bin/gpuwatch check --config /etc/gpuwatch/config.toml --backend simulated "${listen[@]}") \
  >"$work/check.txt" 2>&1 || check_rc=$?
sed 's/^/    gpuwatch check: /' "$work/check.txt"
grep -q '^\[ok\] state dir /var/lib/gpuwatch' "$work/check.txt" || die "gpuwatch check did not find the state dir /var/lib/gpuwatch usable"
[ "$check_rc" = 0 ] || die "gpuwatch check exited $check_rc (69: a resource is missing, 78: bad config; see its FAIL lines)"
ok "gpuwatch check exited 0"

step "the simulated agent runs as gpuwatch and writes its state to /var/lib/gpuwatch"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
(as_gpuwatch /usr/bin/gpuwatch run --config /etc/gpuwatch/config.toml --backend simulated --scenario healthy \
  --listen "127.0.0.1:$port") >"$work/agent.txt" 2>&1 &
agent_pid=$!
healthy=0
for _ in $(seq 120); do
  if python3 -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=2).status != 200)" 2>/dev/null; then
    healthy=1
    break
  fi
  kill -0 "$agent_pid" 2>/dev/null || break
  sleep 0.5
done
[ "$healthy" = 1 ] || { cat "$work/agent.txt"; die "the agent did not answer /healthz on 127.0.0.1:$port within 60 s"; }
python3 -c "import urllib.request; body = urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode(); assert 'gpuwatch_gpu_up' in body, 'no gpuwatch_gpu_up in /metrics'" \
  || { cat "$work/agent.txt"; die "the agent's /metrics has no gpuwatch_gpu_up"; }
kill -TERM "$agent_pid"
agent_rc=0
wait "$agent_pid" || agent_rc=$?
agent_pid=""
[ "$agent_rc" = 0 ] || { cat "$work/agent.txt"; die "the agent exited $agent_rc on SIGTERM"; }
state_files="$(find /var/lib/gpuwatch -mindepth 1 -user gpuwatch | wc -l)"
[ "$state_files" -gt 0 ] || die "the agent wrote nothing to /var/lib/gpuwatch"
ok "/healthz and /metrics answered; stopped cleanly on SIGTERM; $state_files file(s) of its state in /var/lib/gpuwatch"

# --- 7. upgrade --------------------------------------------------------------------------------------------------
step "upgrade: dpkg -i the same .deb again, over an edited config and written state"
echo "# edited by check-deb.sh before the upgrade" >>/etc/gpuwatch/config.toml
(as_gpuwatch sh -c 'echo kept > /var/lib/gpuwatch/check-deb-upgrade.txt')
find /var/lib/gpuwatch -mindepth 1 -printf '%P %s\n' | LC_ALL=C sort >"$work/state-before.txt"
with_dpkg_lock dpkg -i "$deb" >"$work/upgrade.txt" || { cat "$work/upgrade.txt"; die "dpkg -i over the installed package failed (a conffile prompt fails too: stdin is /dev/null)"; }
sed 's/^/    dpkg: /' "$work/upgrade.txt"
! grep -qiE "configuration file|conffile" "$work/upgrade.txt" || die "dpkg asked about /etc/gpuwatch/config.toml on an upgrade"
grep -qx '# edited by check-deb.sh before the upgrade' /etc/gpuwatch/config.toml || die "the upgrade lost the edit of /etc/gpuwatch/config.toml"
find /var/lib/gpuwatch -mindepth 1 -printf '%P %s\n' | LC_ALL=C sort >"$work/state-after.txt"
diff -u "$work/state-before.txt" "$work/state-after.txt" || die "the upgrade changed /var/lib/gpuwatch (diff above)"
[ "$(stat -c '%U:%G %a' /var/lib/gpuwatch)" = "gpuwatch:gpuwatch 750" ] || die "the upgrade changed /var/lib/gpuwatch's owner or mode"
/usr/bin/gpuwatch version >/dev/null || die "gpuwatch version fails after the upgrade"
ok "no prompt; config edit, state ($(wc -l <"$work/state-after.txt") entries) and state dir mode kept; gpuwatch runs"

# --- 8. remove ---------------------------------------------------------------------------------------------------
step "remove: dpkg -r (binaries and venv go, config and state stay)"
# What an operator adds to the venv (pip install cupy-cuda12x) is not dpkg's: remove leaves it, purge takes it.
extra="$(echo /opt/gpuwatch/lib/python3.*/site-packages)/check_deb_operator_extra.py"
echo "# an operator's pip install" >"$extra"
with_dpkg_lock dpkg -r gpuwatch >"$work/remove.txt" || { cat "$work/remove.txt"; die "dpkg -r failed"; }
sed 's/^/    dpkg: /' "$work/remove.txt"
[ "$(dpkg-query -W -f='${Status}' gpuwatch)" = "deinstall ok config-files" ] || die "after dpkg -r gpuwatch is $(dpkg-query -W -f='${Status}' gpuwatch), not config-files"
# (The unit's enablement symlink in /etc/systemd/system stays until the purge, as deb-systemd-helper keeps it.)
for path in /usr/bin/gpuwatch /opt/gpuwatch/bin /lib/systemd/system/gpuwatch.service /usr/share/doc/gpuwatch \
  /usr/share/gpuwatch /usr/share/man/man1/gpuwatch.1.gz; do
  if [ -e "$path" ] || [ -L "$path" ]; then die "$path is still there after dpkg -r"; fi
done
leftover="$(find /opt/gpuwatch -type f 2>/dev/null || true)"
[ "$leftover" = "$extra" ] \
  || die "after dpkg -r, /opt/gpuwatch holds more than the operator's file: ${leftover:-nothing}"
grep -qx '# edited by check-deb.sh before the upgrade' /etc/gpuwatch/config.toml || die "dpkg -r removed or changed /etc/gpuwatch/config.toml"
[ -f /var/lib/gpuwatch/check-deb-upgrade.txt ] || die "dpkg -r removed the state in /var/lib/gpuwatch"
ok "command, venv, unit and docs gone; config, state and the operator's file in /opt/gpuwatch kept"

# --- 9. purge ----------------------------------------------------------------------------------------------------
step "purge: dpkg -P (config, state and what was left in /opt/gpuwatch go; nothing else stays)"
with_dpkg_lock dpkg -P gpuwatch >"$work/purge.txt" || { cat "$work/purge.txt"; die "dpkg -P failed"; }
sed 's/^/    dpkg: /' "$work/purge.txt"
dpkg-query -W -f='${Status}\n' gpuwatch 2>/dev/null | grep -qv '^unknown ok not-installed$' \
  && die "dpkg still knows gpuwatch after the purge: $(dpkg-query -W -f='${Status}' gpuwatch)"
for path in /etc/gpuwatch /var/lib/gpuwatch /var/cache/gpuwatch /opt/gpuwatch; do
  [ ! -e "$path" ] || die "$path is still there after dpkg -P"
done
getent passwd gpuwatch >/dev/null || die "the purge removed the system user gpuwatch (Debian keeps system users)"
owned="$(find / -xdev -user gpuwatch 2>/dev/null | head -n 5 || true)"
[ -z "$owned" ] || die "files of the user gpuwatch are left after the purge: $owned"
listing >"$work/after.txt"
# base-files makes /opt in its postinst without listing it in dpkg's database; this package lists it, so when it
# was empty before, dpkg removes the emptied /opt with the package (after postrm purge: nothing there can keep it).
if grep -qx /opt "$work/before.txt" && ! grep -q '^/opt/' "$work/before.txt" && ! grep -qx /opt "$work/after.txt"; then
  echo "check-deb     note: /opt was empty before the install; dpkg removed it with the package (no package lists /opt: base-files makes it)"
  grep -vx /opt "$work/before.txt" >"$work/before-no-opt.txt" && mv "$work/before-no-opt.txt" "$work/before.txt"
fi
diff -u "$work/before.txt" "$work/after.txt" >"$work/listing.diff" || {
  cat "$work/listing.diff"
  die "the purge left the machine different from before the install (diff of the listings above)"
}
ok "config, state, cache and venv gone; the listings of /opt /etc /lib/systemd /usr/bin /usr/share/doc /var/lib match; no file owned by gpuwatch"

# --- 10. the user ------------------------------------------------------------------------------------------------
step "the system user gpuwatch"
if [ "$user_existed" = 0 ]; then
  deluser --system --quiet gpuwatch >/dev/null 2>&1 || true
  ! getent group gpuwatch >/dev/null || delgroup --system --quiet gpuwatch >/dev/null 2>&1 || true
  ! getent passwd gpuwatch >/dev/null || die "could not remove the user gpuwatch this check's install created"
  ok "kept by the purge as Debian does; this check created it, so it removed it (the machine is as it was)"
else
  ok "kept by the purge as Debian does (it existed before this check, and stays)"
fi
echo "check-deb: PASS: gpuwatch $version built, lintian-clean, installed, checked, upgraded, removed and purged"
