#!/usr/bin/env bash
# The accelerator results in one run: the gpu-small engine step and MFU; the main job's A/B
# (STAGE_BEFORE_UPDATE off, on) at the accelerator's default design, with each stage's hidden
# fraction; and the device bytes of a same-process A/B whose two settings compile two programs
# over one training state, beside the main A/B's one program (`benchmarks/ab/ab_one_state.py`).
#
# On one NVIDIA H200 (JAX with CUDA, no internet), from the repository root:
#     OUT=/some/folder benchmarks/driver/gpu_suite.sh
# Everything it keeps lands in $OUT, at most 8 files: env.txt, engine_step.txt, ab.txt, ab.json,
# ab.log, one_state.jsonl, two_programs.log, suite.log. Budget: under 9 minutes in all (each part
# has its own time limit).
#
# Dry run on any CPU (cpu-tiny, 8 host devices, a temporary OUT unless one is given):
#     benchmarks/driver/gpu_suite.sh --cpu        (or DRY_RUN=1 benchmarks/driver/gpu_suite.sh)
#
# Remakes BENCHMARKS.md's driver suite (not run yet);
# benchmarks/reports/accelerator-suite_h200_2026-11-30.md.
set -uo pipefail
cd "$(dirname "$0")/../.."

mode=gpu
if [[ "${1:-}" == "--cpu" || "${DRY_RUN:-0}" == "1" ]]; then
  mode=cpu
fi
if [[ "$mode" == cpu ]]; then
  PRESET=cpu-tiny
  STEPS="${STEPS:-3}"
  export JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8
  OUT="${OUT:-$(mktemp -d -t gpu_suite_dry.XXXXXX)}"
  LIMIT_SCALE="${LIMIT_SCALE:-3}"  # a 2-core CPU compiles and steps far slower than the GPU
else
  PRESET=gpu-small
  STEPS="${STEPS:-6}"
  if [[ -z "${OUT:-}" ]]; then
    echo "gpu_suite.sh: set OUT to the folder for the results (or pass --cpu for a dry run)" >&2
    exit 2
  fi
fi
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$OUT/suite.log"
: >"$log"
worst=0

say() { echo "[gpu_suite $(date -u +%H:%M:%S)] $*" | tee -a "$log"; }

# part NAME LIMIT_S OUTPUT_FILE COMMAND...: run with a time limit, keep its output, remember failures.
part() {
  local name=$1 limit=$(($2 * ${LIMIT_SCALE:-1})) output=$3
  shift 3
  say "$name: $* (limit ${limit}s)"
  local started=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" >"$output" 2>&1
  local rc=$?
  say "$name: exit $rc after $((SECONDS - started))s"
  if ((rc != 0)); then
    tail -n 20 "$output" | sed "s/^/  $name| /" | tee -a "$log"
    ((rc > worst)) && worst=$rc
  fi
  return 0
}

say "mode=$mode preset=$PRESET steps=$STEPS out=$OUT"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
  echo "host: $(uname -a)"
  echo "cpus: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PYTHON" - <<'PY'
import importlib.metadata as m
import sys
print("python:", sys.version.split()[0])
for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "numpy", "optax", "matplotlib"):
    try:
        print(f"{name}: {m.version(name)}")
    except m.PackageNotFoundError:
        pass
import jax
print("devices:", jax.devices())
PY
} >"$OUT/env.txt" 2>&1

if [[ -f benchmarks/driver/engine_step.py ]]; then
  part engine_step 110 "$OUT/engine_step.txt" "$PYTHON" benchmarks/driver/engine_step.py --preset "$PRESET"
else
  say "engine_step: benchmarks/driver/engine_step.py is not in this tree; skipped"
fi

# The A/B writes ab.json, ab.png, ab.txt, ab.log and one results file per arm into a scratch
# folder; only the report files come back (the arms' records are all inside ab.json). It runs
# under the live-bytes sampler: one bench, so its figure is one arm's bytes. On the accelerator it
# takes the platform's default design (no --steps); the CPU dry run keeps it short.
scratch=$(mktemp -d -t gpu_suite_ab.XXXXXX)
design=()
[[ "$mode" == cpu ]] && design=(--steps "$STEPS" --blocks 3)
part ab 250 "$scratch/terminal.txt" "$PYTHON" benchmarks/ab/ab_one_state.py one-program ab \
  --preset "$PRESET" --arms off,on "${design[@]}" --out "$scratch/ab"
for file in ab.json ab.txt ab.log; do
  [[ -f "$scratch/ab/$file" ]] && cp "$scratch/ab/$file" "$OUT/$file"
done
grep -h '^{"label"' "$scratch/terminal.txt" >>"$OUT/one_state.jsonl"
if [[ -f "$scratch/ab/ab.txt" ]]; then
  grep -E '^(delta|verdict|noise floor)' "$scratch/ab/ab.txt" | sed 's/^/  /' | tee -a "$log"
else
  cp "$scratch/terminal.txt" "$OUT/ab.log"  # no report: keep what the command printed
fi

# Two settings of different programs (the ragged buffer's size) over one training state: its
# live bytes should be the one-program A/B's, where a state per bench would add a whole state.
part two_programs 170 "$OUT/two_programs.log" "$PYTHON" benchmarks/ab/ab_one_state.py two-programs \
  ab --preset "$PRESET" --arms "narrow:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2" \
  --order written --steps 1 --out "$scratch/two"
grep -h '^{"label"' "$OUT/two_programs.log" >>"$OUT/one_state.jsonl"
cat "$OUT/one_state.jsonl" | tee -a "$log"
rm -rf "$scratch"

say "done: worst exit $worst; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$worst"
