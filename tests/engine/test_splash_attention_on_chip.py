"""attention=splash on a TPU chip: the compiled kernel (not its interpreter) against the XLA path,
outputs and gradients in bfloat16 as the engine computes, within a stated tolerance, at the
one-chip presets' heads (16 query heads over 4 key/value heads of 128) over packed rows with
padding, rows of 2,048 tokens: 4 of the kernel's blocks of 512 (the presets' rows of 4,096 add
blocks, not cases).

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_splash_attention_on_chip.py
"""

from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

# bfloat16 inputs, float32 accumulation on both paths: the kernel's online softmax and the XLA
# path's whole-row softmax round differently, by about bfloat16's precision
TOLERANCE = 2e-2
COMPARE = f"""
import jax, jax.numpy as jnp, numpy as np
from rl_trainer_bench.engine.builtin import model, sharding
from rl_trainer_bench.engine.config import MeshConfig
B, T = 4, 2048
keys = jax.random.split(jax.random.key(0), 4)
q = jax.random.normal(keys[0], (B, T, 16, 128), jnp.bfloat16)
k = jax.random.normal(keys[1], (B, T, 4, 128), jnp.bfloat16)
v = jax.random.normal(keys[2], (B, T, 4, 128), jnp.bfloat16)
segments = np.ones((B, T), np.int32)
segments[0, 700:] = 2  # a second sequence inside a kernel block
segments[1, 1024:] = 3  # ... at a block's first token
segments[2, 1500:] = 0  # padding at the end
segments[3] = np.repeat(np.arange(1, 17), T // 16)  # sixteen short sequences
segments = jnp.asarray(segments)
weights = jax.random.normal(keys[3], q.shape, jnp.float32)
def grads(attend):
    def loss(q, k, v):
        out = attend(q, k, v, segments).astype(jnp.float32) * (segments != 0)[:, :, None, None]
        return jnp.sum(out * weights), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
with jax.set_mesh(mesh):
    (_, want), want_grads = grads(lambda *a: model.context_attention(*a, chunk=256))
    (_, got), got_grads = grads(model.splash_attention)
for name, g, w in zip(("out", "q", "k", "v"), (got, *got_grads), (want, *want_grads)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    error = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-6)
    print(name, error)
    assert error < {TOLERANCE}, (name, error)
"""


def test_the_kernel_on_the_chip_agrees_with_the_xla_path():
    run_on_the_chip(COMPARE)
