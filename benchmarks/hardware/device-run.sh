#!/usr/bin/env bash
# Every hardware check of issues #2, #4, #9, 17 and #20 on one NVIDIA GPU node, in parts of under 10 minutes each.
# Read-only on the GPU: nothing here changes clocks, power limits, persistence, compute mode or MIG.
#
#   bash benchmarks/hardware/device-run.sh nvml    # ~1.5 min: environment, nvidia-smi -q side by side, every NVML
#                                                  #   call of the backend as the driver answers it, the floor, GPM
#   bash benchmarks/hardware/device-run.sh probe   # ~2.5 min: the probe study, the agent scraped
#   bash benchmarks/hardware/device-run.sh cost    # ~2.5 min: gpuwatch vs nvitop-exporter vs nvidia-smi per scrape
#   bash benchmarks/hardware/device-run.sh check   # ~5 min: the probe's checked result (issues #33, #36): compute errors
#                                                  #   over N probes, a corrupted result caught, false alarms
#   bash benchmarks/hardware/device-run.sh diag    # ~2 min: gpuwatch diag --level 1 on every GPU, level 2 on GPU 0
#   bash benchmarks/hardware/device-run.sh fabric  # ~10 s: NVLink fabric info (v3, v2) raw and as gpuwatch reads it,
#                                                  #   NVSwitches, the fabric manager, RDMA ports, MIG (issue #34)
#   bash benchmarks/hardware/device-run.sh cvfloor # ~2 min: where the idle probe's spread comes from (issue #36):
#                                                  #   every matmul timed from cold beside the SM clock, cut into windows
#   bash benchmarks/hardware/device-run.sh probe cost   # several parts, one after another
#
# Run from the repository root, with the wheels of fetch-wheels.sh in .whl/ (installed into /tmp/site). Results go
# to $OUT (the device tool's folder; default /tmp/gpuwatch-hardware): per part a summary-PART.md to read first; the
# raw JSON, the logs and the scraped pages in raw-PARTS.tar.gz (the device tool returns at most 8 files).
set -uo pipefail

[ $# -gt 0 ] || set -- usage
for part in "$@"; do
  case "$part" in
    nvml | probe | cost | check | diag | fabric | cvfloor) ;;
    *)
      echo "usage: $0 nvml|probe|cost|check|diag|fabric|cvfloor..." >&2
      exit 2
      ;;
  esac
done
parts=("$@")

OUT=${OUT:-/tmp/gpuwatch-hardware}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
HERE=benchmarks/hardware
STATE=${GPUWATCH_HW_STATE:-/tmp/gpuwatch-hardware-state}
SCRATCH=$(mktemp -d) # what the summary already holds: only 8 files come back from the device
RAW=$(mktemp -d)     # everything else, packed into one archive at the end
LOG=$RAW/log-setup.txt
SUMMARY=$RAW/summary-setup.md

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
SURVEY_FLAGS=()
if [ "${DRY_RUN:-0}" = 1 ]; then
  GPUWATCH_FLAGS=(--backend simulated --gpus 1)
  SMI_FLAGS=(--backend simulated --match-index -- --gpus 1)
  STUDY_FLAGS=(--dry-run)
  GPM_FLAGS=(--dry-run)
  SURVEY_FLAGS=(--dry-run)
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
  local port=9845 pid ok=0 worker=""
  command -v curl >/dev/null || { echo "no curl on this machine: this step needs it"; return 1; }
  "${GW[@]}" run "${GPUWATCH_FLAGS[@]}" --poll-interval 1 --probe-interval 30 --listen 127.0.0.1:$port --state-dir "$STATE" &
  pid=$!
  for _ in $(seq 100); do
    curl -fsS -o /dev/null http://127.0.0.1:$port/healthz 2>/dev/null && { ok=1; break; }
    sleep 0.2
  done
  [ $ok = 1 ] || { echo "the agent did not become healthy within 20 s"; kill -KILL $pid; wait $pid; return 1; }
  sleep 3
  curl -sS --max-time 10 -D - http://127.0.0.1:$port/metrics -o "$RAW/metrics-start.txt"
  curl -sS --max-time 10 -w 'healthz: %{http_code} in %{time_total} s\n' http://127.0.0.1:$port/healthz
  for _ in $(seq 60); do # the first probe runs one interval (30 s) after start
    [ -n "$worker" ] || worker=$(ps -eo pid,ppid,args | grep -F 'gpuwatch.probe.worker' | grep -v grep)
    grep -q '^gpuwatch_probe_runs_total{.*result="ok".*} [1-9]' "$RAW/metrics-probe.txt" 2>/dev/null && break
    sleep 1.5
    curl -sS --max-time 10 http://127.0.0.1:$port/metrics -o "$RAW/metrics-probe.txt"
  done
  # The verdict after the probe (issue #36): /health/gpus as JSON, one line per GPU in the summary.
  curl -sS --max-time 10 "http://127.0.0.1:$port/health/gpus?format=json" -o "$RAW/health-after-probe.json"
  "$PY" - "$RAW/health-after-probe.json" "$RAW/verdict.txt" <<'PYEOF'
