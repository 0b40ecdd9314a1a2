#!/usr/bin/env bash
# MaxText's training engine timed by this bench on the CPU: a real check of the MaxText adapter,
# outside CI (CI tests the adapter against a stand-in; see tests/maxtext_stand_in.py).
#
#   TUNIX_DIR=/path/to/a/tunix/checkout benchmarks/maxtext/maxtext_engine.sh
#
# 1. Builds a side environment (a venv of its own, never the project's): maxtext 0.2.5 from the
#    package index with its import dependencies pinned one by one, jax 0.10.2, flax 0.12.8. The
#    Tunix checkout (its public repository's head: google-tunix 0.1.7 on the index lacks
#    `tunix.experimental`) is put on PYTHONPATH as given, nothing is built from it.
#    maxtext declares Python >= 3.12; on 3.11 it installs with --ignore-requires-python and two
#    files with 3.12-only `type X = ...` statements are rewritten inside the venv; two start-up
#    hooks stand in for what maxtext 0.2.5 expects of newer releases (benchmarks/maxtext/maxtext_venv.sh).
# 2. For each preset (cpu-tiny-dense, the dense engine-vs-engine cell, and cpu-tiny-qwen3.5, the
#    MoE cell: MaxText's qwen3_5 decoder with the cell's 2x2x2 mesh and replayed routes), MaxText's
#    engine driven as a Tunix trainer drives it (MAXTEXT_DRIVER=tunix: Tunix's TrainerWorker and
#    GRPO loss, which the Tunix checkout provides; a run stops if they do not import):
#    a. `ab --engine <MaxText adapter>` STAGE_BEFORE_UPDATE off and on: the exact checks must PASS
#       (same micro-batch digests, same loss denominators, one stage per boundary).
#    a'. The adapter's own calls (MAXTEXT_DRIVER=maxtext, MaxText's router-replay loss) and Tunix's
#       as two arms of one `ab`, over one training state (Tunix's driver holds it one level down,
#       in Tunix's model adapter: engine/maxtext/state_layout.py): the same loss denominators, the
#       step times side by side.
#    b. The built-in engine and MaxText's on the same micro-batches, each `run` in a process of its
#       own (two engines hold two training states, which one `ab` refuses), the two logs scored
#       cross-pod by `ab --from-logs`: step times side by side, no shared noise floor. Both warm
#       up for MaxText's two steps (CROSS_WARMUP_STEPS; the built-in engine would take one): a
#       step's micro-batches follow its number, so runs that warm up differently score others.
#    c. MaxText `run` with staging off, then on, each in a fresh process (an A/B's arms share one
#       training engine, so their losses follow each other): the per-step losses must be
#       bit-identical (compared as written in results.jsonl).
#    Warm-up steps are the bench's default for MaxText's engine, two: MaxText logs a step's metrics
#    one step late, and its first log compiles a few small eager programs (WeightedMetric.compute).
# 3. Every command runs from an empty folder of its own; afterwards that folder must still be empty
#    (MaxText writes only under the results folders) and no MaxText profile (*.xplane.pb) may exist.
#
# The MoE cell runs on 4 x 2 x 1 (fsdp x context x expert; MOE_ENGINE_FLAGS) by default, both
# engines alike: off a TPU, MaxText's expert-parallel grouped matmul is its megablox Pallas kernel
# interpreted (maxtext 0.2.5 has no XLA path that takes a shard's group offset), ~30 s a step on
# the cell's own 2 x 2 x 2 here; on one expert shard the adapter's host keys give MaxText XLA's
# ragged_dot (benchmarks/reports/maxtext-engine_cpu_2026-12-03.md, "Why MaxText's MoE step is slow
# on the CPU"). MOE_ENGINE_FLAGS= runs the cell's own mesh.
#
# Knobs: TUNIX_DIR (required), PYTHON (default python3.11), VENV (default /tmp/maxtext-bench-venv),
# OUT (default /tmp/maxtext-bench), STEPS (scored steps per arm, default 8), BENCH_PRESETS (default
# "cpu-tiny-dense cpu-tiny-qwen3.5"), MOE_ENGINE_FLAGS (ENGINE_FLAGS of cpu-tiny-qwen3.5, default
# "mesh_fsdp=4 mesh_context=2 mesh_expert=1").
#
# Remakes BENCHMARKS.md's maxtext suite; benchmarks/reports/maxtext-engine_cpu_2026-12-03.md.
set -euo pipefail

