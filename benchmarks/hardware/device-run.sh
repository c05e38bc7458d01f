#!/usr/bin/env bash
# Every hardware check of issues #2, #4 and #9 on one NVIDIA GPU node, in two commands of under 10 minutes each.
# Read-only on the GPU: nothing here changes clocks, power limits, persistence, compute mode or MIG.
#
#   bash benchmarks/hardware/device-run.sh probe   # ~7 min: nvidia-smi -q side by side, the agent scraped, the probe study
#   bash benchmarks/hardware/device-run.sh cost    # ~5 min: gpuwatch vs nvitop-exporter vs nvidia-smi per scrape
#
# Run from the repository root, with the wheels of fetch-wheels.sh in .whl/ (installed into /tmp/site). Results go
# to $OUT (the device tool's folder; default /tmp/gpuwatch-hardware), at most 8 files per part: a summary.md to read
# first, the raw JSON beside it, and log.txt with every command's output.
set -uo pipefail

part=${1:-}
case "$part" in
  probe | cost) ;;
  *)
    echo "usage: $0 probe|cost" >&2
    exit 2
    ;;
esac

OUT=${OUT:-/tmp/gpuwatch-hardware}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
HERE=benchmarks/hardware
LOG=$OUT/log-$part.txt
SUMMARY=$OUT/summary-$part.md
STATE=${GPUWATCH_HW_STATE:-/tmp/gpuwatch-hardware-state}
SCRATCH=$(mktemp -d) # what the summary already holds: only 8 files come back from the device
: >"$LOG"
: >"$SUMMARY"

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$LOG" >&2; }
# Run a step with a time limit (the device allows 10 minutes a command; a hung step must not take the others with
# it); its output goes to the log, its exit status to the summary (124: it ran out of time). A failed step never
# stops the rest.
run() {
  local name=$1 limit=$2
  shift 2
  step "$name"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  say "- $name: exit $rc, $((SECONDS - started)) s (limit $limit s)"
  return $rc
}

# DRY_RUN=1: the same steps on a machine without a GPU (the simulated node, a fake nvidia-smi printing the H100
# fixture, PYTHON=.venv/bin/python), so a slip in this script costs no device time. Steps that need NVML fail there.
GPUWATCH_FLAGS=(--backend nvml)
SMI_FLAGS=()
STUDY_FLAGS=()
GPM_FLAGS=()
if [ "${DRY_RUN:-0}" = 1 ]; then
  GPUWATCH_FLAGS=(--backend simulated --gpus 1)
  SMI_FLAGS=(--backend simulated --match-index -- --gpus 1)
  STUDY_FLAGS=(--dry-run)
  GPM_FLAGS=(--dry-run)
  fake=$(mktemp -d)
  fixture=$PWD/tests/fixtures/h100/nvidia-smi-q.txt
  cat >"$fake/nvidia-smi" <<FAKE
#!/bin/sh
case "\$1" in
  -q) cat "$fixture" ;;
  --help-query-gpu) printf '"index"\n"uuid"\n"temperature.gpu"\n"power.draw"\n' ;;
  --query-gpu=*) printf 'index, uuid, temperature.gpu, power.draw [W]\n0, GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3, 31, 71.98 W\n' ;;
  *) grep -m3 -E 'Driver Version|Product Name' "$fixture" ;;
esac
FAKE
  chmod +x "$fake/nvidia-smi"
  export PATH=$fake:$PATH