import json, sys

try:
    doc = json.load(open(sys.argv[1]))
    gpus = doc.get("gpus") or []
    lines = [
        f"GPU {g.get('index')} ({g.get('uuid')}): {g.get('state')}, action {g.get('action')}"
        + (f" ({'; '.join(g.get('evidence') or [])})" if g.get("evidence") else "")
        for g in gpus
    ] or [f"no GPUs in the answer: {json.dumps(doc)[:300]}"]
except (OSError, ValueError, AttributeError) as exc:
    lines = [f"no verdict read: {exc}"]
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
  for _ in 1 2 3 4 5; do curl -sS --max-time 10 -o /dev/null \
    -w 'scrape: %{http_code} %{size_download} B in %{time_total} s\n' http://127.0.0.1:$port/metrics; done
  echo "the agent's probe worker (isolated mode: python -I): ${worker:-not seen}"
  local t0=$SECONDS
  kill -TERM $pid
  (sleep 20 && kill -KILL $pid 2>/dev/null && echo "the agent was still running 20 s after SIGTERM: killed") &
  wait $pid
  echo "agent exit status $? after SIGTERM, $((SECONDS - t0)) s"
  "$PY" - "$RAW/metrics-start.txt" "$RAW/metrics-probe.txt" <<'PYEOF'
import sys
from prometheus_client.parser import text_string_to_metric_families

for path in sys.argv[1:]:
    families = list(text_string_to_metric_families(open(path).read()))
    samples = [s for f in families for s in f.samples]
    probe = [s for s in samples if s.name.startswith("gpuwatch_probe_") and s.name != "gpuwatch_probe_runs_total"]
    print(f"{path}: parses; {len(families)} families, {len(samples)} samples, {len(probe)} probe readings")
PYEOF
}

