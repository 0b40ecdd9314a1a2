"""GRPO loss and the chunked log-prob pass (no engine; a one-device mesh where weights are gathered)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_delta_rule_kernel import dot_generals

from rl_trainer_bench.engine.builtin import loss
from rl_trainer_bench.engine.builtin.sharding import make_mesh
from rl_trainer_bench.engine.config import LossConfig, MeshConfig


def _weighted(logps, data):
    """A loss linear in each token's log-prob, the form `loss_with_gradient_in_forward` takes."""
    return logps * data["weights"]


def _logps_by(gradient, weights, sharded):
    """fn(h, w, targets, chunk) -> logps whose weighted sum has the gradient `gradient` names
    (in_forward: the loss itself carries the weights, and the weighted logps are returned)."""
    if gradient != "in_forward":
        by = loss.sharded_logps if sharded else loss.chunked_logps
        return lambda h, w, tgt, chunk: by(h, w, tgt, chunk, jnp.float32, gradient) * weights
    by = loss.sharded_loss_in_forward if sharded else loss.loss_with_gradient_in_forward

    def weighted_logps(h, w, tgt, chunk):
        total, logps = by(h, w, tgt, {"weights": weights}, chunk, jnp.float32, _weighted)
        # the sum carries the gradient, the logps none: their weighted sum plus (total - its
        # stopped value) is the same number with the sum's gradient
        weighted = logps * weights
        return weighted + (total - jax.lax.stop_gradient(total)) / weighted.size

    return weighted_logps


@pytest.mark.parametrize("gradient", ["autodiff", "saved_lse", "in_forward"])
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
        return lambda h, w: fn(h, w).sum()

    def whole(h, w):
        return loss.token_logps(h, w, targets, jnp.float32) * weights

    def per_device(h, w):
        return _logps_by(gradient, weights, sharded=True)(h, w, targets, 8)

    # compiled, not op by op: each compiles once in less time than its ops are dispatched
    expected = jax.jit(jax.grad(total(whole), argnums=(0, 1)))(hidden, head)
    with jax.set_mesh(make_mesh(MeshConfig(fsdp=2, context=2, expert=2))):
        sharded = (
            jax.jit(per_device)(hidden, head),
            jax.jit(jax.grad(total(per_device), (0, 1)))(hidden, head),
        )
    for chunk in (4, 32):

        def chunked_fn(h, w, c=chunk):
            return _logps_by(gradient, weights, sharded=False)(h, w, targets, c)

        chunked = jax.jit(chunked_fn)(hidden, head)
        grads = jax.jit(jax.grad(total(chunked_fn), (0, 1)))(hidden, head)
        for got, got_grads in ((chunked, grads), sharded):
            np.testing.assert_allclose(got, whole(hidden, head), rtol=1e-5, atol=1e-5)
            for g, want in zip(got_grads, expected, strict=True):
                np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_the_gradients_by_hand_in_bfloat16_are_the_float64_gradient_to_bfloat16_rounding():
    """At the chips' compute dtype (bfloat16 hidden states and head) the rules by hand round the
    logits' gradient to bfloat16 before their two matmuls, as a TPU's default precision does. Every
    gradient stays within 2% (of the largest entry) of the float64 gradient of the same inputs."""
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
    for gradient in ("autodiff", "saved_lse", "in_forward"):
        logps_by = _logps_by(gradient, weights, sharded=False)
        grads = jax.jit(jax.grad(lambda h, w, by=logps_by: by(h, w, targets, 16).sum(), (0, 1)))(
            hidden, head
        )
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


def _loss_and_grads(batch, beta, gradient="saved_lse"):
    config = LossConfig(beta=beta, compute_logps_chunk_size=4, logps_gradient=gradient)
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


