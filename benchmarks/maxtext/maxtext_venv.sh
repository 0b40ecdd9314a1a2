# The side environment MaxText's engine runs in, for benchmarks/maxtext/maxtext_engine.sh,
# benchmarks/maxtext/maxtext_aot.sh and benchmarks/maxtext/maxtext_chip_wheels.sh (sourced: defines build_venv, which
# builds "$VENV" with "$PYTHON", the pins it installs, and finish_venv, which puts maxtext in a venv).
#
# maxtext 0.2.5 from the package index with its import dependencies pinned one by one, jax 0.10.2,
# flax 0.12.8. maxtext declares Python >= 3.12; on 3.11 it installs with --ignore-requires-python
# and two files with 3.12-only `type X = ...` statements are rewritten inside the venv. Two
# start-up hooks in the venv stand in for newer releases it expects: jax 0.10.2 lacks
# `jax.experimental.xla_metadata.must_fuse_call` (jax 0.11), set to an identity decorator; and
# flax 0.12.8's `nnx.eval_shape` raises on MaxText's logical names where flax 0.12.9 (not on the
# index) is asked for, which stops MaxText's AbstractMaxTextEngine (the `aot` path) before it
# traces anything: a variable whose sharding cannot be built there is returned without one.
#
# It builds the side environment behind BENCHMARKS.md's maxtext suite;
# benchmarks/reports/maxtext-engine_cpu_2026-12-03.md.

# The bench's own dependencies and the JAX stack maxtext 0.2.5 was checked with.
BENCH_PINS=(jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 numpy==2.4.6
    PyYAML==6.0.4 absl-py==2.5.1 jsonschema==4.26.0)
# maxtext's import dependencies, added one by one until its training engine imports (no torch or
# tensorflow needed); the JAX stack stays pinned (JAX_PINS) while they resolve.
JAX_PINS=(jax==0.10.2 jaxlib==0.10.2 flax==0.12.8)
MAXTEXT_DEPS=(omegaconf==2.4.0 packaging==26.4
    pathwaysutils==0.1.13 Jinja2==3.1.6 aqtp==0.9.0 qwix==0.1.8 tokamax==0.0.12
    huggingface_hub==2.4.0 transformers==5.24.0 grain==0.2.18 drjax==0.2.1
    tiktoken==0.14.0 sentencepiece==0.2.3 sympy==1.14.0 google-metrax==0.2.4
    perfetto==0.59.1 pandas==3.1.1 pillow==13.0.0 orbax-checkpoint==0.12.8 pydantic==2.14.4)
MAXTEXT_PIN=maxtext==0.2.5

build_venv() {
    "$PYTHON" -m venv "$VENV"
    local pip=("$VENV/bin/pip" install -q)
    "${pip[@]}" "${BENCH_PINS[@]}"
    printf '%s\n' "${JAX_PINS[@]}" > "$VENV/jax-constraints.txt"
    "${pip[@]}" -c "$VENV/jax-constraints.txt" "${MAXTEXT_DEPS[@]}"
    finish_venv "$VENV"
}

# maxtext itself in venv $1 (without its declared dependencies: the pins above stand for them), the
# 3.11 rewrite and the start-up hooks; extra pip options (an offline wheel folder) follow $1.
finish_venv() {
    local venv=$1
    shift
    "$venv/bin/pip" install -q "$@" --no-deps --ignore-requires-python "$MAXTEXT_PIN"
    local site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
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
    cat > "$site/rl_bench_flax_compat.py" <<'PY'
"""flax 0.12.8 (the newest on the index; maxtext 0.2.5 asks for >= 0.12.9): `nnx.eval_shape` gives
each output variable a NamedSharding from its logical names under the global mesh, and raises where
MaxText's rules leave a name unmapped or map two dimensions to one axis. MaxText's abstract engine
keeps only the module graph of that trace (its shardings come from a second trace), so a variable
whose sharding cannot be built is returned without one."""
import flax.nnx.transforms.transforms as _transforms
import jax
from jax._src.named_sharding import DuplicateSpecError

_to_variable = _transforms._to_variable


def _tolerant(node):
    def one(leaf):
        try:
            return _to_variable(leaf)
        except (ValueError, DuplicateSpecError):
            return leaf.var_type._new(leaf.value, leaf.metadata)

    return jax.tree.map(one, node, is_leaf=lambda x: isinstance(x, _transforms.ValueMetadata))


_transforms._to_variable = _tolerant
PY
    echo "import rl_bench_flax_compat" > "$site/rl_bench_flax_compat.pth"
}
