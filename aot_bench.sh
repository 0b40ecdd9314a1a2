#!/usr/bin/env bash
# AOT memory check of a preset on the local devices or a TPU slice, knobs as environment variables:
#   PRESET (default cpu-tiny)  TRAINER_SLICE (a slice such as tpu7x:4x4x8; default: local devices)
#   TRAINER_ARGV  ENGINE_FLAGS  ENGINE  STAGE_BEFORE_UPDATE (on|off)  AOT_LAYERS (compile N and 2N layers and
#   extrapolate; default 0 = full depth)  MICRO_STEPS (for the predicted step; default: the preset's)
#   ROUTING_PROFILE  SEED (the micro-batch whose replay chance the estimate reads)
#   AOT_MIN_HEADROOM (percent of a device's memory the peak must leave free; default 5)
#   AB_ARMS (a same-pod A/B's arms, as the render takes them: every arm's programs compiled, the
#   A/B refused when one does not fit; its JSON is what the render's AB_AOT_REPORT takes)
#   PYTHON (interpreter, default python3)
# e.g. PRESET=cpu-tiny TRAINER_SLICE=v5e:2x2 bash aot_bench.sh
# The report goes to stdout and logs/aot-bench-<time>.log, its JSON to logs/aot-bench-<time>.json.
# Exit status: 0 fits with the margin free, 1 does not fit, fits inside the margin or a program
# failed to compile, 2 bad input.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$here/logs"
log="$here/logs/aot-bench-$stamp.log"
# Each knob that is set goes to `aot` as its flag, untouched: the defaults are the command's own.
flags=(PRESET=--preset TRAINER_SLICE=--target TRAINER_ARGV=--trainer-argv ENGINE_FLAGS=--engine-flags
  ENGINE=--engine STAGE_BEFORE_UPDATE=--stage-before-update AOT_LAYERS=--layers
  MICRO_STEPS=--micro-steps SEED=--seed ROUTING_PROFILE=--routing-profile
  AOT_MIN_HEADROOM=--min-headroom AB_ARMS=--ab-arms)
args=(--output="$here/logs/aot-bench-$stamp.json")
for pair in "${flags[@]}"; do
  knob="${pair%%=*}"
  if [[ -n "${!knob:-}" ]]; then
    args+=("${pair#*=}=${!knob}")
  fi
done
if [[ -n "${TRAINER_SLICE:-}" && -z "${JAX_PLATFORMS:-}" ]]; then
  export JAX_PLATFORMS=cpu  # a TPU slice is compiled from this host: no TPU runtime needed here
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
set +e
"${PYTHON:-python3}" -m rl_trainer_bench.cli aot "${args[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "aot_bench: log $log" >&2
exit "$status"