@pytest.mark.parametrize("gradient", ["saved_lse", "in_forward"])
def test_masked_minus_inf_and_nan_give_the_loss_and_gradients_of_zeros_there(gradient):
    masked = jnp.array([[True, False, False, True, False, False, True, True]])
    for beta in (0.0, 0.1):
        clean = {
            name: jnp.where(masked, 0, array) if name.endswith(("logps", "advantages")) else array
            for name, array in _small_batch().items()
        }
        clean_value, clean_grads, _ = _loss_and_grads(clean, beta, gradient)
        hostile = dict(clean)
        for field, bad in (("old_logps", -jnp.inf), ("ref_logps", -1e30), ("advantages", jnp.nan)):
            hostile[field] = jnp.where(masked, bad, clean[field])
        value, grads, stats = _loss_and_grads(hostile, beta, gradient)
        assert np.isfinite(value) and np.isfinite(stats["mult_prob_error_max"])
        np.testing.assert_allclose(value, clean_value, rtol=1e-6)
        for got, want in zip(grads, clean_grads, strict=True):
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _grpo_batch(rows, tokens, vocab):
    """A random GRPO micro-batch: two segments a row, completions in each, log-probs near the
    policy's so the ratio is clipped on some tokens and not on others."""
    keys = jax.random.split(jax.random.key(7), 5)
    segments = jnp.where(jnp.arange(tokens) < tokens // 2, 1, 2)[None].repeat(rows, 0)
    return {
        "input_ids": jax.random.randint(keys[0], (rows, tokens), 0, vocab),
        "segment_ids": segments.at[:, -2:].set(0),
        "completion_mask": (jax.random.uniform(keys[1], (rows, tokens)) < 0.7).astype(jnp.int32),
        "advantages": jax.random.normal(keys[2], (rows, tokens)),
        "old_logps": -3.0 + 0.3 * jax.random.normal(keys[3], (rows, tokens)),
        "ref_logps": -3.0 + 0.3 * jax.random.normal(keys[4], (rows, tokens)),
    }


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_the_gradient_formed_in_the_forward_pass_is_autodiffs_on_one_device_and_a_mesh(beta):
    """The GRPO loss of a micro-batch with `logps_gradient=in_forward`: the same value, stats and
    gradients as autodiff of the rematerialized chunks, on one device and per device of the 2x2x2
    mesh, the loss divided by its token count and scaled (an incoming gradient other than 1, which
    the backward pass must carry into the saved gradients)."""
    batch = _grpo_batch(4, 32, 48)
    hidden = jax.random.normal(jax.random.key(0), (4, 32, 8))
    head = jax.random.normal(jax.random.key(1), (8, 48)) / 3

    def run(gradient, mesh):
        config = LossConfig(beta=beta, compute_logps_chunk_size=8, logps_gradient=gradient)

        def objective(h, w):
            loss_sum, stats = loss.micro_batch_loss(h, w, batch, config)
            return 3.7 * loss_sum / stats["loss_denominator"], stats

        with jax.set_mesh(mesh):
            return jax.jit(jax.value_and_grad(objective, (0, 1), has_aux=True))(hidden, head)

    for mesh in (
        make_mesh(MeshConfig(), jax.devices()[:1]),
        make_mesh(MeshConfig(fsdp=2, context=2, expert=2)),
    ):
        (value, stats), grads = run("in_forward", mesh)
        (want_value, want_stats), want_grads = run("autodiff", mesh)
        np.testing.assert_allclose(value, want_value, rtol=1e-5)
        assert abs(float(value)) > 0.1  # not a loss of zeros
        for name in ("loss_denominator", "mult_prob_error_max"):
            np.testing.assert_allclose(stats[name], want_stats[name], rtol=1e-5)
        for got, want in zip(grads, want_grads, strict=True):
            assert np.abs(np.asarray(want)).max() > 1e-3
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_the_gradient_in_the_forward_pass_takes_three_matmuls_where_saved_lse_takes_four():
    """What `in_forward` is for: the loss's value and gradient in three matmuls of the head (the
    logits, d h, d W), not four (`saved_lse` forms the logits again in the backward pass)."""
    batch = _grpo_batch(2, 16, 32)
    hidden = jax.random.normal(jax.random.key(0), (2, 16, 8))
    head = jax.random.normal(jax.random.key(1), (8, 32))
    counts = {}
    for gradient in ("saved_lse", "in_forward"):
        config = LossConfig(compute_logps_chunk_size=8, logps_gradient=gradient)
        with jax.set_mesh(make_mesh(MeshConfig(), jax.devices()[:1])):
            jaxpr = jax.make_jaxpr(
                jax.grad(lambda h, w, c=config: loss.micro_batch_loss(h, w, batch, c)[0], (0, 1))
            )(hidden, head)
        counts[gradient] = len(list(dot_generals(jaxpr.jaxpr)))
    assert counts == {"saved_lse": 4, "in_forward": 3}
