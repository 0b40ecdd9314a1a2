"""One Gated DeltaNet layer (linear attention): projections, short convolutions, gates, output norm.

x [B, T, D] -> [B, T, D], as in Qwen3-Next / Qwen3.5's linear-attention layers (docs/engine.md,
"Gated DeltaNet"): q, k and v are projected and passed through causal depthwise convolutions of
`linear_conv_kernel_dim` taps and SiLU; q and k are L2-normalised (q also scaled by 1/sqrt(Dk)) and
shared by `linear_num_value_heads / linear_num_key_heads` value heads each; beta = sigmoid(x W_b)
and the log decay -exp(A_log) softplus(x W_a + dt_bias) feed the gated delta rule
(`linear_attention.py`); its output is RMS-normalised per head, gated by SiLU(x W_z) and projected
back. Packed rows: the convolutions, like the rule, never reach across a segment start.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine.config import ModelConfig
from rl_trainer_bench.engine.linear_attention import gated_delta_rule, segment_starts


def causal_conv(x, kernel, starts):
    """Depthwise causal convolution over T that stops at segment starts, then SiLU.

    x: [B, T, H, hd]; kernel: [K, H, hd], tap j weighs the token j steps back; starts: [B, T].
    """
    out = x * kernel[0]
    reaches = jnp.ones(starts.shape, bool)  # token t - j is in t's segment
    for back in range(1, kernel.shape[0]):
        reaches = reaches & ~_shift(starts, back - 1)
        out = out + jnp.where(reaches[..., None, None], _shift(x, back), 0) * kernel[back]
    return jax.nn.silu(out)


def _shift(x, steps):
    """x delayed by `steps` tokens along T (axis 1), zeros (False) shifted in."""
    if steps == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (steps, 0)
    return jnp.pad(x[:, :-steps], widths)


def l2_normalize(x, eps=1e-6):
    """x / |x| over the head dim, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


def gated_rms_norm(x, gate, scale, eps):
    """RMSNorm of each head's output times SiLU(gate), in float32, returned in gate's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * scale
    return (normed * jax.nn.silu(gate.astype(jnp.float32))).astype(gate.dtype)


def gated_deltanet(x, layer, segments, config: ModelConfig, context_shards: int):
    """One linear-attention layer over packed segments: x [B, T, D] -> [B, T, D]."""
    dtype = x.dtype
    c = config

    def project(name, spec="btd,dhk->bthk"):
        return jnp.einsum(spec, x, layer[name].astype(dtype))

    starts = segment_starts(segments)
    q = causal_conv(project("gdn_wq"), layer["gdn_conv_q"].astype(dtype), starts)
    k = causal_conv(project("gdn_wk"), layer["gdn_conv_k"].astype(dtype), starts)
    v = causal_conv(project("gdn_wv"), layer["gdn_conv_v"].astype(dtype), starts)
    share = c.linear_num_value_heads // c.linear_num_key_heads
    q = jnp.repeat(l2_normalize(q) * c.linear_key_head_dim**-0.5, share, axis=2)
    k = jnp.repeat(l2_normalize(k), share, axis=2)
    beta = jax.nn.sigmoid(project("gdn_wb", "btd,dh->bth").astype(jnp.float32))
    rate = project("gdn_wa", "btd,dh->bth").astype(jnp.float32) + layer["gdn_dt_bias"]
    log_decay = -jnp.exp(layer["gdn_a_log"]) * jax.nn.softplus(rate)
    out = gated_delta_rule(
        q,
        k,
        v,
        log_decay,
        beta,
        segments,
        chunk_size=c.linear_chunk_size,
        context_shards=context_shards,
    )
    out = gated_rms_norm(out, project("gdn_wz"), layer["gdn_norm"], c.rms_norm_eps)
    return jnp.einsum("bthk,hkd->btd", out, layer["gdn_wo"].astype(dtype))
