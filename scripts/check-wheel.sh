#!/usr/bin/env bash
# Build the sdist and the wheel as a release does (python -m build, the wheel from the sdist) into dist/, then install
# the wheel into a fresh venv outside the checkout and use it as a user would: `gpuwatch version`, `gpuwatch check`
# on a simulated node (exit 0 on a machine without GPUs), and `gpuwatch demo` scraped over loopback and stopped.
# Everything runs from a directory outside the checkout, so nothing can import the checkout's gpuwatch instead.
# Run from anywhere (CI: from the repository root, as root). Leaves dist/gpuwatch_agent-VERSION{.tar.gz,-*.whl}.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

step() { echo "check-wheel: $*"; }
fail() {
  echo "check-wheel: FAILED: $*" >&2
  exit 1
}

work="$(mktemp -d)"
demo_pid=""
cleanup() {
  if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then kill -KILL "$demo_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gpuwatch/__init__.py)"
[ -n "$version" ] || fail "no __version__ = \"...\" line in gpuwatch/__init__.py"
step "gpuwatch-agent $version from $repo"

# --- build -------------------------------------------------------------------------------------------------------
python_ok() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
base_python=""
for candidate in python3 python3.13 python3.12 python3.11; do
  if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then
    base_python="$(command -v "$candidate")"
    break
  fi
done
[ -n "$base_python" ] || fail "no Python >= 3.11 with venv on PATH (Debian/Ubuntu: apt-get install python3-venv)"

if [ -x .venv/bin/python ] && .venv/bin/python -c 'import build' 2>/dev/null; then
  builder=.venv/bin/python
  step "building with the checkout's .venv ($(.venv/bin/python -m build --version | cut -d' ' -f1-2))"
else
  step "no .venv with build here: making a throwaway build venv"
  "$base_python" -m venv "$work/build-venv"
  "$work/build-venv/bin/python" -m pip install -q --upgrade pip build </dev/null >"$work/pip-build.log" 2>&1 || {
    tail -n 40 "$work/pip-build.log" >&2
    fail "pip could not install build into the build venv (the end of its log is above)"
  }
  builder="$work/build-venv/bin/python"
fi
mkdir -p dist
rm -f dist/gpuwatch_agent-* dist/gpuwatch-agent-*
step "python -m build: sdist, then the wheel from the sdist, into dist/"
"$builder" -m build -o dist . >"$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log" >&2
  fail "python -m build failed (the end of its log is above)"
}
sdist="$repo/dist/gpuwatch_agent-$version.tar.gz"
wheels=("$repo"/dist/gpuwatch_agent-"$version"-*.whl)
wheel="${wheels[0]}"
[ -f "$sdist" ] || fail "the sdist $sdist was not built (dist/ holds: $(ls dist))"
[ -f "$wheel" ] || fail "no dist/gpuwatch_agent-$version-*.whl was built (dist/ holds: $(ls dist))"
step "built $(basename "$sdist") and $(basename "$wheel")"

# --- what the wheel and the sdist hold ---------------------------------------------------------------------------
"$base_python" - "$wheel" "$sdist" "$version" <<'PY' || fail "the wheel or the sdist lacks a file (above)"
import sys, tarfile, zipfile

wheel, sdist, version = sys.argv[1:]
in_wheel = set(zipfile.ZipFile(wheel).namelist())
in_sdist = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
wanted = {
    wheel: (in_wheel, [
        "gpuwatch/_shipped/deploy/prometheus/gpuwatch-alerts.yml",
        f"gpuwatch_agent-{version}.dist-info/licenses/LICENSE",
    ]),
    sdist: (in_sdist, ["LICENSE", "CHANGELOG.md", "setup.py", "systemd/gpuwatch.service"]),
}
missing = [f"{archive.rsplit('/', 1)[-1]}: {name}" for archive, (names, want) in wanted.items()
           for name in want if name not in names]
for line in missing:
    print(f"check-wheel: missing {line}", file=sys.stderr)
sys.exit(1 if missing else 0)
PY
step "the wheel holds gpuwatch/_shipped/deploy/prometheus/gpuwatch-alerts.yml and LICENSE; the sdist LICENSE and CHANGELOG.md"

