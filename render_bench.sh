#!/usr/bin/env bash
# Render a launcher's DRY_RUN output into a single-slice bench JobSet, knobs as environment variables:
# every knob `render --help` lists, named in upper case (LAUNCH_RENDER, BENCH_NAME, LIBTPU_FLAGS,
# the knobs passed through to the pod's driver such as STEPS and TRAINER_SLICE, AB_ARMS, DRIVER_ENV,
# OUTPUT, AOT_JOB, ...).
# e.g. LAUNCH_RENDER=dryrun.txt TRAINER_SLICE=tpu7x:4x4x8 STEPS=20 OUTPUT=bench.yaml ./render_bench.sh
# Each value goes to render_bench.py as the flag of the same name (lower case, dashes), untouched,
# so both entry points validate it the same way. PYTHON picks the interpreter (default python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
# The names are read from the renderer's table (rl_trainer_bench/launch/knobs.py), so a knob added
# there is taken here too.
names="$(PYTHONPATH="$here" "$python" -c \
  'from rl_trainer_bench.launch.knobs import RENDER_KNOBS; print(*(k.env for k in RENDER_KNOBS))')"
read -ra knobs <<<"$names"
args=()
for knob in "${knobs[@]}"; do
  if [[ -n "${!knob:-}" ]]; then
    flag="--$(tr 'A-Z_' 'a-z-' <<<"$knob")"
    args+=("$flag=${!knob}")
  fi
done
exec "$python" "$here/render_bench.py" "${args[@]}" "$@"
