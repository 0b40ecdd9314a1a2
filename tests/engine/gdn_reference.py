"""Plain references for Gated DeltaNet, written for clarity: a per-token recurrence and one layer;
and the rule's inputs over packed rows at a cell's shapes, for the tests and the chip's scripts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def packed_segments(rng, rows, length):
    """Rows of several segments of random lengths, each row ending in some padding."""
    ids = np.zeros((rows, length), np.int32)
    for row in range(rows):
        position, segment = 0, 1
        end = length - rng.integers(0, 4)
        while position < end:
            size = int(rng.integers(1, max(2, length // 3)))
            ids[row, position : min(end, position + size)] = segment
            position, segment = position + size, segment + 1
    return ids


def rule_arrays(rng, shape, heads, widths, fastest_decay):
    """q and k per key head as a layer's convolution gives them (not normalised), v, log decays in
    (-fastest_decay, 0] and beta in [0, 1), float64 [*shape, ...]; heads and widths: (key, value)."""
    return (
        rng.normal(size=(*shape, heads[0], widths[0])),
        rng.normal(size=(*shape, heads[0], widths[0])),
        rng.normal(size=(*shape, heads[1], widths[1])),
        -rng.uniform(0.0, fastest_decay, size=(*shape, heads[1])),
        rng.uniform(0.0, 1.0, size=(*shape, heads[1])),
    )


def cell_inputs(model, rows, tokens, seed=0):
    """The rule's inputs as a layer of `model` (a ModelConfig) hands them on, float32 NumPy:
    `rule_arrays` at its shapes over packed rows, then the segment ids and weights for a loss
    `sum(out * weights)`."""
    rng = np.random.default_rng(seed)
    heads = (model.linear_num_key_heads, model.linear_num_value_heads)
    widths = (model.linear_key_head_dim, model.linear_value_head_dim)
    arrays = rule_arrays(rng, (rows, tokens), heads, widths, fastest_decay=0.5)
    weights = rng.normal(size=(rows, tokens, heads[1], widths[1]))
    as32 = tuple(x.astype(np.float32) for x in (*arrays, weights))
    return (*as32[:5], packed_segments(rng, rows, tokens), as32[5])


def conv_inputs(model, rows, tokens, seed=0):
    """The short convolution's inputs as a layer of `model` hands them on, float32 NumPy: segment
    ids of packed rows, the q, k and v projection [rows, tokens, q k v width], the taps [K, width]
    and the weights of a loss `sum(out * weights)`."""
    rng = np.random.default_rng(seed)
    segments = packed_segments(rng, rows, tokens)
    width = model.linear_qkv_width
    x = rng.normal(size=(rows, tokens, width)).astype(np.float32)
    taps = (rng.normal(size=(model.linear_conv_kernel_dim, width)) * 0.5).astype(np.float32)
    weights = rng.normal(size=x.shape).astype(np.float32)
    return segments, x, taps, weights


def recurrence(q, k, v, log_decay, beta, segment_ids):
    """S_t = a_t S + b_t (v_t - a_t S k_t) k_t^T, o_t = S_t q_t, token by token (zero on padding)."""
    starts = segment_ids != jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)

    def step(state, inputs):
        q_t, k_t, v_t, g_t, b_t, start_t, real_t = inputs
        state = jnp.where(start_t[:, None, None, None], 0.0, state)
        a = jnp.exp(g_t)[..., None]
        predicted = jnp.einsum("bhvk,bhk->bhv", state, k_t) * a
        update = (b_t[..., None] * (v_t - predicted))[..., None] * k_t[..., None, :]
        state = a[..., None] * state + update
        out = jnp.einsum("bhvk,bhk->bhv", state, q_t) * real_t[:, None, None]
        return state, out

    rows, _, heads, key_dim = q.shape
    state = jnp.zeros((rows, heads, v.shape[-1], key_dim))
    inputs = (q, k, v, log_decay, beta, starts, segment_ids != 0)
    _, out = jax.lax.scan(step, state, jax.tree.map(lambda x: jnp.moveaxis(x, 1, 0), inputs))
    return jnp.moveaxis(out, 0, 1)


def _rms(x, scale, eps):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def conv(x, kernel, segment_ids):
    """SiLU of the causal depthwise convolution of x [B, T, ...] by kernel [taps, ...] (tap j
    weighs the token j steps back), each token reaching only tokens of its own run of one segment
    id; tokens before the row reach nothing."""
    starts = segment_ids != jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    run = jnp.cumsum(starts, axis=1)  # tokens of one segment share a run number
    tokens, inner = x.shape[1], (1,) * (x.ndim - 2)
    out = jnp.zeros_like(x)
    for back in range(kernel.shape[0]):
        earlier = jnp.pad(x, ((0, 0), (back, 0), *[(0, 0)] * len(inner)))[:, :tokens]
        earlier_run = jnp.pad(run, ((0, 0), (back, 0)), constant_values=-1)[:, :tokens]
        same = (earlier_run == run).reshape(*run.shape, *inner)
        out = out + jnp.where(same, earlier, 0) * kernel[back]
    return jax.nn.silu(out)


def layer(h, w, segment_ids, model):
    """One Gated DeltaNet layer of `model` (a ModelConfig) on h [B, T, D]; w: that layer's gdn_*."""

    def unit(x):
        return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    share = model.linear_num_value_heads // model.linear_num_key_heads
    q = conv(jnp.einsum("btd,dhk->bthk", h, w["gdn_wq"]), w["gdn_conv_q"], segment_ids)
    k = conv(jnp.einsum("btd,dhk->bthk", h, w["gdn_wk"]), w["gdn_conv_k"], segment_ids)
    v = conv(jnp.einsum("btd,dhk->bthk", h, w["gdn_wv"]), w["gdn_conv_v"], segment_ids)
    q = jnp.repeat(unit(q) / jnp.sqrt(model.linear_key_head_dim), share, axis=2)
    k = jnp.repeat(unit(k), share, axis=2)
    beta = jax.nn.sigmoid(h @ w["gdn_wb"])
    log_decay = -jnp.exp(w["gdn_a_log"]) * jax.nn.softplus(h @ w["gdn_wa"] + w["gdn_dt_bias"])
    out = recurrence(q, k, v, log_decay, beta, segment_ids)
    gate = jax.nn.silu(jnp.einsum("btd,dhk->bthk", h, w["gdn_wz"]))
    out = _rms(out, w["gdn_norm"], model.rms_norm_eps) * gate
    return jnp.einsum("bthk,hkd->btd", out, w["gdn_wo"])