# --- a fresh venv, outside the checkout ----------------------------------------------------------------------------
venv="$work/venv"
"$base_python" -m venv "$venv"
step "installing the wheel into a fresh venv $venv (pip --no-cache-dir, not editable)"
"$venv/bin/python" -m pip install -q --no-cache-dir "$wheel" </dev/null >"$work/pip.log" 2>&1 || {
  tail -n 40 "$work/pip.log" >&2
  fail "pip could not install $(basename "$wheel") (the end of its log is above)"
}
cd "$work" # from here on nothing runs in the checkout: the current directory is not on sys.path's way to it
unset PYTHONPATH PYTHONHOME

imported="$("$venv/bin/python" -c 'import gpuwatch; print(gpuwatch.__file__)')"
case "$imported" in
  "$venv"/*) step "import gpuwatch: $imported" ;;
  *) fail "import gpuwatch found $imported, not the fresh venv's copy under $venv" ;;
esac

shown="$("$venv/bin/gpuwatch" version)" || fail "gpuwatch version exited $?"
first="$(head -n1 <<<"$shown")"
[[ "$first" == "gpuwatch $version (gpuwatch-agent, Python "* ]] ||
  fail "gpuwatch version says '$first', not 'gpuwatch $version (gpuwatch-agent, Python ...)'"
step "gpuwatch version: $first"

free_port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# An empty config: whatever /etc/gpuwatch/config.toml this machine has is not read; a state dir of our own.
: >"$work/config.toml"
"$venv/bin/gpuwatch" check --backend simulated --config "$work/config.toml" --state-dir "$work/check-state" \
  --listen "127.0.0.1:$(free_port)" >"$work/check.log" 2>&1 || {
  status=$?
  cat "$work/check.log" >&2
  fail "gpuwatch check --backend simulated exited $status (its output is above)"
}
step "gpuwatch check --backend simulated: exit 0 ($(grep -c '^\[ok\]' "$work/check.log") checks ok)"

port="$(free_port)"
"$venv/bin/gpuwatch" demo --config "$work/config.toml" --state-dir "$work/demo-state" --listen "127.0.0.1:$port" \
  >"$work/demo.log" 2>&1 &
demo_pid=$!
step "gpuwatch demo on 127.0.0.1:$port (pid $demo_pid): waiting for /metrics"
"$venv/bin/python" - "http://127.0.0.1:$port/metrics" "$demo_pid" "$version" "$work/metrics.txt" <<'PY' || {
import os, re, sys, time, urllib.request

url, pid, version, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
deadline = time.monotonic() + 60
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"check-wheel: gpuwatch demo exited before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"check-wheel: {url} did not answer in 60 s")
        time.sleep(0.3)
open(out, "w").write(text)
build = [line for line in text.splitlines() if line.startswith("gpuwatch_build_info{")]
if len(build) != 1 or f'version="{version}"' not in build[0] or not build[0].endswith(" 1.0"):
    sys.exit(f"check-wheel: gpuwatch_build_info is not version {version}: {build}")
gpu = [line for line in text.splitlines() if re.match(r'gpuwatch_gpu_up\{[^}]*gpu="0"[^}]*\} 1(\.0)?$', line)]
if not gpu:
    sys.exit("check-wheel: no gpuwatch_gpu_up{gpu=\"0\"} 1 for the simulated GPU 0")
print(f"check-wheel: /metrics: {build[0]}; {gpu[0]}; {len(text.splitlines())} lines")
# The runbooks every alert links to by default: rendered from the shipped docs/runbooks.md by the installed
# markdown-it-py, served by the installed agent.
runbooks = url.rsplit("/", 1)[0] + "/runbooks"
with urllib.request.urlopen(runbooks, timeout=10) as response:
    page = response.read().decode()
for anchor in ('id="gpuoverheating"', 'id="gpuxidcritical"'):
    if anchor not in page:
        sys.exit(f"check-wheel: {runbooks} has no {anchor} section")
print(f"check-wheel: {runbooks}: {len(page)} bytes, with the alerts' sections")
PY
  cat "$work/demo.log" >&2
  fail "the demo's /metrics is not what it should be (the demo's log is above)"
}

kill -TERM "$demo_pid"
status=0
wait "$demo_pid" || status=$?
demo_pid=""
[ "$status" = 0 ] || {
  cat "$work/demo.log" >&2
  fail "gpuwatch demo exited $status on SIGTERM, not 0 (its log is above)"
}
grep -q Traceback "$work/demo.log" && {
  cat "$work/demo.log" >&2
  fail "gpuwatch demo logged a traceback (above)"
}
step "gpuwatch demo stopped on SIGTERM: exit 0"
step "ok: dist/$(basename "$sdist") and dist/$(basename "$wheel") install and run"
