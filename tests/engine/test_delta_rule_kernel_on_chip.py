"""linear_chunk_kernel=pallas on a TPU chip: the compiled kernels (not their interpreter) against
the XLA path, at tpu-v5e-1's shapes and kernel settings (a micro-batch of its rows of 4,096 tokens
over packed segments, 16 value heads sharing 8 key heads, chunks of 128, its heads a kernel
program), outputs and every input's gradient, in float32
(the layer's bfloat16 would round both paths' outputs alike and hide their differences). Both take
the TPU's default matmul precision (float32 operands through bfloat16 once), so neither is exact;
the reference is the XLA path at the highest precision, and the kernels must be within TOLERANCE
of it and no further from it than twice the XLA path is, for each array. And the interpreter
test's float64 cases (`delta_rule_cases`) compiled, at the highest precision.

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
COMPARE = """
import sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {tests!r})
from gdn_reference import cell_inputs
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.gated_deltanet import layer_delta_rule
from rl_trainer_bench.engine.config import MeshConfig

engine = preset("tpu-v5e-1").engine
model = engine.model
*arrays, segments, weights = cell_inputs(model, engine.micro_batch_rows, engine.seq_len)
inputs = [jnp.asarray(x) for x in arrays]

def run(kernel):
    def loss(*x):
        out = layer_delta_rule(*x, jnp.asarray(segments), model, "xla", kernel)
        return jnp.sum(out.astype(jnp.float32) * weights), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))(*inputs)
    return [np.asarray(a, np.float32) for a in (out, *grads)]

with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
    got = {{"pallas": run("pallas"), "xla": run("xla")}}
    with jax.default_matmul_precision("highest"):
        reference = run("xla")
errors = {{
    method: [float(np.abs(a - r).max() / np.abs(r).max()) for a, r in zip(values, reference)]
    for method, values in got.items()
}}
print("largest |difference| over largest |value|, of out, q, k, v, log_decay, beta:", errors)
for kernel, xla in zip(errors["pallas"], errors["xla"]):
    assert kernel < {tolerance} and kernel <= 2 * xla + 1e-5, errors
"""


def test_the_kernels_on_the_chip_give_the_xla_paths_outputs_and_gradients():
    tests = str(Path(__file__).resolve().parent)
    run_on_the_chip(COMPARE.format(tests=tests, tolerance=TOLERANCE))


# The interpreter test's cases (`delta_rule_cases`) compiled, at head widths of 128 (what the
# kernels' TPU blocks take), in one process: one opening of the chip and one import of JAX for all.
# At the highest matmul precision (float32 operands, and the states and inverses kept in float32
# but where the case keeps them in bfloat16), so the kernels hold to the float64 reference as
# closely as in the interpreter, which catches a gradient term that only a segment spanning three
# chunks or more brings in.
FLOAT64_CASES = """
import json, sys
import jax
sys.path.insert(0, {tests!r})
from delta_rule_cases import CASES, kernels_and_reference, largest_errors
errors = {{}}
with jax.default_matmul_precision("highest"):
    for name, case in CASES.items():
        errors[name] = largest_errors(*kernels_and_reference(case, 128, 128, interpret={interpret}))
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def float64_errors():
    """Each case's largest error of the outputs and each gradient against the float64 reference,
    over the reference's largest value, from the chip."""
    tests = str(Path(__file__).resolve().parent)
    script = FLOAT64_CASES.format(tests=tests, interpret=False)
    return json.loads(run_on_the_chip(script).splitlines()[-1])


@pytest.mark.parametrize("name", CASES.keys())
def test_the_compiled_kernels_give_the_float64_recurrences_outputs_and_gradients(
    float64_errors, name
):
    errors = float64_errors[name]
    assert errors["out"] < 1e-4, errors
    assert all(errors[array] < CASES[name].tolerance for array in errors), errors
