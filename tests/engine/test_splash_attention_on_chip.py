"""attention=splash on a TPU chip: the compiled kernel (not its interpreter) against the XLA path,
outputs and gradients in bfloat16 as the engine computes, within a stated tolerance, at the
one-chip presets' heads (16 query heads over 4 key/value heads of 128) over packed rows with
padding, rows of 2,048 tokens: 4 of the kernel's blocks of 512 (the presets' rows of 4,096 add
blocks, not cases).

On the chip through `chip_subprocess` (skipped elsewhere), alone:
    python -m pytest -q -m tpu_chip tests/engine/test_splash_attention_on_chip.py
"""

from pathlib import Path

from chip_subprocess import ON_A_CHIP, run_on_the_chip

pytestmark = ON_A_CHIP

# bfloat16 inputs, float32 accumulation on both paths: the kernel's online softmax and the XLA
# path's whole-row softmax round differently, by about bfloat16's precision
TOLERANCE = 2e-2
COMPARE = f"""
import sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from side_by_side import side_by_side
from rl_trainer_bench.engine.builtin import model, sharding
from rl_trainer_bench.engine.config import MeshConfig
B, T = 4, 2048
rng = np.random.default_rng(0)  # on the host: the chip compiles only the programs compared
q, k, v = (
    jnp.asarray(rng.standard_normal((B, T, heads, 128), np.float32), jnp.bfloat16)
    for heads in (16, 4, 4)
)
segments = np.ones((B, T), np.int32)
segments[0, 700:] = 2  # a second sequence inside a kernel block
segments[1, 1024:] = 3  # ... at a block's first token
segments[2, 1500:] = 0  # padding at the end
segments[3] = np.repeat(np.arange(1, 17), T // 16)  # sixteen short sequences
segments = jnp.asarray(segments)
weights = jnp.asarray(rng.standard_normal(q.shape, np.float32))
mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
def grads(attend):
    def loss(q, k, v):
        out = attend(q, k, v, segments).astype(jnp.float32) * (segments != 0)[:, :, None, None]
        return jnp.sum(out * weights), out
    with jax.set_mesh(mesh):
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        return [np.asarray(a, np.float32) for a in (out, *grads)]
want, got = side_by_side(
    lambda: grads(lambda *a: model.context_attention(*a, chunk=256)),
    lambda: grads(model.splash_attention),
)
for name, g, w in zip(("out", "q", "k", "v"), got, want):
    error = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-6)
    print(name, error)
    assert error < {TOLERANCE}, (name, error)
"""


def test_the_kernel_on_the_chip_agrees_with_the_xla_path():
    run_on_the_chip(COMPARE)