for part in "${parts[@]}"; do
  LOG=$RAW/log-$part.txt
  SUMMARY=$OUT/summary-$part.md
  : >"$LOG"
  : >"$SUMMARY"
  if [ "$part" = nvml ]; then
    say "# gpuwatch hardware checks, part nvml ($(date -u +%FT%TZ))"
    # Typical: 20 + 5 + 30 + 45 s.
    step "environment"
    environment >>"$LOG" 2>&1
    say "- environment: exit $?"
    grep -E 'Driver Version|CUDA Version|Product Name|Persistence Mode' "$LOG" | head -5 | sed 's/^/    /' >>"$SUMMARY"
    run "snapshot beside nvidia-smi -q" 90 \
      "$PY" $HERE/smi_compare.py --live --gpuwatch "${GW[*]}" --json "$RAW/smi_compare.json" --markdown "$SCRATCH/smi.md" \
      "${SMI_FLAGS[@]}"
    cat "$SCRATCH/smi.md" >>"$SUMMARY" 2>/dev/null
    run "every NVML call of the backend, and the floor" 120 "$PY" $HERE/nvml_survey.py \
      --out "$OUT/nvml-backend-calls.json" --markdown "$SCRATCH/survey.md" "${SURVEY_FLAGS[@]}"
    cat "$SCRATCH/survey.md" >>"$SUMMARY" 2>/dev/null
    run "real utilization (GPM) beside a matmul" 75 "$PY" $HERE/gpm_check.py --out "$RAW/gpm_check.json" \
      --markdown "$SCRATCH/gpm.md" "${GPM_FLAGS[@]}"
    cat "$SCRATCH/gpm.md" >>"$SUMMARY" 2>/dev/null
  elif [ "$part" = check ]; then
    say "# gpuwatch hardware checks, part check ($(date -u +%FT%TZ))"
    # Every engine installed: 10 checked probes (bf16 8192), one with an element corrupted on the device, then the
    # false-alarm study at 8192 (each dtype, 100 fresh inputs). The summary's first lines are what the issue asks:
    # "compute errors over N probes" and "corrupted result caught: yes|no".
    CHECK_FLAGS=()
    [ "${DRY_RUN:-0}" = 1 ] && CHECK_FLAGS=(--dry-run --probes 2 --seeds 5)
    run "checked probe" 540 "$PY" $HERE/probe_check.py --out "$RAW/probe_check.json" --markdown "$SCRATCH/check.md" \
      "${CHECK_FLAGS[@]}" ${PROBE_CHECK_ARGS:-}
    cat "$SCRATCH/check.md" >>"$SUMMARY" 2>/dev/null
  elif [ "$part" = fabric ]; then
    say "# gpuwatch hardware checks, part fabric ($(date -u +%FT%TZ))"
    # Issue #36's "the fabric reads, NotSupported where the vendor says so" and "MIG only as reported disabled".
    FABRIC_FLAGS=()
    [ "${DRY_RUN:-0}" = 1 ] && FABRIC_FLAGS=(--dry-run)
    run "fabric reads" 60 "$PY" $HERE/fabric_reads.py --out "$RAW/fabric_reads.json" --markdown "$SCRATCH/fabric.md" \
      "${FABRIC_FLAGS[@]}"
    cat "$SCRATCH/fabric.md" >>"$SUMMARY" 2>/dev/null
  elif [ "$part" = probe ]; then
    say "# gpuwatch hardware checks, part probe ($(date -u +%FT%TZ))"
    rm -rf "$STATE"
    # Typical: 200 + 50 s. The limits add up to more than the device's 600 s only if steps hang; each table goes into
    # the summary as soon as its step ends, so whatever finished comes back.
    run "probe study" 330 "$PY" $HERE/probe_study.py --state-dir "$STATE" --out "$RAW/probe_study.json" \
      --markdown "$SCRATCH/study.md" "${STUDY_FLAGS[@]}" ${PROBE_STUDY_ARGS:-}
    cat "$SCRATCH/study.md" >>"$SUMMARY" 2>/dev/null
    step "agent scraped by curl"
    started=$SECONDS
    agent_scraped >>"$LOG" 2>&1
    say "- agent scraped by curl: exit $?, $((SECONDS - started)) s"
    say "- the verdict after its probe (/health/gpus):"
    sed 's/^/    /' "$RAW/verdict.txt" >>"$SUMMARY" 2>/dev/null
  elif [ "$part" = cvfloor ]; then
    say "# gpuwatch hardware checks, part cvfloor ($(date -u +%FT%TZ))"
    # Issue #36's "CV floor": 10 trials from idle (~12 s each), the first left out. CV_FLOOR_ARGS passes flags.
    FLOOR_FLAGS=()
    [ "${DRY_RUN:-0}" = 1 ] && FLOOR_FLAGS=(--dry-run --trials 4)
    run "cv floor" 300 "$PY" $HERE/cv_floor.py --out "$RAW/cv_floor.json" --markdown "$SCRATCH/floor.md" \
      "${FLOOR_FLAGS[@]}" ${CV_FLOOR_ARGS:-}
    cat "$SCRATCH/floor.md" >>"$SUMMARY" 2>/dev/null
  elif [ "$part" = diag ]; then
    say "# gpuwatch hardware checks, part diag ($(date -u +%FT%TZ))"
    # Issue #33: level 1 must take at most 30 s per GPU (the GPUs at once) and pass on a healthy GPU; the details
    # (GiB covered, GB/s against the link's nominal, TFLOP/s, clocks, power, temperature) go into the summary. Level 2
    # runs the sustained matmul for 30 s on GPU 0: the throttling the probe's one second cannot see. dcgmi diag -r 1/2
    # is folded in where DCGM is installed (about 1-2 minutes more).
    rm -rf "$STATE"
    for level in ${DIAG_LEVELS:-1 2}; do # DIAG_LEVELS=1: level 1 only (what issue #36 asks), a minute less
      gpus=()
      [ "$level" = 2 ] && gpus=(--gpu 0)
      run "gpuwatch diag --level $level ${gpus[*]}" 280 "${GW[@]}" diag "${GPUWATCH_FLAGS[@]}" --state-dir "$STATE" \
        --level "$level" "${gpus[@]}" --json
      "$PY" - "$LOG" "$level" >>"$SUMMARY" 2>>"$LOG" <<'PYEOF'
