#!/usr/bin/env bash
# MaxText's programs for the production cell compiled for a TPU slice from this host (`aot` and
# `hlo-overlap` on MaxText's engine), at the public recipe's keys or the measured run's.
#
#   TUNIX_DIR=/path/to/tunix KEYS=recipe LAYERS=4 benchmarks/maxtext/maxtext_aot.sh
#
# 1. Builds (once) the side environment of benchmarks/maxtext/maxtext_venv.sh in $VENV, plus
#    jax[tpu]==0.10.2 (its libtpu), which a TPU target needs.
# 2. `aot` for qwen3.5-397b-cell on $SLICE with the trainer argv of KEYS, the optimizer state in
#    device memory (the trainer's placement), at $LAYERS (0: full depth; N: N and 2N layers,
#    extrapolated): the report to $OUT/aot-$KEYS-l$LAYERS.{txt,json}.
# 3. With OVERLAP=1, `hlo-overlap` of the same programs at $OVERLAP_LAYERS layers (0: full depth;
#    collectives per micro-batch, one row each): $OUT/overlap-$KEYS-l$OVERLAP_LAYERS.{txt,json}; a
#    program that does not compile is named there and the others reported (exit 1).
#
# KEYS: recipe, the public tpu7x recipe's trainer command (tests/testdata/tpu7x_recipe_trainer_argv.txt:
# ragged_buffer_factor 2.0 over 4 token chunks); measured, the same command at the measured
# run's 2.75 over 2 chunks (the preset's MoE settings).
# Knobs: TUNIX_DIR (required), KEYS (recipe), LAYERS (4), SLICE (tpu7x:4x4x8), OVERLAP (0),
# OVERLAP_LAYERS (4), PYTHON (python3.11), VENV (/tmp/maxtext-aot-venv), OUT (/tmp/maxtext-aot).
#
# Remakes BENCHMARKS.md's maxtext suite; benchmarks/reports/maxtext-aot_tpu7x_2026-12-03.md.
set -euo pipefail

TUNIX_DIR=${TUNIX_DIR:?set TUNIX_DIR to a checkout of Tunix (the folder holding tunix/experimental)}
KEYS=${KEYS:-recipe}
LAYERS=${LAYERS:-4}
SLICE=${SLICE:-tpu7x:4x4x8}
OVERLAP=${OVERLAP:-0}
OVERLAP_LAYERS=${OVERLAP_LAYERS:-4}
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-/tmp/maxtext-aot-venv}
OUT=${OUT:-/tmp/maxtext-aot}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

source "$REPO/benchmarks/maxtext/maxtext_venv.sh"  # build_venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "maxtext_aot.sh: building the side environment in $VENV" >&2
    build_venv
    "$VENV/bin/pip" install -q -c "$VENV/jax-constraints.txt" 'jax[tpu]==0.10.2'
fi

recipe=$(cat "$REPO/tests/testdata/tpu7x_recipe_trainer_argv.txt")
case "$KEYS" in
    recipe) argv=$recipe ;;
    measured) argv=$(sed -e 's/ragged_buffer_factor=2.0/ragged_buffer_factor=2.75/' \
                         -e 's/num_moe_token_chunks=4/num_moe_token_chunks=2/' <<<"$recipe") ;;
    *) echo "maxtext_aot.sh: KEYS=$KEYS: expected recipe or measured" >&2; exit 2 ;;
esac

mkdir -p "$OUT"
export PYTHONPATH="$REPO:$TUNIX_DIR" JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1
bench() { "$VENV/bin/python" -m rl_trainer_bench.cli "$@"; }
cell=(--preset qwen3.5-397b-cell --target "$SLICE" --trainer-argv "$argv"
      --engine-flags optimizer_memory_host_offload=false)

status=0
bench aot "${cell[@]}" --layers "$LAYERS" --output "$OUT/aot-$KEYS-l$LAYERS.json" \
    | tee "$OUT/aot-$KEYS-l$LAYERS.txt" || status=$?
if [ "$OVERLAP" = 1 ]; then
    # One compile for both forms: each program's report as it compiles, the JSON rewritten so.
    overlap=$OUT/overlap-$KEYS-l$OVERLAP_LAYERS
    bench hlo-overlap "${cell[@]}" --layers "$OVERLAP_LAYERS" --output "$overlap.json" \
        > "$overlap.txt" || status=$?
fi
exit "$status"  # aot's: 0 fits with the margin free, 1 not, 2 bad input
