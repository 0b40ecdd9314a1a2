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
#    files with 3.12-only `type X = ...` statements are rewritten inside the venv. jax 0.10.2 lacks
#    `jax.experimental.xla_metadata.must_fuse_call` (jax 0.11), so a start-up hook in the venv sets
#    it to an identity decorator before maxtext is imported.
# 2. `ab --engine <MaxText adapter>` on cpu-tiny-dense, STAGE_BEFORE_UPDATE off and on: the exact
#    checks must PASS (same micro-batch digests, same loss denominators, one stage per boundary).
#    Two warm-up steps: MaxText logs a step's metrics one step late, and its first log compiles a
#    few small eager programs (WeightedMetric.compute); with one warm-up step that compile lands in
#    the first scored step and the recompile check fails the A/B.
# 3. The built-in engine and MaxText's as two arms of one `ab` on the same shapes and micro-batches:
#    step times side by side, the ratio measured in one process.
#
# Knobs: TUNIX_DIR (required), PYTHON (default python3.11), VENV (default /tmp/maxtext-bench-venv),
# OUT (default /tmp/maxtext-bench), STEPS (scored steps per arm, default 8).
set -euo pipefail

TUNIX_DIR=${TUNIX_DIR:?set TUNIX_DIR to a checkout of Tunix (the folder holding tunix/experimental)}
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-/tmp/maxtext-bench-venv}
OUT=${OUT:-/tmp/maxtext-bench}
STEPS=${STEPS:-8}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAXTEXT=rl_trainer_bench.engine.maxtext_adapter:MaxTextEngine
BUILT_IN=rl_trainer_bench.engine.jax_engine:JaxEngine

if [ ! -d "$TUNIX_DIR/tunix/experimental" ]; then
    echo "maxtext_engine.sh: TUNIX_DIR=$TUNIX_DIR has no tunix/experimental: give a Tunix checkout" >&2
    exit 2
fi

build_venv() {
    "$PYTHON" -m venv "$VENV"
    local pip=("$VENV/bin/pip" install -q)
    # The bench's own dependencies and the JAX stack maxtext 0.2.5 was checked with.
    "${pip[@]}" jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 numpy==2.4.6 \
        PyYAML==6.0.4 absl-py==2.5.1 jsonschema==4.26.0
    # maxtext's import dependencies, added one by one until its training engine imports (no torch
    # or tensorflow needed); the JAX stack stays pinned while they resolve.
    printf 'jax==0.10.2\njaxlib==0.10.2\nflax==0.12.8\n' > "$VENV/jax-constraints.txt"
    "${pip[@]}" -c "$VENV/jax-constraints.txt" omegaconf==2.4.0 packaging==26.4 \
        pathwaysutils==0.1.13 Jinja2==3.1.6 aqtp==0.9.0 qwix==0.1.8 tokamax==0.0.12 \
        huggingface_hub==2.4.0 transformers==5.24.0 grain==0.2.18 drjax==0.2.1 \
        tiktoken==0.14.0 sentencepiece==0.2.3 sympy==1.14.0 google-metrax==0.2.4 \
        perfetto==0.59.1 pandas==3.1.1 pillow==13.0.0 orbax-checkpoint==0.12.8 pydantic==2.14.4
    "${pip[@]}" --no-deps --ignore-requires-python maxtext==0.2.5
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
        sed -i -E 's/^type ([A-Za-z_][A-Za-z0-9_]*) *= */\1 = /' \
            "$site/maxtext/kernels/mhc/api.py" "$site/maxtext/kernels/mhc/common.py"
    fi
    cat > "$site/rl_bench_jax_compat.py" <<'PY'
"""jax 0.10.2 lacks jax.experimental.xla_metadata.must_fuse_call (jax 0.11): an identity decorator."""
import jax.experimental.xla_metadata as _xm

if not hasattr(_xm, "must_fuse_call"):
    _xm.must_fuse_call = lambda *_args, **_kwargs: (lambda fn: fn)
PY
    echo "import rl_bench_jax_compat" > "$site/rl_bench_jax_compat.pth"
}

if [ ! -x "$VENV/bin/python" ]; then
    echo "maxtext_engine.sh: building the side environment in $VENV" >&2
    build_venv
fi

export PYTHONPATH="$REPO:$TUNIX_DIR"
bench() { "$VENV/bin/python" -m rl_trainer_bench.cli "$@"; }
status=0
mkdir -p "$OUT"
# Fresh A/B folders each run; a previous run's results would otherwise be mixed in.
rm -rf "$OUT/maxtext-off-on" "$OUT/builtin-vs-maxtext"

echo "== MaxText, STAGE_BEFORE_UPDATE off and on (the adapter's staging on stock MaxText)"
bench ab --preset cpu-tiny-dense --engine "$MAXTEXT" --arms off,on,off,on --steps "$STEPS" \
    --warmup-steps 2 --out "$OUT/maxtext-off-on" || status=$?

echo "== the built-in engine and MaxText's, same shapes, same micro-batches, one process"
bench ab --preset cpu-tiny-dense \
    --arms "builtin:ENGINE=$BUILT_IN,maxtext:ENGINE=$MAXTEXT,builtin,maxtext" \
    --steps "$STEPS" --warmup-steps 2 --out "$OUT/builtin-vs-maxtext" || status=$?
exit "$status"  # 1 when an exact check failed in either A/B
