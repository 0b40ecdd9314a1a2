"""GRPO loss of one micro-batch, from log-probs computed chunk by chunk (docs/engine.md).

The log-probs of a 65k-token row against a 250k vocabulary would need [B, T, V] float32 logits
(terabytes); `chunked_logps` scans over sequence chunks and rematerializes each chunk's logits in
the backward pass, so the head's peak memory is O(B x chunk x V). The loss is returned as a sum with
its token count, because the step divides once by the count over all of its micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine.config import LossConfig
from rl_trainer_bench.engine.model import compute_weight, merge_chunks, split_chunks


def next_token_targets(input_ids, segment_ids):
    """target[t] = input_ids[t + 1] inside the same segment; has_target marks where one exists."""
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
    next_segment = jnp.concatenate([segment_ids[:, 1:], jnp.zeros_like(segment_ids[:, :1])], axis=1)
    has_target = (segment_ids != 0) & (next_segment == segment_ids)
    return targets, has_target


def token_logps(hidden, head, targets, logits_dtype):
    """log_softmax(hidden @ head)[target] for hidden [..., D], targets [...]."""
    logits = jnp.einsum(
        "...d,dv->...v", hidden, head.astype(hidden.dtype), preferred_element_type=logits_dtype
    )
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def chunked_logps(hidden, head, targets, chunk, shards, logits_dtype=jnp.float32):
    """token_logps over [B, T] in chunks of `chunk` tokens per context shard, each rematerialized."""

    @jax.checkpoint
    def one_chunk(_, inputs):
        h, tgt = inputs
        return None, token_logps(h, head, tgt, logits_dtype)

    xs = (split_chunks(hidden, chunk, shards), split_chunks(targets, chunk, shards))
    _, logps = jax.lax.scan(one_chunk, None, xs)
    return merge_chunks(logps)


def grpo_token_loss(logps, old_logps, advantages, config: LossConfig, ref_logps=None):
    """-min(r A, clip(r, 1 - eps, 1 + eps_high) A) + beta * k3 KL, per token."""
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1.0 - config.epsilon, 1.0 + config.epsilon_high)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    if config.beta > 0:
        delta = ref_logps - logps
        loss = loss + config.beta * (jnp.exp(delta) - delta - 1.0)
    return loss


def micro_batch_loss(hidden, head, batch, config: LossConfig, shards: int):
    """(loss sum S, stats) for one micro-batch; stats hold the count N and the probability error.

    The mask is the payload's completion mask where a target exists (a segment's last token has none).
    """
    targets, has_target = next_token_targets(batch["input_ids"], batch["segment_ids"])
    mask = (batch["completion_mask"] != 0) & has_target
    logits_dtype = jnp.dtype(config.logits_dtype)
    chunk = min(config.compute_logps_chunk_size, targets.shape[1] // shards)
    head = compute_weight("head", head, hidden.dtype)  # gathered once, not once per chunk
    logps = chunked_logps(hidden, head, targets, chunk, shards, logits_dtype)
    per_token = grpo_token_loss(
        logps, batch["old_logps"], batch["advantages"], config, batch.get("ref_logps")
    )
    weights = mask.astype(jnp.float32)
    prob_error = jnp.abs(jnp.exp(jax.lax.stop_gradient(logps) - batch["old_logps"]) - 1.0)
    stats = {
        "loss_denominator": weights.sum(),
        "mult_prob_error_max": jnp.max(jnp.where(mask, prob_error, 0.0)),
    }
    return jnp.sum(per_token * weights), stats
