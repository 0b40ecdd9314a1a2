"""GRPO loss of one micro-batch, from log-probs computed chunk by chunk (docs/engine.md).

The log-probs of a 65k-token row against a 250k vocabulary would need [B, T, V] float32 logits
(terabytes); `chunked_logps` scans over sequence chunks and rematerializes each chunk's logits in
the backward pass, so the head's peak memory is O(B x chunk x V). The loss is returned as a sum with
its token count, because the step divides once by the count over all of its micro-batches.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.model import merge_chunks, split_chunks
from rl_trainer_bench.engine.config import LossConfig


def next_token_targets(input_ids, segment_ids):
    """target[t] = input_ids[t + 1] inside the same segment; has_target marks where one exists."""
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
    next_segment = jnp.concatenate([segment_ids[:, 1:], jnp.zeros_like(segment_ids[:, :1])], axis=1)
    has_target = (segment_ids != 0) & (next_segment == segment_ids)
    return targets, has_target


def _logits(hidden, head, logits_dtype):
    """hidden [..., D] @ head [D, V] in float32, accumulated (and rounded) in `logits_dtype`."""
    logits = jnp.einsum(
        "...d,dv->...v", hidden, head.astype(hidden.dtype), preferred_element_type=logits_dtype
    )
    return logits.astype(jnp.float32)


def _picked(logits, targets):
    """logits[..., target]: a select against the vocabulary index, whose gradient is a select too
    (a gather's is a scatter into [..., V])."""
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)


def token_logps(hidden, head, targets, logits_dtype):
    """log_softmax(hidden @ head)[target] for hidden [..., D], targets [...]."""
    logits = _logits(hidden, head, logits_dtype)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def token_logps_saving_lse(hidden, head, targets, logits_dtype):
    """`token_logps` with its gradient by hand: the forward keeps each token's log-sum-exp, so the
    backward forms the logits once, as softmax - one-hot scaled by the incoming gradient, where
    autodiff under remat recomputes the logits and their reductions and reads the float32 logits
    again in each of the two gradient matmuls (docs/engine.md, "Log-probs")."""
    logits = _logits(hidden, head, logits_dtype)
    return _picked(logits, targets) - jax.nn.logsumexp(logits, axis=-1)


def _saving_lse_forward(hidden, head, targets, logits_dtype):
    logits = _logits(hidden, head, logits_dtype)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return _picked(logits, targets) - lse, (hidden, head, targets, lse)


def _head_gradients(hidden, head, logits, lse, targets, d_logps):
    """(d hidden, d head in float32) from a chunk's logits: d logp_t / d logits_t = one-hot(target_t)
    - softmax_t, scaled by d logp_t; the two matmuls take it in the compute dtype, as a TPU's
    default precision rounds a float32 operand."""
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    one_hot = (vocab == targets[..., None]).astype(jnp.float32)
    d_logits = (one_hot - jnp.exp(logits - lse[..., None])) * d_logps[..., None]
    d_logits = d_logits.astype(hidden.dtype)
    d_hidden = jnp.einsum("...v,dv->...d", d_logits, head.astype(hidden.dtype))
    batch = "".join(chr(ord("a") + i) for i in range(hidden.ndim - 1))
    d_head = jnp.einsum(
        f"{batch}d,{batch}v->dv", hidden, d_logits, preferred_element_type=jnp.float32
    )
    return d_hidden, d_head


def _saving_lse_backward(logits_dtype, saved, grad):
    hidden, head, targets, lse = saved
    logits = _logits(hidden, head, logits_dtype)
    d_hidden, d_head = _head_gradients(hidden, head, logits, lse, targets, grad)
    return d_hidden, d_head.astype(head.dtype), None


token_logps_saving_lse.defvjp(_saving_lse_forward, _saving_lse_backward)


def chunked_logps(hidden, head, targets, chunk, logits_dtype=jnp.float32, gradient="autodiff"):
    """token_logps of a device's tokens [b, t] in chunks of `chunk` tokens.

    gradient `autodiff`: each chunk rematerialized and differentiated by JAX; `saved_lse`: the
    hand-written rule of `token_logps_saving_lse`, which keeps a float per token, not the logits.
    """
    if gradient == "saved_lse":

        def one_chunk(_, inputs):
            h, tgt = inputs
            return None, token_logps_saving_lse(h, head, tgt, logits_dtype)

    else:

        @jax.checkpoint
        def one_chunk(_, inputs):
            h, tgt = inputs
            return None, token_logps(h, head, tgt, logits_dtype)

    _, logps = jax.lax.scan(
        one_chunk, None, (split_chunks(hidden, chunk), split_chunks(targets, chunk))
    )
    return merge_chunks(logps)