elif [ -d .whl ] && compgen -G '.whl/*.whl' >/dev/null; then
  # A wheel is a zip file: where pip is missing or refuses one (a glibc older than its tag), unpack them all.
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$LOG" 2>&1 ||
    $PY -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl ||
    { echo "installing .whl/ into /tmp/site failed: see $LOG" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
  export PATH=/tmp/site/bin:$PATH
else
  echo "no wheels in .whl/: run benchmarks/hardware/fetch-wheels.sh here first and carry .whl" >&2
  exit 1
fi
GW=("$PY" -m gpuwatch)


# Each command bounded: a function cannot run under timeout(1) as a whole.
environment() {
  date -u
  uname -a
  timeout 30 nvidia-smi -q | sed -n '1,40p'
  timeout 30 nvidia-smi
  timeout 60 "$PY" -c 'import sys, pynvml, torch
print(sys.version); print("nvidia-ml-py", pynvml.__file__); print("torch", torch.__version__, torch.version.cuda)'
  timeout 60 "$PY" -c 'import cupy; print("cupy", cupy.__version__)'
  timeout 60 "${GW[@]}" version
  timeout 60 "${GW[@]}" check "${GPUWATCH_FLAGS[@]::2}" --state-dir "$STATE" --listen 127.0.0.1:9845
}

# `gpuwatch run` on the real GPU, scraped by curl: once at start, once after the agent's own probe ran (so the
# gpuwatch_probe_* series come from the agent's scheduler, NSpid matching included); then SIGTERM, timed.
agent_scraped() {
  local port=9845 pid ok=0
  command -v curl >/dev/null || { echo "no curl on this machine: this step needs it"; return 1; }
  "${GW[@]}" run "${GPUWATCH_FLAGS[@]}" --poll-interval 1 --probe-interval 30 --listen 127.0.0.1:$port --state-dir "$STATE" &
  pid=$!
  for _ in $(seq 100); do
    curl -fsS -o /dev/null http://127.0.0.1:$port/healthz 2>/dev/null && { ok=1; break; }
    sleep 0.2
  done
  [ $ok = 1 ] || { echo "the agent did not become healthy within 20 s"; kill -KILL $pid; wait $pid; return 1; }
  sleep 3
  curl -sS --max-time 10 -D - http://127.0.0.1:$port/metrics -o "$OUT/metrics-start.txt"
  curl -sS --max-time 10 -w 'healthz: %{http_code} in %{time_total} s\n' http://127.0.0.1:$port/healthz
  for _ in $(seq 60); do # the first probe runs one interval (30 s) after start
    grep -q '^gpuwatch_probe_runs_total{.*result="ok".*} [1-9]' "$OUT/metrics-probe.txt" 2>/dev/null && break
    sleep 1.5
    curl -sS --max-time 10 http://127.0.0.1:$port/metrics -o "$OUT/metrics-probe.txt"
  done
  for _ in 1 2 3 4 5; do curl -sS --max-time 10 -o /dev/null \
    -w 'scrape: %{http_code} %{size_download} B in %{time_total} s\n' http://127.0.0.1:$port/metrics; done
  local t0=$SECONDS
  kill -TERM $pid
  (sleep 20 && kill -KILL $pid 2>/dev/null && echo "the agent was still running 20 s after SIGTERM: killed") &
  wait $pid
  echo "agent exit status $? after SIGTERM, $((SECONDS - t0)) s"
  "$PY" - "$OUT/metrics-start.txt" "$OUT/metrics-probe.txt" <<'PYEOF'
import sys
from prometheus_client.parser import text_string_to_metric_families

for path in sys.argv[1:]:
    families = list(text_string_to_metric_families(open(path).read()))
    samples = [s for f in families for s in f.samples]
    probe = [s for s in samples if s.name.startswith("gpuwatch_probe_") and s.name != "gpuwatch_probe_runs_total"]
    print(f"{path}: parses; {len(families)} families, {len(samples)} samples, {len(probe)} probe readings")
PYEOF
}

if [ "$part" = probe ]; then
  say "# gpuwatch hardware checks, part probe ($(date -u +%FT%TZ))"
  rm -rf "$STATE"
  # Typical: 20 + 5 + 300 + 40 + 50 s. The limits add up to more than the device's 600 s only if steps hang; each table
  # goes into the summary as soon as its step ends, so whatever finished comes back.
  step "environment"
  environment >>"$LOG" 2>&1
  say "- environment: exit $?"
  run "snapshot beside nvidia-smi -q" 90 \
    "$PY" $HERE/smi_compare.py --live --gpuwatch "${GW[*]}" --json "$OUT/smi_compare.json" --markdown "$SCRATCH/smi.md" \
    "${SMI_FLAGS[@]}"
  cat "$SCRATCH/smi.md" >>"$SUMMARY" 2>/dev/null
  run "probe study" 390 "$PY" $HERE/probe_study.py --state-dir "$STATE" --out "$OUT/probe_study.json" \
    --markdown "$SCRATCH/study.md" "${STUDY_FLAGS[@]}"
  cat "$SCRATCH/study.md" >>"$SUMMARY" 2>/dev/null
  run "real utilization (GPM) beside a matmul" 75 "$PY" $HERE/gpm_check.py --out "$OUT/gpm_check.json" \
    --markdown "$SCRATCH/gpm.md" "${GPM_FLAGS[@]}"
  cat "$SCRATCH/gpm.md" >>"$SUMMARY" 2>/dev/null
  step "agent scraped by curl"
  started=$SECONDS
  agent_scraped >>"$LOG" 2>&1
  say "- agent scraped by curl: exit $?, $((SECONDS - started)) s"
else
  say "# gpuwatch hardware checks, part cost ($(date -u +%FT%TZ))"
  B=benchmarks/agent_cost.py
  D=${COST_DURATION:-60}
  # One nvidia-smi per scrape with every field it knows: what nvidia_gpu_exporter does by default (its AUTO mode
  # reads the field list from --help-query-gpu once, then queries all of it on every scrape). A short list if the
  # driver rejects that.
  Q=$(timeout 30 nvidia-smi --help-query-gpu | sed -n 's/^"\([^"]*\)".*/\1/p' | paste -sd, -)
  if ! timeout 30 nvidia-smi --query-gpu="$Q" --format=csv >/dev/null 2>&1; then
    Q=index,uuid,name,temperature.gpu,temperature.memory,power.draw,enforced.power.limit,clocks.sm,clocks.mem
    Q=$Q,clocks_event_reasons.active,utilization.gpu,utilization.memory,memory.used,memory.total,pstate
  fi
  say "- nvidia-smi fields per scrape: $(tr ',' '\n' <<<"$Q" | wc -l)"
  run "gpuwatch" 150 "$PY" $B --duration "$D" --label gpuwatch --save "$OUT/cost-gpuwatch.json" \
    -- "${GPUWATCH_FLAGS[@]}" --poll-interval 1 --probe-interval 0
  run "nvitop-exporter 1.7.2" 150 "$PY" $B --duration "$D" --label nvitop-exporter --save "$OUT/cost-nvitop.json" \
    --agent-cmd "$PY -m nvitop_exporter --bind-address 127.0.0.1 --port {port} --interval 1"
  run "nvidia-smi per scrape" 150 "$PY" $B --duration "$D" --label nvidia-smi --save "$OUT/cost-nvidia-smi.json" \
    --exec-csv --exec-per-scrape "$(command -v nvidia-smi) --query-gpu=$Q --format=csv"
  step "compare"
  {
    echo
    echo '```'
    reports=()
    for arm in gpuwatch nvitop nvidia-smi; do [ -f "$OUT/cost-$arm.json" ] && reports+=("$OUT/cost-$arm.json"); done
    [ ${#reports[@]} -gt 0 ] && "$PY" $B --compare "${reports[@]}"
    echo '```'
  } >>"$SUMMARY" 2>>"$LOG"
fi

echo
cat "$SUMMARY"
