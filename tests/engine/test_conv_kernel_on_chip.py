"""linear_conv_kernel=pallas on a TPU chip: the compiled kernels (not their interpreter) against the
XLA path, at tpu-v5e-1's taps (4) on 2 rows of 1,536 tokens over packed segments, q, k and v
1,024 channels (its heads' widths, a quarter of its heads): 3 of the kernels' blocks of 512 tokens
by 2 of 512 channels (the preset's 4,096 tokens and channels add blocks, not cases; the kernels
compile at its shapes in `test_conv_kernel.py`), the output and the gradients of the input and the
taps, in float32. No matmul rounds either path, so they agree to float32's sums (the taps'
gradients sum 3,072 tokens in another order).

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_conv_kernel_on_chip.py
"""

from pathlib import Path

from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

TOLERANCE = 1e-4  # of an array's largest entry
COMPARE = """
import dataclasses, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {tests!r})
from gdn_reference import conv_inputs
from side_by_side import side_by_side
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.gated_deltanet import context_conv
from rl_trainer_bench.engine.config import MeshConfig

model = dataclasses.replace(
    preset("tpu-v5e-1").engine.model, linear_num_key_heads=2, linear_num_value_heads=4
)
segments, x, kernel, weights = map(jnp.asarray, conv_inputs(model, 2, 1536))

mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])

def run(method):
    def loss(x, kernel):
        out = context_conv(x, kernel, segments, method)
        return jnp.sum(out * weights), out
    with jax.set_mesh(mesh):
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, kernel)
        return [np.asarray(a) for a in (out, *grads)]

got, want = side_by_side(lambda: run("pallas"), lambda: run("xla"))
errors = [float(np.abs(a - w).max() / np.abs(w).max()) for a, w in zip(got, want)]
print("largest |difference| over largest |value|, of out, x, taps:", errors)
assert max(errors) < {tolerance}, errors
"""


def test_the_kernels_on_the_chip_give_the_xla_paths_output_and_gradients():
    tests = str(Path(__file__).resolve().parent)
    run_on_the_chip(COMPARE.format(tests=tests, tolerance=TOLERANCE))
