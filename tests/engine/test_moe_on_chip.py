"""expert_compute=sorted_gmm on a TPU chip: the compiled grouped-matmul kernel (not its
interpreter) against the padded einsum over E x C buffers, for one MoE layer at the one-chip
preset's factor 2.75 in two token groups and at a factor that drops pairs: value, overflow flag and
gradients, in bfloat16 as the engine computes, within a stated tolerance. 2,048 tokens: each group's
4,096 pairs span 8 or more of the kernel's row tiles of 512, and 16 experts share them.

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_moe_on_chip.py
"""

from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

# bfloat16 operands, float32 accumulation in both: the two sum a pair's products in other orders
# and round the SwiGLU's intermediates alike, so they differ by about bfloat16's precision
TOLERANCE = 2e-2
COMPARE = f"""
import jax, jax.numpy as jnp, numpy as np
from rl_trainer_bench.engine.builtin import moe, sharding
from rl_trainer_bench.engine.config import MeshConfig
B, T, D, E, K, F = 2, 1024, 1024, 16, 4, 512
keys = jax.random.split(jax.random.key(0), 6)
x = jax.random.normal(keys[0], (B, T, D), jnp.bfloat16)
params = {{"router": jax.random.normal(keys[1], (D, E), jnp.float32) / np.sqrt(D)}}
for key, name, shape in zip(keys[2:5], moe.EXPERT_WEIGHTS, ((E, D, F), (E, D, F), (E, F, D))):
    params[name] = (jax.random.normal(key, shape) / np.sqrt(shape[1])).astype(jnp.bfloat16)
weights = jax.random.normal(keys[5], (B, T, D), jnp.float32)
valid = jnp.ones((B, T), bool)
def grads(factor, expert_compute):
    def loss(x, params):
        out, overflow = moe.moe_ffn(x, params, valid, None, top_k=K, capacity_factor=factor,
            token_chunks=2, methods=(expert_compute, "gmm", "count"))
        return jnp.sum(out.astype(jnp.float32) * weights), (out, overflow)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, params)
mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
with jax.set_mesh(mesh):
    for factor in (2.75, 0.5):
        (_, (want, want_flag)), want_grads = grads(factor, "einsum")
        (_, (got, got_flag)), got_grads = grads(factor, "sorted_gmm")
        assert bool(got_flag) == bool(want_flag) == (factor < 1), (factor, got_flag, want_flag)
        leaves = zip(jax.tree.leaves((got, got_grads)), jax.tree.leaves((want, want_grads)))
        for i, (g, w) in enumerate(leaves):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            error = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-6)
            print(factor, i, error)
            assert error < {TOLERANCE}, (factor, i, error)
"""


def test_the_kernel_on_the_chip_agrees_with_the_padded_einsum():
    run_on_the_chip(COMPARE)
