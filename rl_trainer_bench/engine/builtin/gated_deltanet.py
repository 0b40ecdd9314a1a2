"""One Gated DeltaNet layer (linear attention): projections, short convolutions, gates, output norm.

x [B, T, D] -> [B, T, D], as in Qwen3-Next / Qwen3.5's linear-attention layers
(docs/gated-deltanet.md): q, k and v are projected and passed through causal depthwise convolutions of
`linear_conv_kernel_dim` taps and SiLU; q and k are L2-normalised (q also scaled by 1/sqrt(Dk)) and
shared by `linear_num_value_heads / linear_num_key_heads` value heads each; beta = sigmoid(x W_b)
and the log decay -exp(A_log) softplus(x W_a + dt_bias) feed the gated delta rule
(`linear_attention.py` in XLA, or `delta_rule_kernel.py` in Pallas kernels that also normalise q
and k: `linear_chunk_kernel`); its output is RMS-normalised per head, gated by SiLU(x W_z) and
projected back. Packed rows: the convolutions (in XLA, or Pallas kernels: `linear_conv_kernel`),
like the rule, never reach across a segment start.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.conv_kernel import causal_conv
from rl_trainer_bench.engine.builtin.delta_rule_kernel import chunked_delta_rule
from rl_trainer_bench.engine.builtin.linear_attention import from_previous_shard, gated_delta_rule
from rl_trainer_bench.engine.builtin.norms import rms_normalized
from rl_trainer_bench.engine.config import ModelConfig

# q, k and v share one projection matmul and one convolution: their weights side by side.
QKV = (("gdn_wq", "gdn_conv_q"), ("gdn_wk", "gdn_conv_k"), ("gdn_wv", "gdn_conv_v"))


def context_conv(x, kernel, segments, method="xla", interpret=False):
    """Depthwise causal convolution over T that never reaches across a segment start, then SiLU.

    x: [B, T, W] split like the tokens (T over `context`); kernel: [taps, W], tap j weighs the token
    j steps back; segments: [B, T]. `method` (`linear_conv_kernel`): xla, each device taking the
    last taps - 1 tokens of the span before it from its context peer (one collective permute) and
    convolving its own span; or the pallas kernels (`conv_kernel.py`, whole rows a device;
    `interpret`: in Pallas's interpreter).
    """
    local = local_conv if method == "xla" else functools.partial(causal_conv, interpret=interpret)
    return jax.shard_map(
        local,
        in_specs=(sharding.ACTIVATIONS, sharding.REPLICATED, sharding.TOKENS),
        out_specs=sharding.ACTIVATIONS,
        check_vma=False,
    )(x, kernel, segments)


def local_conv(x, kernel, segments):
    """One device's span of `context_conv`; token t - j counts while t - j .. t share a segment."""
    t, halo = x.shape[1], kernel.shape[0] - 1
    x_ext = jnp.concatenate([_previous_tail(x, halo), x], axis=1)
    ids = jnp.concatenate([_previous_tail(segments, halo), segments], axis=1)
    out = x * kernel[0]
    reaches = jnp.ones(segments.shape, bool)
    for back in range(1, halo + 1):
        first = halo - back  # token t - back sits at first + t of the extended span
        reaches = reaches & (ids[:, first : first + t] == ids[:, first + 1 : first + 1 + t])
        out = out + jnp.where(reaches[..., None], x_ext[:, first : first + t], 0) * kernel[back]
    return jax.nn.silu(out)


def _previous_tail(a, n):
    """The last `n` tokens of the previous device's span on `context`; zeros on the first device
    (a zero segment id is padding, which no real token's segment equals)."""
    tail = a[:, a.shape[1] - n :]
    if jax.lax.axis_size("context") == 1:
        return jnp.zeros_like(tail)
    return from_previous_shard(tail, "context")


def l2_normalize(x, eps=1e-6):
    """x / |x| over the head dim, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


def context_delta_rule(q, k, v, log_decay, beta, segments, *, chunk_size, inverse="xla"):
    """`gated_delta_rule` with the sequence split over `context`: each device runs its own span
    and takes its incoming state from the spans before it (`linear_attention.py`)."""
    rule = functools.partial(
        gated_delta_rule, chunk_size=chunk_size, context_axis="context", inverse=inverse
    )
    return _per_device(rule)(q, k, v, log_decay, beta, segments)


def kernel_delta_rule(
    q, k, v, log_decay, beta, segments, *, chunk_size, heads_per_program, query_scale,
    interpret=False, keep=False,
):  # fmt: skip
    """The rule by the Pallas kernels (`delta_rule_kernel.py`), each device on its own whole rows
    (`linear_chunk_kernel=pallas` is refused with context shards): q and k [B, T, Hk, Dk] as the
    convolution gives them, normalised (q also scaled by `query_scale`) and shared by their value
    heads inside the kernel, up to `heads_per_program` value heads a kernel program; `interpret`:
    Pallas's interpreter, to check the kernels off a TPU; `keep`: the forward's results named for
    the remat policy (`keep_delta_rule_outputs`)."""
    rule = functools.partial(
        chunked_delta_rule, chunk_size=chunk_size, heads_per_program=heads_per_program,
        query_scale=query_scale, interpret=interpret, keep=keep,
    )  # fmt: skip
    return _per_device(rule)(q, k, v, log_decay, beta, segments)


def _per_device(rule):
    """`rule`(q, k, v, log_decay, beta, segments) under `shard_map`, each device on its rows and
    span of the tokens."""
    heads, per_head = sharding.HEADS, P(sharding.ROWS, "context", None)
    return jax.shard_map(
        rule,
        in_specs=(heads, heads, heads, per_head, per_head, sharding.TOKENS),
        out_specs=heads,
        check_vma=False,
    )


def gated_rms_norm(x, gate, scale, eps):
    """RMSNorm of each head's output times SiLU(gate), in float32, returned in gate's dtype."""
    normed = rms_normalized(x, eps) * scale
    return (normed * jax.nn.silu(gate.astype(jnp.float32))).astype(gate.dtype)


def layer_delta_rule(
    q, k, v, log_decay, beta, segments, config: ModelConfig, inverse="xla", kernel="xla",
    interpret=False,
):  # fmt: skip
    """The gated delta rule on q and k [B, T, Hk, Dk] as the layer's convolution gives them:
    L2-normalised (q also scaled by 1/sqrt(Dk)) and shared by their value heads, then the rule
    over each device's rows and span -> [B, T, Hv, Dv]. `kernel` says who runs it
    (`linear_chunk_kernel`): xla, where `inverse` says how each chunk's triangular system is
    inverted (`linear_chunk_inverse`: xla or pallas), or the pallas kernels, which also normalise q
    and k, up to `linear_chunk_kernel_heads` value heads a program, their forward's results kept
    for the backward pass with `keep_delta_rule_outputs` (`interpret`: those kernels in Pallas's
    interpreter)."""
    c = config
    scale, chunk = c.linear_key_head_dim**-0.5, c.linear_chunk_size
    if kernel == "pallas":
        return kernel_delta_rule(
            q, k, v, log_decay, beta, segments, chunk_size=chunk,
            heads_per_program=c.linear_chunk_kernel_heads, query_scale=scale, interpret=interpret,
            keep=c.keep_delta_rule_outputs,
        )  # fmt: skip
    share = c.linear_num_value_heads // c.linear_num_key_heads
    q = jnp.repeat(l2_normalize(q) * scale, share, axis=2)
    k = jnp.repeat(l2_normalize(k), share, axis=2)
    return context_delta_rule(q, k, v, log_decay, beta, segments, chunk_size=chunk, inverse=inverse)


def gated_deltanet(
    x, layer, segments, config: ModelConfig, inverse="xla", kernel="xla", conv="xla",
    interpret=False,
):  # fmt: skip
    """One linear-attention layer over packed segments: x [B, T, D] -> [B, T, D]; `inverse`,
    `kernel` and `interpret` as `layer_delta_rule` takes them, `conv` as `context_conv`'s
    `method`."""
    dtype = x.dtype
    c = config

    def project(name, spec="btd,dhk->bthk"):
        return jnp.einsum(spec, x, layer[name].astype(dtype))

    widths = [layer[w].shape[1] * layer[w].shape[2] for w, _ in QKV]
    weights = jnp.concatenate([layer[w].reshape(c.d_model, -1) for w, _ in QKV], axis=-1)
    kernels = [layer[k].reshape(c.linear_conv_kernel_dim, -1) for _, k in QKV]
    qkv = context_conv(
        x @ weights.astype(dtype), jnp.concatenate(kernels, -1).astype(dtype), segments, conv,
        interpret,
    )  # fmt: skip
    q, k, v = jnp.split(qkv, np.cumsum(widths)[:-1], axis=-1)
    heads = (c.linear_num_key_heads, c.linear_num_key_heads, c.linear_num_value_heads)
    q, k, v = (a.reshape(*a.shape[:2], h, -1) for a, h in zip((q, k, v), heads, strict=True))
    beta = jax.nn.sigmoid(project("gdn_wb", "btd,dh->bth").astype(jnp.float32))
    rate = project("gdn_wa", "btd,dh->bth").astype(jnp.float32) + layer["gdn_dt_bias"]
    log_decay = -jnp.exp(layer["gdn_a_log"]) * jax.nn.softplus(rate)
    out = layer_delta_rule(q, k, v, log_decay, beta, segments, c, inverse, kernel, interpret)
    out = gated_rms_norm(out, project("gdn_wz"), layer["gdn_norm"], c.rms_norm_eps)
    return jnp.einsum("bthk,hkd->btd", out, layer["gdn_wo"].astype(dtype))
