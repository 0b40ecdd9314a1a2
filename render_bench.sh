#!/usr/bin/env bash
# Render a launcher's DRY_RUN output into a single-slice bench JobSet, knobs as environment variables:
#   LAUNCH_RENDER TRAINER_JOBSET BENCH_NAME ENGINE_FLAGS ENGINE LIBTPU_FLAGS TRAINER_ARGV ORCH_ARGV
#   TRAINER_SLICE PROFILE_STEPS RESULTS_URI STEPS MICRO_STEPS MAX_RESTARTS AB_ARMS AB_BUDGET AB_SCHEDULE_SEED
#   AB_STEP_TIME AB_STEP_NOISE AB_AOT_REPORT DRIVER_ENV OUTPUT
#   AOT_JOB AOT_NODE_SELECTOR (also render the AOT job: aot and hlo-overlap in the trainer's image)
# e.g. LAUNCH_RENDER=dryrun.txt TRAINER_SLICE=tpu7x:4x4x8 STEPS=20 OUTPUT=bench.yaml ./render_bench.sh
# Each value goes to render_bench.py as the flag of the same name (lower case, dashes), untouched,
# so both entry points validate it the same way. PYTHON picks the interpreter (default python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
knobs=(LAUNCH_RENDER TRAINER_JOBSET BENCH_NAME ENGINE_FLAGS ENGINE LIBTPU_FLAGS TRAINER_ARGV ORCH_ARGV
  TRAINER_SLICE PROFILE_STEPS RESULTS_URI STEPS MICRO_STEPS MAX_RESTARTS AB_ARMS AB_BUDGET AB_SCHEDULE_SEED
  AB_STEP_TIME AB_STEP_NOISE AB_AOT_REPORT DRIVER_ENV OUTPUT
  AOT_JOB AOT_NODE_SELECTOR)
args=()
for knob in "${knobs[@]}"; do
  if [[ -n "${!knob:-}" ]]; then
    flag="--$(tr 'A-Z_' 'a-z-' <<<"$knob")"
    args+=("$flag=${!knob}")
  fi
done
exec "${PYTHON:-python3}" "$here/render_bench.py" "${args[@]}" "$@"