TUNIX_DIR=${TUNIX_DIR:?set TUNIX_DIR to a checkout of Tunix (the folder holding tunix/experimental)}
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-/tmp/maxtext-bench-venv}
OUT=${OUT:-/tmp/maxtext-bench}
STEPS=${STEPS:-8}
BENCH_PRESETS=${BENCH_PRESETS:-cpu-tiny-dense cpu-tiny-qwen3.5}
MOE_ENGINE_FLAGS=${MOE_ENGINE_FLAGS-mesh_fsdp=4 mesh_context=2 mesh_expert=1}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MAXTEXT=rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine
BUILT_IN=rl_trainer_bench.engine.builtin.jax_engine:JaxEngine
CROSS_WARMUP_STEPS=2  # MaxText's engine's warm-up (engine_choice.MAXTEXT_WARMUP_STEPS), both runs

if [ ! -d "$TUNIX_DIR/tunix/experimental" ]; then
    echo "maxtext_engine.sh: TUNIX_DIR=$TUNIX_DIR has no tunix/experimental: give a Tunix checkout" >&2
    exit 2
fi

source "$REPO/benchmarks/maxtext/maxtext_venv.sh"  # build_venv

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
    engine_flags=""
    [ "$preset" = cpu-tiny-qwen3.5 ] && engine_flags=$MOE_ENGINE_FLAGS
    echo "== $preset: ENGINE_FLAGS=${engine_flags:--}"
    ab_flags=() run_flags=()
    if [ -n "$engine_flags" ]; then
        ab_flags=(--knob "ENGINE_FLAGS=$engine_flags") run_flags=(--engine-flags "$engine_flags")
    fi
    echo "== $preset: MaxText, STAGE_BEFORE_UPDATE off and on (the adapter's staging on stock MaxText)"
    bench ab --preset "$preset" --engine "$MAXTEXT" --knob MAXTEXT_DRIVER=tunix \
        --arms off,on,off,on --steps "$STEPS" "${ab_flags[@]}" --out "$out/maxtext-off-on" \
        || status=$?
    echo "== $preset: MaxText through the adapter's own calls and through Tunix's worker and loss"
    bench ab --preset "$preset" --engine "$MAXTEXT" \
        --arms "own:MAXTEXT_DRIVER=maxtext,tunix:MAXTEXT_DRIVER=tunix,own,tunix" \
        --steps "$STEPS" "${ab_flags[@]}" --out "$out/own-vs-tunix" || status=$?
    echo "== $preset: the built-in engine and MaxText's, same micro-batches, a process each"
    for engine in builtin maxtext; do
        spec=$BUILT_IN
        [ "$engine" = maxtext ] && spec=$MAXTEXT
        bench run --preset "$preset" --engine "$spec" --maxtext-driver tunix --steps "$STEPS" \
            --warmup-steps "$CROSS_WARMUP_STEPS" "${run_flags[@]}" \
            --results-dir "$out/cross-$engine" >"$out/cross-$engine.log" || status=$?
    done
    bench ab --from-logs "builtin=$out/cross-builtin.log" "maxtext=$out/cross-maxtext.log" \
        --out "$out/builtin-vs-maxtext" || status=$?
    echo "== $preset: MaxText off, then on, in fresh processes: the same losses"
    for stage in off on; do
        bench run --preset "$preset" --engine "$MAXTEXT" --maxtext-driver tunix \
            --stage-before-update "$stage" --steps "$STEPS" "${run_flags[@]}" \
            --results-dir "$out/run-$stage" || status=$?
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
