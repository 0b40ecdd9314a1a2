"""linear_chunk_inverse=pallas on a TPU chip: the compiled kernel (not its interpreter) against
NumPy's float64 inverse and against the XLA path, at tpu-v5e-1's 2,048 systems of 128 a
micro-batch (and its 4,096 of 64 before). Both take the TPU's default matmul precision (float32 operands through bfloat16 once),
so neither is exact: the kernel must be within TOLERANCE of the reference and no further from it
than twice the XLA path is.

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_unit_lower_inverse_on_chip.py
"""

import json
from pathlib import Path

import pytest
from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

# bfloat16 has 8 bits of mantissa (0.4%); the inverse's entries are at most 1 here, and six or
# seven levels of two matmuls each round their operands
TOLERANCE = 3e-2
SHAPES = [(2048, 128), (4096, 64)]  # (systems, size)
# Both shapes in one process: one opening of the chip and one import of JAX for the two
COMPARE = """
import json, sys, jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {tests!r})
from side_by_side import side_by_side
from rl_trainer_bench.engine.builtin.unit_lower_inverse import unit_lower_inverse
systems = {{}}
for count, size in {shapes}:
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(count, size, 128))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    strict = np.tril(rng.uniform(0, 1, (count, size, 1)) * keys @ np.swapaxes(keys, -1, -2), -1)
    systems[f"{{count}}x{{size}}"] = strict, np.linalg.inv(np.eye(size) + strict)

def error(name, method):
    strict, reference = systems[name]
    got = jax.jit(lambda a: unit_lower_inverse(a, method))(jnp.asarray(strict, jnp.float32))
    return float(np.abs(np.asarray(got, np.float64) - reference).max())

runs = [(name, method) for name in systems for method in ("xla", "pallas")]
found = side_by_side(*(lambda run=run: error(*run) for run in runs))
print(json.dumps({{f"{{name}} {{method}}": e for (name, method), e in zip(runs, found)}}))
"""


@pytest.fixture(scope="module")
def errors():
    """The largest error against the reference of each method at each of SHAPES, from the chip."""
    tests = str(Path(__file__).resolve().parent)
    return json.loads(run_on_the_chip(COMPARE.format(shapes=SHAPES, tests=tests)).splitlines()[-1])


@pytest.mark.parametrize(("count", "size"), SHAPES)
def test_the_kernel_on_the_chip_inverts_as_closely_as_the_xla_path(errors, count, size):
    pallas, xla = errors[f"{count}x{size} pallas"], errors[f"{count}x{size} xla"]
    assert pallas < TOLERANCE, errors
    assert pallas <= 2 * xla + 1e-6, errors
