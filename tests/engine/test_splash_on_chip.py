"""attention=splash on a TPU chip: the compiled splash kernel (not its interpreter) against the
query-chunked XLA attention it replaces, at the one-chip presets' attention shapes (16 query heads
over 4 key/value heads of 128, rows of 4,096 tokens) in bfloat16 as the engine computes, over
packed rows with padding: outputs and the gradients of q, k and v within a stated tolerance.

The test session keeps JAX on the host CPU, so the comparison runs in a subprocess on the chip; on a
host without a TPU chip it is skipped. Run it alone (one process can hold the chip):
    python -m pytest -m tpu_chip -p no:xdist tests/engine/test_splash_on_chip.py
"""

import os
import subprocess
import sys

import pytest

from rl_trainer_bench import local_chips

pytestmark = [
    pytest.mark.tpu_chip,
    pytest.mark.skipif(local_chips.local_tpu() is None, reason="needs a TPU chip on this host"),
]

# bfloat16 operands with float32 softmax statistics in both: the kernel sums its blocks' scores in
# another order and rescales them online, so the two differ by about bfloat16's precision
TOLERANCE = 2e-2
COMPARE = f"""
import jax, jax.numpy as jnp, numpy as np
from rl_trainer_bench.engine.builtin import model, sharding
from rl_trainer_bench.engine.config import MeshConfig
B, T, H, KV, W = 4, 4096, 16, 4, 128
keys = jax.random.split(jax.random.key(0), 4)
q, k, v = (jax.random.normal(key, (B, T, heads, W), jnp.bfloat16)
           for key, heads in zip(keys[:3], (H, KV, KV)))
weights = jax.random.normal(keys[3], (B, T, H, W), jnp.float32)
segments = np.ones((B, T), np.int32)
segments[0, 1000:] = 2      # a second sequence inside a kernel block
segments[1, 2048:] = 3      # ... at a block's first token
segments[2, 3000:] = 0      # padding at the end
segments[3] = np.repeat(np.arange(1, 17), T // 16)  # sixteen short sequences
segments = jnp.asarray(segments)
def grads(attend):
    def loss(q, k, v):
        out = attend(q, k, v, segments) * (segments != 0)[:, :, None, None]
        return jnp.sum(out.astype(jnp.float32) * weights), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
with jax.set_mesh(mesh):
    (_, want), want_grads = grads(lambda q, k, v, s: model.context_attention(q, k, v, s, chunk=256))
    (_, got), got_grads = grads(model.splash_attention)
leaves = zip(jax.tree.leaves((got, got_grads)), jax.tree.leaves((want, want_grads)))
for i, (g, w) in enumerate(leaves):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    error = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-6)
    print(i, error)
    assert error < {TOLERANCE}, (i, error)
"""


def test_the_kernel_on_the_chip_agrees_with_the_xla_attention():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    done = subprocess.run(
        [sys.executable, "-c", COMPARE], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
