"""expert_compute=sorted_gmm on a TPU chip: the compiled grouped-matmul kernel (not its
interpreter) against the padded einsum over E x C buffers, for one MoE layer at the one-chip
preset's factor 2.75 in two token groups and at a factor that drops pairs: value, overflow flag and
gradients, in bfloat16 as the engine computes, within a stated tolerance. 2,048 tokens: each group's
4,096 pairs span 8 or more of the kernel's row tiles of 512, and 16 experts share them.

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_moe_on_chip.py
"""

from pathlib import Path

from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

# bfloat16 operands, float32 accumulation in both: the two sum a pair's products in other orders
# and round the SwiGLU's intermediates alike, so they differ by about bfloat16's precision
TOLERANCE = 2e-2
COMPARE = f"""
import sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from side_by_side import side_by_side
from rl_trainer_bench.engine.builtin import moe, sharding
from rl_trainer_bench.engine.config import MeshConfig
B, T, D, E, K, F = 2, 1024, 1024, 16, 4, 512
rng = np.random.default_rng(0)  # on the host: the chip compiles only the programs compared
normal = lambda shape, scale=1.0: rng.standard_normal(shape, np.float32) * np.float32(scale)
x = jnp.asarray(normal((B, T, D)), jnp.bfloat16)
params = {{"router": jnp.asarray(normal((D, E), 1 / np.sqrt(D)))}}
for name, shape in zip(moe.EXPERT_WEIGHTS, ((E, D, F), (E, D, F), (E, F, D))):
    params[name] = jnp.asarray(normal(shape, 1 / np.sqrt(shape[1])), jnp.bfloat16)
weights = jnp.asarray(normal((B, T, D)))
valid = jnp.ones((B, T), bool)
mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
def grads(factor, expert_compute):
    def loss(x, params):
        out, overflow = moe.moe_ffn(x, params, valid, None, top_k=K, capacity_factor=factor,
            token_chunks=2, methods=(expert_compute, "gmm", "count"))
        return jnp.sum(out.astype(jnp.float32) * weights), (out, overflow)
    with jax.set_mesh(mesh):
        (_, (out, overflow)), grads = jax.jit(
            jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, params)
        return bool(overflow), [np.asarray(a, np.float32) for a in jax.tree.leaves((out, grads))]
cases = [(factor, method) for factor in (2.75, 0.5) for method in ("einsum", "sorted_gmm")]
results = dict(zip(cases, side_by_side(*(lambda c=c: grads(*c) for c in cases))))
for factor in (2.75, 0.5):
    (want_flag, want), (got_flag, got) = results[factor, "einsum"], results[factor, "sorted_gmm"]
    assert got_flag == want_flag == (factor < 1), (factor, got_flag, want_flag)
    for i, (g, w) in enumerate(zip(got, want)):
        error = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-6)
        print(factor, i, error)
        assert error < {TOLERANCE}, (factor, i, error)
"""


def test_the_kernel_on_the_chip_agrees_with_the_padded_einsum():
    run_on_the_chip(COMPARE)
