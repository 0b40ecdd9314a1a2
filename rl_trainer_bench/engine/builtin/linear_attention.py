"""The gated delta rule in chunked (WY / UT-transform) form, over packed rows and context shards.

Per row and head, with the state S [Dv, Dk] reset to zero where a segment starts:
`S_t = a_t S_{t-1} + b_t (v_t - a_t S_{t-1} k_t) k_t^T`, `o_t = S_t q_t`, `a_t = exp(log_decay_t)`.
A per-token loop is sequential in T; the chunked form turns each chunk of C tokens into a few
dense matmuls and keeps only a chunk-to-chunk recurrence (docs/gated-deltanet.md):

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

from rl_trainer_bench.engine.builtin.unit_lower_inverse import unit_lower_inverse


def from_previous_shard(x: jax.Array, axis: str) -> jax.Array:
    """Inside `shard_map`: each device's `x` from the previous device on `axis`; zeros on the
    first device, which has none."""
    shards = jax.lax.axis_size(axis)
    return jax.lax.ppermute(x, axis, [(i, i + 1) for i in range(shards - 1)])


def segment_starts(segment_ids: jax.Array, context_axis: str | None = None) -> jax.Array:
    """[B, T] bool: the token opens a run of equal segment ids (padding runs included).

    Inside `shard_map` with `context_axis`, a span's first token compares with the last token of
    the span before it (on the previous device of the axis); the row's first token always opens.
    """
    before = jnp.full_like(segment_ids[:, :1], -1)
    if context_axis is not None:
        last = from_previous_shard(segment_ids[:, -1:], context_axis)
        before = jnp.where(jax.lax.axis_index(context_axis) == 0, before, last)
    previous = jnp.concatenate([before, segment_ids[:, :-1]], axis=1)
    return segment_ids != previous


def gated_delta_rule(
    q,
    k,
    v,
    log_decay,
    beta,
    segment_ids,
    *,
    chunk_size,
    context_shards=1,
    context_axis=None,
    inverse="xla",
    interpret=False,
):
    """Outputs o [B, T, H, Dv] of the gated delta rule (module docstring) over packed rows.

    q, k: [B, T, H, Dk], already normalised and scaled (nothing is applied to them here);
    v: [B, T, H, Dv]; log_decay, beta: [B, T, H]; segment_ids: [B, T], 0 = padding, whose outputs
    are zero and whose inputs are ignored. T splits into `context_shards` contiguous spans, each
    padded up to whole chunks with tokens that leave the state unchanged. Inside `shard_map`,
    `context_axis` names the mesh axis whose devices hold the spans of the same rows in order: the
    arrays are then this device's span, and the spans before it are folded in from its peers.
    `inverse` says how each chunk's triangular system is inverted (`linear_chunk_inverse`: xla or
    pallas; `interpret`: the kernel in Pallas's interpreter). Computed and returned in float32 (v
    is cast first).
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    if t % context_shards:
        raise ValueError(f"sequence length {t} does not split into {context_shards} shards")
    span = t // context_shards
    chunk = min(chunk_size, span)
    padded = -(-span // chunk) * chunk

    def chunked(x, fill):
        return _in_chunks(x, context_shards, chunk, padded, fill)

    # Padding tokens are made inert (whatever they hold, non-finite values included): a zero query
    # makes their output zero, and a run of them leaves nothing behind, as the next real token
    # opens a segment.
    real = segment_ids != 0
    f32 = jnp.float32
    q, k, v = (jnp.where(real[..., None, None], x, 0).astype(f32) for x in (q, k, v))
    beta = jnp.where(real[..., None], beta, 0).astype(f32)
    log_decay = jnp.where(real[..., None], log_decay, 0).astype(f32)
    starts = chunked(segment_starts(segment_ids, context_axis), False)
    chunks = _chunk_terms(
        *(chunked(x, 0) for x in (q, k, v, log_decay, beta)), starts, inverse, interpret
    )
    incoming = _incoming(chunks, jnp.zeros((b, context_shards, h, dk, dv), f32), context_axis)
    out = _chunk_outputs(chunks, incoming)  # [n, B, S, C, H, Dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, context_shards, padded, h, dv)[:, :, :span]
    return out.reshape(b, t, h, dv).astype(v.dtype)


def _in_chunks(x, shards, chunk, padded, fill):
    """[B, T] -> [n, B, S, C] and [B, T, H, ...] -> [n, B, S, H, C, ...] (heads before the chunk's
    tokens, as `_chunk_terms` takes them), each shard's span padded to `padded` tokens with `fill`."""
    b, t = x.shape[:2]
    x = x.reshape(b, shards, t // shards, *x.shape[2:])
    widths = [(0, 0)] * x.ndim
    widths[2] = (0, padded - t // shards)
    x = jnp.pad(x, widths, constant_values=fill)
    x = x.reshape(b, shards, padded // chunk, chunk, *x.shape[3:])
    x = jnp.moveaxis(x, 2, 0)
    return x if x.ndim == 4 else jnp.moveaxis(x, 4, 3)


def _incoming(chunks, zeros, context_axis):
    """The state each span starts from [B, S, H, Dk, Dv]: from its peers on `context_axis` inside
    `shard_map`, folded over the S shards of this program otherwise, zero for a single span."""
    if context_axis is not None and jax.lax.axis_size(context_axis) > 1:
        return _incoming_from_peers(chunks, zeros, context_axis)
    if zeros.shape[1] > 1:
        return _incoming_states(chunks, zeros)
    return zeros


def _chunk_terms(q, k, v, log_decay, beta, starts, inverse, interpret):
    """Everything of a chunk that does not depend on its incoming state, for all chunks at once.

    Inputs are [n, B, S, H, C, ...] (starts: bool [n, B, S, C]); `inverse` and `interpret` as in
    `unit_lower_solve`. Returns a dict of per-chunk terms.
    Heads come before the chunk's tokens, the layout the solve and the chunk scan take, so no term
    is moved between layouts and each [C, C] term is the minor pair of its array (on the chip the
    step's `_chunk_terms` row did not move with this:
    benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md).
    """
    run = jnp.cumsum(starts, axis=-1)[..., None, :]  # [n, B, S, 1, C]: segment starts so far
    same = run[..., :, None] == run[..., None, :]  # [.., 1, t, i]
    causal = jnp.tril(jnp.ones(same.shape[-2:], bool))
    strictly = causal & ~jnp.eye(same.shape[-1], dtype=bool)
    cum = jnp.cumsum(log_decay, axis=-1)  # [n, B, S, H, C]: log of a_1 ... a_t
    gap = cum[..., :, None] - cum[..., None, :]  # [.., H, t, i]: log of a_{i+1} ... a_t

    def decay(mask):
        return jnp.exp(jnp.where(mask & same, gap, -jnp.inf))

    carried = run == 0  # the incoming state still reaches token t
    from_start = jnp.where(carried, jnp.exp(cum), 0.0)  # G [.., H, C]
    last = run[..., -1:]
    to_end = jnp.where(run == last, jnp.exp(cum[..., -1:] - cum), 0.0)  # e
    across = jnp.where(carried[..., -1], jnp.exp(cum[..., -1]), 0.0)  # g [.., H]

    kk = jnp.einsum("...td,...id->...ti", k, k)
    system = decay(strictly) * kk * beta[..., :, None]  # A [.., H, t, i]
    rhs = jnp.concatenate([v * beta[..., None], k * (beta * from_start)[..., None]], axis=-1)
    # (I + A) [U | W] = rhs: [.., H, C, Dv + Dk]
    solved = unit_lower_solve(system, rhs, inverse, interpret)
    dv = v.shape[-1]
    return {
        "u": solved[..., :dv],
        "w": solved[..., dv:],
        "q": q * from_start[..., None],  # G q [.., H, C, Dk]
        "p": decay(causal) * jnp.einsum("...td,...id->...ti", q, k),
        "k": k * to_end[..., None],  # e k [.., H, C, Dk]
        "g": across,  # [.., H]
    }


def unit_lower_solve(strict, rhs, inverse="xla", interpret=False):
    """x with (I + strict) x = rhs: strict [..., C, C] strictly lower triangular, rhs [..., C, X].

    By the inverse (`unit_lower_inverse.py`, by `inverse`: XLA's matmuls or the Pallas kernel) and
    one matmul, so the whole solve is batched matmuls on every platform. JAX's triangular solve is
    not used: on the CPU it is a LAPACK call that splits its batch over the host's thread pool and
    waits for the parts, and with several host devices running it at once every thread can end up
    waiting for parts no thread is left to run (seen on 8 host devices on 2 cores: the step never
    finishes).
    """
    return jnp.einsum("...ij,...jx->...ix", unit_lower_inverse(strict, inverse, interpret), rhs)


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


def _shard_maps(chunks, zeros):
    """Each span's affine map of its incoming state, H_out = M H_in + N: (N, M) per shard.

    M follows the state's recurrence with zero values, so both come from one pass from [0 | I].
    """
    b, shards, h, dk, dv = zeros.shape
    identity = jnp.broadcast_to(jnp.eye(dk, dtype=zeros.dtype), (b, shards, h, dk, dk))

    def step(state, chunk):
        no_values = jnp.zeros((*chunk["w"].shape[:-1], dk), zeros.dtype)
        values = jnp.concatenate([chunk["u"], no_values], axis=-1)
        return _advance(chunk, state, values)[1], None

    maps, _ = jax.lax.scan(step, jnp.concatenate([zeros, identity], axis=-1), chunks)
    return maps[..., :dv], maps[..., dv:]  # N [B, S, H, Dk, Dv], M [B, S, H, Dk, Dk]


def _fold(offsets, linear, first):
    """The incoming state of every span [B, S, H, Dk, Dv], folding the maps in sequence order."""
    states = [first]
    for shard in range(offsets.shape[1] - 1):
        states.append(linear[:, shard] @ states[-1] + offsets[:, shard])
    return jnp.stack(states, axis=1)


def _incoming_states(chunks, zeros):
    """Each shard's true incoming state [B, S, H, Dk, Dv]: shard maps found in parallel, then folded."""
    offsets, linear = _shard_maps(chunks, zeros)
    return _fold(offsets, linear, zeros[:, 0])


def _incoming_from_peers(chunks, zeros, axis):
    """This device's incoming state [B, 1, H, Dk, Dv] when its peers on `axis` hold the other spans.

    Every device finds its span's map in parallel, the maps (a few MiB) are gathered over the axis
    and folded in order, and each device takes the state that reaches its own span.
    """
    offsets, linear = (
        jax.lax.all_gather(m[:, 0], axis, axis=1, tiled=False) for m in _shard_maps(chunks, zeros)
    )
    states = _fold(offsets, linear, zeros[:, 0])
    return jax.lax.dynamic_slice_in_dim(states, jax.lax.axis_index(axis), 1, axis=1)
