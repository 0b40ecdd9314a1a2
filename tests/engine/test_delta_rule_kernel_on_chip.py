"""linear_chunk_kernel=pallas on a TPU chip: the compiled kernels (not their interpreter), in one
process (one opening of the chip and one import of JAX for both checks):

- against the XLA path at tpu-v5e-1's kernel settings (16 value heads sharing 8 key heads of 128,
  chunks of 128, its heads a kernel program) on 2 rows of 1,024 tokens over packed segments (8
  chunks a row: segments across several, the state crossing whole chunks), outputs and every
  input's gradient, in float32 (the layer's bfloat16 would round both paths' outputs alike and
  hide their differences). Both take the TPU's default matmul precision (float32 operands through
  bfloat16 once), so neither is exact; the reference is the XLA path at the highest precision,
  and the kernels must be within TOLERANCE of it and no further from it than twice the XLA path
  is, for each array. The preset's rows of 4,096 tokens add chunks, not cases; the kernels compile
  at its shapes in `test_delta_rule_kernel.py`.
- the interpreter test's float64 cases (`delta_rule_cases`), at head widths of 128 (what the
  kernels' TPU blocks take) and the highest matmul precision (float32 operands, and the states and
  inverses kept in float32 but where the case keeps them in bfloat16), so the kernels hold to the
  float64 reference as closely as in the interpreter, which catches a gradient term that only a
  segment spanning three chunks or more brings in.

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_delta_rule_kernel_on_chip.py
"""

import json
from pathlib import Path

import pytest
from chip_subprocess import ON_A_CHIP, run_on_the_chip
from delta_rule_cases import CASES

pytestmark = ON_A_CHIP

# Of an array's largest entry: bfloat16 holds 8 bits of mantissa (0.4%), and each output and
# gradient passes through tens of rounded matmuls (the inverse's doubling, the chunk-to-chunk state)
TOLERANCE = 5e-2
ROWS, TOKENS = 2, 1024
COMPARE = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {tests!r})
from delta_rule_cases import CASES, kernels_and_reference, largest_errors
from side_by_side import side_by_side
from gdn_reference import cell_inputs
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.gated_deltanet import layer_delta_rule
from rl_trainer_bench.engine.config import MeshConfig

model = preset("tpu-v5e-1").engine.model
*arrays, segments, weights = cell_inputs(model, {rows}, {tokens})
inputs = [jnp.asarray(x) for x in arrays]

mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])

def run(kernel, precision=None):
    def loss(*x):
        out = layer_delta_rule(*x, jnp.asarray(segments), model, "xla", kernel)
        return jnp.sum(out.astype(jnp.float32) * weights), out
    with jax.set_mesh(mesh), jax.default_matmul_precision(precision):
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))(*inputs)
        return [np.asarray(a, np.float32) for a in (out, *grads)]

def case_errors(case):
    with jax.default_matmul_precision("highest"):
        return largest_errors(*kernels_and_reference(case, 128, 128, interpret=False))

pallas, xla, reference, *cases = side_by_side(
    lambda: run("pallas"),
    lambda: run("xla"),
    lambda: run("xla", "highest"),
    *(lambda case=case: case_errors(case) for case in CASES.values()),
)
errors = {{
    method: [float(np.abs(a - r).max() / np.abs(r).max()) for a, r in zip(values, reference)]
    for method, values in (("pallas", pallas), ("xla", xla))
}}
errors.update(zip(CASES, cases))
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def errors():
    """Against the XLA path at the highest precision, the largest error of out, q, k, v, log_decay
    and beta over the reference's largest value by each path ("pallas", "xla"); against the float64
    reference, each case's by array; from the chip."""
    tests = str(Path(__file__).resolve().parent)
    script = COMPARE.format(tests=tests, rows=ROWS, tokens=TOKENS)
    return json.loads(run_on_the_chip(script).splitlines()[-1])


def test_the_kernels_on_the_chip_give_the_xla_paths_outputs_and_gradients(errors):
    for kernel, xla in zip(errors["pallas"], errors["xla"], strict=True):
        assert kernel < TOLERANCE and kernel <= 2 * xla + 1e-5, errors


@pytest.mark.parametrize("name", CASES.keys())
def test_the_compiled_kernels_give_the_float64_recurrences_outputs_and_gradients(errors, name):
    case_errors = errors[name]
    assert case_errors["out"] < 1e-4, case_errors
    assert all(error < CASES[name].tolerance for error in case_errors.values()), case_errors
