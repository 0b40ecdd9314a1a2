"""GRPO loss and the chunked log-prob pass (no engine, no mesh)."""

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.engine import loss
from rl_trainer_bench.engine.config import LossConfig


def test_chunked_logps_equal_unchunked_values_and_gradients():
    hidden = jax.random.normal(jax.random.key(0), (2, 32, 8))
    head = jax.random.normal(jax.random.key(1), (8, 50))
    targets = jax.random.randint(jax.random.key(2), (2, 32), 0, 50)

    def total(h, w, chunk, shards):
        return loss.chunked_logps(h, w, targets, chunk, shards).sum()

    whole = loss.token_logps(hidden, head, targets, jnp.float32)
    for chunk, shards in ((4, 1), (8, 2)):
        chunked = loss.chunked_logps(hidden, head, targets, chunk, shards)
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)
        grads = jax.grad(total, argnums=(0, 1))(hidden, head, chunk, shards)
        expected = jax.grad(total, argnums=(0, 1))(hidden, head, 32, 1)
        for got, want in zip(grads, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_targets_stop_at_segment_boundaries():
    ids = jnp.array([[10, 11, 12, 20, 21, 0]])
    segments = jnp.array([[1, 1, 1, 2, 2, 0]])
    targets, has_target = loss.next_token_targets(ids, segments)
    np.testing.assert_array_equal(has_target[0], [True, True, False, True, False, False])
    np.testing.assert_array_equal(targets[0, :2], [11, 12])


def test_surrogate_clips_the_ratio_and_adds_k3_kl():
    config = LossConfig(epsilon=0.2, epsilon_high=0.3, beta=0.5)
    old = jnp.zeros(3)
    logps = jnp.log(jnp.array([2.0, 0.5, 1.0]))
    advantages = jnp.array([1.0, -1.0, 1.0])
    ref = jnp.array([0.0, 0.0, jnp.log(2.0)])
    got = loss.grpo_token_loss(logps, old, advantages, config, ref)
    delta = ref - logps
    kl = np.exp(delta) - delta - 1
    expected = np.array([-1.3, 0.8, -1.0]) + 0.5 * kl  # min(r A, clip(r) A), negated
    np.testing.assert_allclose(got, expected, rtol=1e-6)