import json, sys

text = open(sys.argv[1]).read()
start = text.rfind('{\n  "level": ' + sys.argv[2])
if start < 0:
    print(f"    (no JSON from level {sys.argv[2]}: see the log)")
    sys.exit(0)
doc = json.JSONDecoder().raw_decode(text[start:])[0]
for gpu in doc["gpus"]:
    total = sum(t["seconds"] for t in gpu["tests"])
    print(f"    GPU {gpu['index']} ({gpu['uuid']}), tests {total:.1f} s:")
    for t in gpu["tests"]:
        print(f"      {t['name']}: {t['result']} in {t['seconds']:.1f} s: {t['detail']}")
PYEOF
    done
    cp "$STATE/diag_results.json" "$RAW/" 2>/dev/null
  else
    say "# gpuwatch hardware checks, part cost ($(date -u +%FT%TZ))"
    B=benchmarks/agent_cost.py
    D=${COST_DURATION:-40}
    # One nvidia-smi per scrape with every field it knows: what nvidia_gpu_exporter does by default (its AUTO mode
    # reads the field list from --help-query-gpu once, then queries all of it on every scrape). A short list if the
    # driver rejects that.
    Q=$(timeout 30 nvidia-smi --help-query-gpu | sed -n 's/^"\([^"]*\)".*/\1/p' | paste -sd, -)
    if ! timeout 30 nvidia-smi --query-gpu="$Q" --format=csv >/dev/null 2>&1; then
      Q=index,uuid,name,temperature.gpu,temperature.memory,power.draw,enforced.power.limit,clocks.sm,clocks.mem
      Q=$Q,clocks_event_reasons.active,utilization.gpu,utilization.memory,memory.used,memory.total,pstate
    fi
    say "- nvidia-smi fields per scrape: $(tr ',' '\n' <<<"$Q" | wc -l)"
    run "gpuwatch" 150 "$PY" $B --duration "$D" --label gpuwatch --save "$RAW/cost-gpuwatch.json" \
      -- "${GPUWATCH_FLAGS[@]}" --poll-interval 1 --probe-interval 0
    run "nvitop-exporter 1.7.2" 150 "$PY" $B --duration "$D" --label nvitop-exporter --save "$RAW/cost-nvitop.json" \
      --agent-cmd "$PY -m nvitop_exporter --bind-address 127.0.0.1 --port {port} --interval 1"
    run "nvidia-smi per scrape" 150 "$PY" $B --duration "$D" --label nvidia-smi --save "$RAW/cost-nvidia-smi.json" \
      --exec-csv --exec-per-scrape "$(command -v nvidia-smi) --query-gpu=$Q --format=csv"
    step "compare"
    {
      echo
      echo '```'
      reports=()
      for arm in gpuwatch nvitop nvidia-smi; do [ -f "$RAW/cost-$arm.json" ] && reports+=("$RAW/cost-$arm.json"); done
      [ ${#reports[@]} -gt 0 ] && "$PY" $B --compare "${reports[@]}"
      echo '```'
    } >>"$SUMMARY" 2>>"$LOG"
  fi
done

# Everything raw in one archive (the device tool returns at most 8 files), the summaries beside it.
tar -czf "$OUT/raw-$(IFS=-; echo "${parts[*]}").tar.gz" -C "$RAW" . 2>/dev/null
for part in "${parts[@]}"; do
  echo
  cat "$OUT/summary-$part.md"
done