def _gathered_for_the_head(hidden, head, spec):
    """The head gathered on a device, tied to the last layer's output.

    The barrier ties the head's gather to the last layer's output: free of any data dependence, XLA
    would gather it at the start of the program and hold the whole head ([D, V] bf16, 1.9 GiB on
    the 397B cell, twice with its relaid copy) through every layer (MEASURED in the replay's live
    ranges for tpu7x, benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md).
    """
    hidden, head = jax.lax.optimization_barrier((hidden, head))
    return hidden, sharding.gather_dims(head, spec)


def sharded_logps(hidden, head, targets, chunk, logits_dtype, gradient="autodiff"):
    """`chunked_logps` on every device's own tokens, the head gathered once per device.

    hidden [B, T, D] and targets [B, T] split like the tokens; head [D, V] in the compute dtype,
    split as its parameter. The head's gradient is summed per device in that dtype and
    reduce-scattered back to the parameter's split.
    """
    spec = sharding.parameter_spec("head", head.shape, sharding.ambient_mesh_shape())

    def per_device(hidden, head, targets):
        hidden, head = _gathered_for_the_head(hidden, head, spec)
        chunk_size = min(chunk, targets.shape[1])
        return chunked_logps(hidden, head, targets, chunk_size, logits_dtype, gradient)

    return jax.shard_map(
        per_device,
        in_specs=(sharding.ACTIVATIONS, spec, sharding.TOKENS),
        out_specs=sharding.TOKENS,
        check_vma=False,
    )(hidden, head, targets)


def _head_pass(hidden, head, targets, data, chunk, logits_dtype, loss_of_logps, gradients):
    """(loss sum, logps[, d hidden, d head]) of a device's tokens, chunk by chunk.

    `loss_of_logps(logps, data)` is the per-token loss; with `gradients`, each chunk also turns its
    logits into the loss's gradient while they are formed (`_head_gradients` at dL/dlogp), d W
    summed over chunks in float32."""

    def one_chunk(d_head, inputs):
        h, tgt, chunk_data = inputs
        logits = _logits(h, head, logits_dtype)
        lse = jax.nn.logsumexp(logits, axis=-1)
        logps = _picked(logits, tgt) - lse
        per_token, pull_back = jax.vjp(lambda lp: loss_of_logps(lp, chunk_data), logps)
        if not gradients:
            return d_head, (per_token.sum(), logps, None)
        (d_logps,) = pull_back(jnp.ones_like(per_token))
        d_h, d_head_of_chunk = _head_gradients(h, head, logits, lse, tgt, d_logps)
        return d_head + d_head_of_chunk, (per_token.sum(), logps, d_h)

    chunks = (split_chunks(hidden, chunk), split_chunks(targets, chunk))
    chunks += (jax.tree.map(lambda x: split_chunks(x, chunk), data),)
    d_head, (sums, logps, d_hidden) = jax.lax.scan(
        one_chunk, jnp.zeros(head.shape, jnp.float32), chunks
    )
    if not gradients:
        return sums.sum(), merge_chunks(logps)
    return sums.sum(), merge_chunks(logps), merge_chunks(d_hidden), d_head


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def loss_with_gradient_in_forward(hidden, head, targets, data, chunk, logits_dtype, loss_of_logps):
    """(sum of `loss_of_logps` over a device's tokens, their logps), its gradient formed in the
    forward pass: the loss is a sum of per-token terms of each token's own log-prob, so each
    chunk's d z is known as soon as its logits are, and the backward pass only scales the saved
    d h and d W by the loss's incoming gradient (no logits formed again: docs/engine.md,
    "Log-probs"). The logps output carries no gradient (its cotangent is dropped): callers stop it.
    """
    return _head_pass(hidden, head, targets, data, chunk, logits_dtype, loss_of_logps, False)


def _in_forward_forward(hidden, head, targets, data, chunk, logits_dtype, loss_of_logps):
    loss_sum, logps, d_hidden, d_head = _head_pass(
        hidden, head, targets, data, chunk, logits_dtype, loss_of_logps, True
    )
    return (loss_sum, logps), (d_hidden, d_head.astype(head.dtype))


def _in_forward_backward(chunk, logits_dtype, loss_of_logps, saved, cotangents):
    d_hidden, d_head = saved
    grad = cotangents[0]  # the logps' cotangent is dropped: the caller stops their gradient
    return (
        (d_hidden * grad).astype(d_hidden.dtype),
        (d_head * grad).astype(d_head.dtype),
        None,
        None,
    )


