#!/usr/bin/env bash
# MaxText's training engine timed by this bench on the CPU: a real check of the MaxText adapter,
# outside CI (CI tests the adapter against a stand-in; see tests/maxtext_stand_in.py).
#
#   TUNIX_DIR=/path/to/a/tunix/checkout benchmarks/maxtext_engine.sh
#
# 1. Builds a side environment (a venv of its own, never the project's): maxtext 0.2.5 from the
#    package index with its import dependencies pinned one by one, jax 0.10.2, flax 0.12.8. The
#    Tunix checkout (its public repository's head: google-tunix 0.1.7 on the index lacks
#    `tunix.experimental`) is put on PYTHONPATH as given, nothing is built from it.
#    maxtext declares Python >= 3.12; on 3.11 it installs with --ignore-requires-python and two
#    files with 3.12-only `type X = ...` statements are rewritten inside the venv; two start-up
#    hooks stand in for what maxtext 0.2.5 expects of newer releases (benchmarks/maxtext_venv.sh).
# 2. For each preset (cpu-tiny-dense, the dense engine-vs-engine cell, and cpu-tiny-qwen3.5, the
#    MoE cell: MaxText's qwen3_5 decoder with the cell's 2x2x2 mesh and replayed routes):
#    a. `ab --engine <MaxText adapter>` STAGE_BEFORE_UPDATE off and on: the exact checks must PASS
#       (same micro-batch digests, same loss denominators, one stage per boundary).
#    b. The built-in engine and MaxText's as two arms of one `ab` on the same micro-batches: step
#       times side by side, the ratio measured in one process.
#    c. MaxText `run` with staging off, then on, each in a fresh process (an A/B's arms share one
#       training engine, so their losses follow each other): the per-step losses must be
#       bit-identical (compared as written in results.jsonl).
#    Two warm-up steps: MaxText logs a step's metrics one step late, and its first log compiles a
#    few small eager programs (WeightedMetric.compute); with one warm-up step that compile lands in
#    the first scored step and the recompile check fails the A/B.
# 3. Every command runs from an empty folder of its own; afterwards that folder must still be empty
#    (MaxText writes only under the results folders) and no MaxText profile (*.xplane.pb) may exist.
#
# Knobs: TUNIX_DIR (required), PYTHON (default python3.11), VENV (default /tmp/maxtext-bench-venv),
# OUT (default /tmp/maxtext-bench), STEPS (scored steps per arm, default 8), BENCH_PRESETS (default
# "cpu-tiny-dense cpu-tiny-qwen3.5").
set -euo pipefail

TUNIX_DIR=${TUNIX_DIR:?set TUNIX_DIR to a checkout of Tunix (the folder holding tunix/experimental)}
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-/tmp/maxtext-bench-venv}
OUT=${OUT:-/tmp/maxtext-bench}
STEPS=${STEPS:-8}
BENCH_PRESETS=${BENCH_PRESETS:-cpu-tiny-dense cpu-tiny-qwen3.5}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAXTEXT=rl_trainer_bench.engine.maxtext_adapter:MaxTextEngine
BUILT_IN=rl_trainer_bench.engine.jax_engine:JaxEngine

if [ ! -d "$TUNIX_DIR/tunix/experimental" ]; then
    echo "maxtext_engine.sh: TUNIX_DIR=$TUNIX_DIR has no tunix/experimental: give a Tunix checkout" >&2
    exit 2
fi

source "$REPO/benchmarks/maxtext_venv.sh"  # build_venv

if [ ! -x "$VENV/bin/python" ]; then
    echo "maxtext_engine.sh: building the side environment in $VENV" >&2
    build_venv
fi

export PYTHONPATH="$REPO:$TUNIX_DIR"
status=0
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)  # absolute: the commands run from elsewhere
CWD="$OUT/cwd"  # where every command runs: it must stay empty
rm -rf "$CWD" && mkdir -p "$CWD"
bench() { (cd "$CWD" && "$VENV/bin/python" -m rl_trainer_bench.cli "$@"); }

same_losses() {  # results.jsonl of two runs: the per-step losses, bit for bit
    "$VENV/bin/python" - "$1" "$2" <<'PY'
import json, sys
try:
    runs = [[json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:]]
except OSError as error:
    sys.exit(f"FAIL: {error}")
same = runs[0] == runs[1] and len(runs[0]) > 0
print(f"losses off {runs[0]}\nlosses on  {runs[1]}\n{'PASS' if same else 'FAIL'}: bit-identical")
sys.exit(0 if same else 1)
PY
}

for preset in $BENCH_PRESETS; do
    out="$OUT/$preset"
    # Fresh folders each run; a previous run's results would otherwise be mixed in.
    rm -rf "$out" && mkdir -p "$out"
    echo "== $preset: MaxText, STAGE_BEFORE_UPDATE off and on (the adapter's staging on stock MaxText)"
    bench ab --preset "$preset" --engine "$MAXTEXT" --arms off,on,off,on --steps "$STEPS" \
        --warmup-steps 2 --out "$out/maxtext-off-on" || status=$?
    echo "== $preset: the built-in engine and MaxText's, same micro-batches, one process"
    bench ab --preset "$preset" \
        --arms "builtin:ENGINE=$BUILT_IN,maxtext:ENGINE=$MAXTEXT,builtin,maxtext" \
        --steps "$STEPS" --warmup-steps 2 --out "$out/builtin-vs-maxtext" || status=$?
    echo "== $preset: MaxText off, then on, in fresh processes: the same losses"
    for stage in off on; do
        bench run --preset "$preset" --engine "$MAXTEXT" --stage-before-update "$stage" \
            --steps "$STEPS" --warmup-steps 2 --results-dir "$out/run-$stage" || status=$?
    done
    same_losses "$out/run-off/results.jsonl" "$out/run-on/results.jsonl" || status=1
done

echo "== files: nothing in the folder the commands ran from, no MaxText profile"
if [ -n "$(ls -A "$CWD")" ]; then
    echo "FAIL: written outside the results folders: $(ls -A "$CWD")"
    status=1
fi
if find "$OUT" -name '*.xplane.pb' | grep -q .; then
    echo "FAIL: MaxText profiled: $(find "$OUT" -name '*.xplane.pb')"
    status=1
fi
exit "$status"  # 1 when an exact check, the loss comparison or the file check failed
