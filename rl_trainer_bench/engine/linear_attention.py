"""The gated delta rule in chunked (WY / UT-transform) form, over packed rows and context shards.

Per row and head, with the state S [Dv, Dk] reset to zero where a segment starts:
`S_t = a_t S_{t-1} + b_t (v_t - a_t S_{t-1} k_t) k_t^T`, `o_t = S_t q_t`, `a_t = exp(log_decay_t)`.
A per-token loop is sequential in T; the chunked form turns each chunk of C tokens into a few
dense matmuls and keeps only a chunk-to-chunk recurrence (docs/engine.md, "Gated DeltaNet"):

- inside a chunk the deltas `d_t = b_t (v_t - a_t S_{t-1} k_t)` solve one unit lower-triangular
  system `(I + A) [U | W] = [b v | b G k]`, so `d = U - W H` for the chunk's incoming state H = S^T;
- the outputs are `O = (G q) H + P d` with P the decay-weighted, causal `q k^T` of the chunk;
- the outgoing state is `H' = g H + (e k)^T d`.

G, e and g are the decays from the chunk start to each token, from each token to the chunk end and
across the whole chunk, each zeroed where a segment start lies in between, and A and P only link
tokens of the same segment: that is the whole of the packing logic.

Context parallelism: the engine splits T over the `context` mesh axis, so each shard holds a
contiguous span of every row. The span is an affine map of its incoming state, `H_out = M H_in + N`;
every shard finds its (M, N) in parallel by running the chunk recurrence on the extended state
[N | M] from [0 | I] (M follows the same recurrence as the state with zero values), the few (M, N)
are gathered and folded in sequence order, and every shard then runs its span again from its true
incoming state. This costs a second pass over the chunk recurrence (not over the projections) but
keeps all shards busy; passing states shard to shard instead would serialize the context axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """[B, T] bool: the token opens a run of equal segment ids (padding runs included)."""
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    return segment_ids != previous


def gated_delta_rule(q, k, v, log_decay, beta, segment_ids, *, chunk_size, context_shards=1):
    """Outputs o [B, T, H, Dv] of the gated delta rule (module docstring) over packed rows.

    q, k: [B, T, H, Dk], already normalised and scaled (nothing is applied to them here);
    v: [B, T, H, Dv]; log_decay, beta: [B, T, H]; segment_ids: [B, T], 0 = padding, whose outputs
    are zero and whose inputs are ignored. T splits into `context_shards` contiguous spans (the engine's context axis), each
    padded up to whole chunks with tokens that leave the state unchanged. Computed in float32,
    returned in v's dtype.
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    if t % context_shards:
        raise ValueError(f"sequence length {t} does not split into {context_shards} shards")
    span = t // context_shards
    chunk = min(chunk_size, span)
    padded = -(-span // chunk) * chunk

    def chunked(x, fill):
        """[B, T, ...] -> [n, B, S, C, ...], each shard's span padded to whole chunks with `fill`."""
        x = x.reshape(b, context_shards, span, *x.shape[2:])
        widths = [(0, 0)] * x.ndim
        widths[2] = (0, padded - span)
        x = jnp.pad(x, widths, constant_values=fill)
        x = x.reshape(b, context_shards, padded // chunk, chunk, *x.shape[3:])
        return jnp.moveaxis(x, 2, 0)

    # Padding tokens are made inert (whatever they hold, non-finite values included): a zero query
    # makes their output zero, and a run of them leaves nothing behind, as the next real token
    # opens a segment.
    real = segment_ids != 0
    f32 = jnp.float32
    q, k, v = (jnp.where(real[..., None, None], x, 0).astype(f32) for x in (q, k, v))
    beta = jnp.where(real[..., None], beta, 0).astype(f32)
    log_decay = jnp.where(real[..., None], log_decay, 0).astype(f32)
    starts = chunked(segment_starts(segment_ids), False)
    chunks = _chunk_terms(
        chunked(q, 0), chunked(k, 0), chunked(v, 0), chunked(log_decay, 0), chunked(beta, 0), starts
    )
    zeros = jnp.zeros((b, context_shards, h, dk, dv), f32)
    incoming = _incoming_states(chunks, zeros) if context_shards > 1 else zeros
    out = _chunk_outputs(chunks, incoming)  # [n, B, S, C, H, Dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, context_shards, padded, h, dv)[:, :, :span]
    return out.reshape(b, t, h, dv).astype(v.dtype)


def _chunk_terms(q, k, v, log_decay, beta, starts):
    """Everything of a chunk that does not depend on its incoming state, for all chunks at once.

    Inputs are [n, B, S, C, ...] (starts: bool [n, B, S, C]). Returns a dict of per-chunk terms.
    """
    run = jnp.cumsum(starts, axis=-1)  # [n, B, S, C]: segment starts seen so far in the chunk
    same = run[..., :, None] == run[..., None, :]  # [.., t, i]
    causal = jnp.tril(jnp.ones(same.shape[-2:], bool))
    strictly = causal & ~jnp.eye(same.shape[-1], dtype=bool)
    cum = jnp.cumsum(log_decay, axis=-2)  # [n, B, S, C, H]: log of a_1 ... a_t
    gap = cum[..., :, None, :] - cum[..., None, :, :]  # [.., t, i, H]: log of a_{i+1} ... a_t

    def decay(mask):
        return jnp.exp(jnp.where((mask & same)[..., None], gap, -jnp.inf))

    carried = (run == 0)[..., None]  # the incoming state still reaches token t
    from_start = jnp.where(carried, jnp.exp(cum), 0.0)  # G [.., C, H]
    last = run[..., -1:]
    to_end = jnp.where((run == last)[..., None], jnp.exp(cum[..., -1:, :] - cum), 0.0)  # e
    across = jnp.where(carried[..., -1, :], jnp.exp(cum[..., -1, :]), 0.0)  # g [.., H]

    kk = jnp.einsum("...thd,...ihd->...tih", k, k)
    system = decay(strictly) * kk * beta[..., :, None, :]  # A [.., t, i, H]
    system = jnp.moveaxis(system, -1, -3) + jnp.eye(system.shape[-2])  # I + A [.., H, t, i]
    rhs = jnp.concatenate([v * beta[..., None], k * (beta * from_start)[..., None]], axis=-1)
    solved = jax.scipy.linalg.solve_triangular(
        system, jnp.moveaxis(rhs, -2, -3), lower=True, unit_diagonal=True
    )  # [.., H, C, Dv + Dk]
    dv = v.shape[-1]
    return {
        "u": solved[..., :dv],
        "w": solved[..., dv:],
        "q": jnp.moveaxis(q * from_start[..., None], -2, -3),  # G q [.., H, C, Dk]
        "p": jnp.moveaxis(decay(causal) * jnp.einsum("...thd,...ihd->...tih", q, k), -1, -3),
        "k": jnp.moveaxis(k * to_end[..., None], -2, -3),  # e k [.., H, C, Dk]
        "g": across,  # [.., H]
    }


def _advance(chunk, state, values):
    """The deltas and outgoing state of one chunk given its incoming state [B, S, H, Dk, X]."""
    deltas = values - jnp.einsum("...cd,...dx->...cx", chunk["w"], state)
    new = chunk["g"][..., None, None] * state + jnp.einsum("...cd,...cx->...dx", chunk["k"], deltas)
    return deltas, new


def _chunk_outputs(chunks, incoming):
    """Scan the chunks of every shard from its incoming state; outputs [n, B, S, C, H, Dv]."""

    def step(state, chunk):
        deltas, new = _advance(chunk, state, chunk["u"])
        out = jnp.einsum("...cd,...dx->...cx", chunk["q"], state)
        out = out + jnp.einsum("...ci,...ix->...cx", chunk["p"], deltas)
        return new, jnp.swapaxes(out, -2, -3)  # [B, S, C, H, Dv]

    _, out = jax.lax.scan(step, incoming, chunks)
    return out


def _incoming_states(chunks, zeros):
    """Each shard's true incoming state [B, S, H, Dk, Dv]: shard maps found in parallel, then folded."""
    b, shards, h, dk, dv = zeros.shape
    identity = jnp.broadcast_to(jnp.eye(dk, dtype=zeros.dtype), (b, shards, h, dk, dk))

    def step(state, chunk):
        no_values = jnp.zeros((*chunk["w"].shape[:-1], dk), zeros.dtype)
        values = jnp.concatenate([chunk["u"], no_values], axis=-1)
        return _advance(chunk, state, values)[1], None

    maps, _ = jax.lax.scan(step, jnp.concatenate([zeros, identity], axis=-1), chunks)
    offsets, linear = maps[..., :dv], maps[..., dv:]  # N [.., Dk, Dv], M [.., Dk, Dk]
    states = [zeros[:, 0]]
    for shard in range(shards - 1):
        states.append(linear[:, shard] @ states[-1] + offsets[:, shard])
    return jnp.stack(states, axis=1)