loss_with_gradient_in_forward.defvjp(_in_forward_forward, _in_forward_backward)


def sharded_loss_in_forward(hidden, head, targets, data, chunk, logits_dtype, loss_of_logps):
    """(loss sum, logps) of every device's own tokens by `loss_with_gradient_in_forward`, the head
    gathered once per device; each device's sum is its own element of a [rows shards, context
    shards] array (summed outside), so each gets the loss's gradient as it is, whatever the mesh.
    """
    spec = sharding.parameter_spec("head", head.shape, sharding.ambient_mesh_shape())

    def per_device(hidden, head, targets, data):
        hidden, head = _gathered_for_the_head(hidden, head, spec)
        chunk_size = min(chunk, targets.shape[1])
        loss_sum, logps = loss_with_gradient_in_forward(
            hidden, head, targets, data, chunk_size, logits_dtype, loss_of_logps
        )
        return loss_sum.reshape(1, 1), jax.lax.stop_gradient(logps)

    sums, logps = jax.shard_map(
        per_device,
        in_specs=(sharding.ACTIVATIONS, spec, sharding.TOKENS, sharding.TOKENS),
        out_specs=(sharding.TOKENS, sharding.TOKENS),
        check_vma=False,
    )(hidden, head, targets, data)
    return sums.sum(), logps


def grpo_token_loss(logps, old_logps, advantages, config: LossConfig, ref_logps=None, mask=None):
    """-min(r A, clip(r, 1 - eps, 1 + eps_high) A) + beta * k3 KL, per token; 0 where `mask` is False.

    Masked positions are replaced before any exponent: a payload from elsewhere may hold -inf or a
    very negative log-prob there, and exp of it times a zero weight is inf x 0 = NaN, which would
    poison the loss and every gradient. With the log-ratios and advantages zeroed first, a masked
    position contributes exactly 0 whatever it holds.
    """
    if mask is not None:
        old_logps = jnp.where(mask, old_logps, logps)
        advantages = jnp.where(mask, advantages, 0.0)
        if ref_logps is not None:
            ref_logps = jnp.where(mask, ref_logps, logps)
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1.0 - config.epsilon, 1.0 + config.epsilon_high)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    if config.beta > 0:
        delta = ref_logps - logps
        loss = loss + config.beta * (jnp.exp(delta) - delta - 1.0)
    return loss if mask is None else jnp.where(mask, loss, 0.0)


def _grpo_of_logps(logps, data, config: LossConfig):
    """`grpo_token_loss` of the log-probs with the rest of its inputs in one mapping, the form the
    head's pass takes chunk by chunk."""
    return grpo_token_loss(
        logps, data["old_logps"], data["advantages"], config, data.get("ref_logps"), data["mask"]
    )


def micro_batch_loss(hidden, head, batch, config: LossConfig):
    """(loss sum S, stats) for one micro-batch; stats hold the count N and the probability error.

    The mask is the payload's completion mask where a target exists (a segment's last token has
    none); the completion mask is input-aligned (see `contract.Payload`): position t counts when token t+1
    is a completion token. Nothing at a masked position reaches an exponent.
    """
    targets, has_target = next_token_targets(batch["input_ids"], batch["segment_ids"])
    mask = (batch["completion_mask"] != 0) & has_target
    logits_dtype = jnp.dtype(config.logits_dtype)
    head = head.astype(hidden.dtype)  # gathered once per device, not once per chunk
    chunk = config.compute_logps_chunk_size
    data = {"old_logps": batch["old_logps"], "advantages": batch["advantages"], "mask": mask}
    if batch.get("ref_logps") is not None:
        data["ref_logps"] = batch["ref_logps"]
    loss_of_logps = functools.partial(_grpo_of_logps, config=config)
    if config.logps_gradient == "in_forward":
        loss_sum, logps = sharded_loss_in_forward(
            hidden, head, targets, data, chunk, logits_dtype, loss_of_logps
        )
    else:
        logps = sharded_logps(hidden, head, targets, chunk, logits_dtype, config.logps_gradient)
        loss_sum = jnp.sum(loss_of_logps(logps, data))
    seen_logps = jax.lax.stop_gradient(logps)
    old_logps = jnp.where(mask, batch["old_logps"], seen_logps)
    prob_error = jnp.abs(jnp.exp(seen_logps - old_logps) - 1.0)
    stats = {
        "loss_denominator": mask.astype(jnp.float32).sum(),
        "mult_prob_error_max": jnp.max(prob_error),
    }
    return loss_sum, stats
