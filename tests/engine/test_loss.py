"""GRPO loss and the chunked log-prob pass (no engine; a one-device mesh where weights are gathered)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_trainer_bench.engine.builtin import loss
from rl_trainer_bench.engine.builtin.sharding import make_mesh
from rl_trainer_bench.engine.config import LossConfig, MeshConfig


@pytest.mark.parametrize("gradient", ["autodiff", "saved_lse"])
def test_chunked_logps_equal_unchunked_values_and_gradients(gradient):
    """In chunks on one device, and per device of the 2x2x2 mesh (rows over fsdp x expert, the
    sequence over context) with the head gathered inside: the same values and gradients as
    autodiff of the unchunked log-softmax, by either gradient (weights per token, so a rule that
    dropped the incoming gradient would show)."""
    hidden = jax.random.normal(jax.random.key(0), (4, 32, 8))
    head = jax.random.normal(jax.random.key(1), (8, 48))
    targets = jax.random.randint(jax.random.key(2), (4, 32), 0, 48)
    weights = jax.random.uniform(jax.random.key(3), (4, 32), minval=-1.0, maxval=2.0)

    def total(fn):
        return lambda h, w: (fn(h, w) * weights).sum()

    def whole(h, w):
        return loss.token_logps(h, w, targets, jnp.float32)

    def per_device(h, w):
        return loss.sharded_logps(h, w, targets, 8, jnp.float32, gradient)

    expected = jax.grad(total(whole), argnums=(0, 1))(hidden, head)
    with jax.set_mesh(make_mesh(MeshConfig(fsdp=2, context=2, expert=2))):
        sharded = (
            jax.jit(per_device)(hidden, head),
            jax.jit(jax.grad(total(per_device), (0, 1)))(hidden, head),
        )
    for chunk in (4, 32):

        def chunked_fn(h, w, c=chunk):
            return loss.chunked_logps(h, w, targets, c, jnp.float32, gradient)

        chunked = chunked_fn(hidden, head)
        grads = jax.grad(total(chunked_fn), (0, 1))(hidden, head)
        for got, got_grads in ((chunked, grads), sharded):
            np.testing.assert_allclose(got, whole(hidden, head), rtol=1e-5, atol=1e-5)
            for g, want in zip(got_grads, expected, strict=True):
                np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_the_saved_lse_gradient_in_bfloat16_is_the_float64_gradient_to_bfloat16_rounding():
    """At the chips' compute dtype (bfloat16 hidden states and head) the rule by hand rounds the
    logits' gradient to bfloat16 before its two matmuls, as a TPU's default precision does. Both
    gradients stay within 2% (of the largest entry) of the float64 gradient of the same inputs."""
    hidden = jax.random.normal(jax.random.key(0), (2, 64, 32), jnp.bfloat16)
    head = (jax.random.normal(jax.random.key(1), (32, 512)) / 4).astype(jnp.bfloat16)
    targets = jax.random.randint(jax.random.key(2), (2, 64), 0, 512)
    weights = jax.random.uniform(jax.random.key(3), (2, 64), minval=-1.0, maxval=2.0)
    h64, w64 = np.asarray(hidden, np.float64), np.asarray(head, np.float64)
    logits = h64 @ w64
    soft = np.exp(logits - logits.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    d_logits = (np.eye(512)[np.asarray(targets)] - soft) * np.asarray(weights)[..., None]
    want = (d_logits @ w64.T, np.einsum("btd,btv->dv", h64, d_logits))
    for gradient in ("autodiff", "saved_lse"):
        grads = jax.grad(
            lambda h, w, g=gradient: (
                loss.chunked_logps(h, w, targets, 16, jnp.float32, g) * weights
            ).sum(),
            (0, 1),
        )(hidden, head)
        for got, expected in zip(grads, want, strict=True):
            scale = np.abs(expected).max()
            np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=0.02 * scale)


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


def _small_batch():
    ids = jnp.array([[3, 7, 1, 4, 9, 2, 5, 0]])
    segments = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]])
    return {
        "input_ids": ids,
        "segment_ids": segments,
        "completion_mask": jnp.array([[0, 1, 1, 0, 1, 1, 0, 0]], jnp.int32),
        "advantages": jnp.array([[0.5, 0.5, 0.5, 0.5, -1.0, -1.0, -1.0, 0.0]]),
        "old_logps": jnp.full((1, 8), -2.0),
        "ref_logps": jnp.full((1, 8), -2.5),
    }


def _loss_and_grads(batch, beta):
    config = LossConfig(beta=beta, compute_logps_chunk_size=4)
    hidden = jax.random.normal(jax.random.key(0), (1, 8, 6))
    head = jax.random.normal(jax.random.key(1), (6, 10))

    def total(h, w, arrays):
        loss_sum, stats = loss.micro_batch_loss(h, w, arrays, config)
        return loss_sum / stats["loss_denominator"], stats

    with jax.set_mesh(make_mesh(MeshConfig(), jax.devices()[:1])):
        (value, stats), grads = jax.jit(jax.value_and_grad(total, argnums=(0, 1), has_aux=True))(
            hidden, head, batch
        )
    return value, grads, stats


def test_masked_minus_inf_and_nan_give_the_loss_and_gradients_of_zeros_there():
    masked = jnp.array([[True, False, False, True, False, False, True, True]])
    for beta in (0.0, 0.1):
        clean = {
            name: jnp.where(masked, 0, array) if name.endswith(("logps", "advantages")) else array
            for name, array in _small_batch().items()
        }
        clean_value, clean_grads, _ = _loss_and_grads(clean, beta)
        hostile = dict(clean)
        for field, bad in (("old_logps", -jnp.inf), ("ref_logps", -1e30), ("advantages", jnp.nan)):
            hostile[field] = jnp.where(masked, bad, clean[field])
        value, grads, stats = _loss_and_grads(hostile, beta)
        assert np.isfinite(value) and np.isfinite(stats["mult_prob_error_max"])
        np.testing.assert_allclose(value, clean_value, rtol=1e-6)
        for got, want in zip(grads, clean_grads, strict=True):
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
