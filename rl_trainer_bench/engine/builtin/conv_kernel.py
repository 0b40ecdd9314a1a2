"""The Gated DeltaNet's short causal convolution and its SiLU in Pallas TPU kernels, forward and
backward (`linear_conv_kernel`).

The XLA path (`gated_deltanet.local_conv`) builds a shifted, masked copy of the q, k, v projection
`[B, T, W]` for each tap, and its gradient shifts back and sums each tap's weight gradient over
every token: aot's table charges it about 17 passes over its input a micro-batch on tpu-v5e-1
(BENCHMARKS.md). Here one kernel program takes a block of a row's tokens and channels, reads it
once and writes its output once. The forward runs a row's blocks in order and keeps each block's
last rows in VMEM for the next one's first taps; the backward runs them last first, recomputes
the block's pre-activation from its input and the rows before it, keeps the first rows of its
gradient for the block before, and sums each tap's weight gradient over the row in VMEM. Whole
rows only: a configuration with context shards is refused before anything compiles.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Rows kept between blocks, and the weights' and masks' rows: a float32 tile's 8. Taps - 1 <= 7.
HALO = 8
# A block's tokens and channels: a [512, 512] float32 term is 1 MiB of VMEM
TOKENS_A_BLOCK = 512
CHANNELS_A_BLOCK = 512


class Static(NamedTuple):
    """What the kernels are built for, besides the arrays' shapes."""

    tokens: int  # a block's tokens, a multiple of HALO
    channels: int  # a block's channels, a multiple of 128
    taps: int
    interpret: bool


def causal_conv(x, kernel, segments, *, tokens_per_block=TOKENS_A_BLOCK, interpret=False):
    """SiLU of the depthwise causal convolution of x [B, T, W] (W a multiple of 128) by kernel
    [taps, W] (tap j weighs the token j steps back), never across a segment start of segments
    [B, T] (before a row's first token it reaches zeros), in x's dtype, computed in float32.
    `interpret` runs the kernels in Pallas's interpreter, to check them off a TPU."""
    _, tokens, width = x.shape
    taps = kernel.shape[0]
    if taps > HALO or width % 128:
        raise ValueError(f"taps {taps} > {HALO} or width {width} not a multiple of 128")
    block = min(tokens_per_block, -(-tokens // HALO) * HALO)
    padded = -(-tokens // block) * block
    channels = next(c for c in (CHANNELS_A_BLOCK, 256, 128) if width % c == 0)
    static = Static(block, channels, taps, interpret)
    weights = jnp.pad(kernel.astype(jnp.float32), ((0, HALO - taps), (0, 0)))
    masks = jnp.pad(reach_masks(segments, taps), ((0, 0), (0, 0), (0, padded - tokens)))
    x = jnp.pad(x, ((0, 0), (0, padded - tokens), (0, 0)))
    return _conv(x, weights, masks, static)[:, :tokens]


def reach_masks(segments, taps):
    """[B, HALO, T] float32: row j is 1 where tokens t - j .. t share a segment (j < taps; row 0
    all 1), the rows from `taps` on 0. Tokens before the row have segment id 0, as padding."""
    rows, tokens = segments.shape
    ids = jnp.pad(segments, ((0, 0), (taps - 1, 0)))
    reaches = [jnp.ones((rows, tokens), bool)]
    for back in range(1, taps):
        first = taps - 1 - back  # token t - back sits at first + t of the extended ids
        same = ids[:, first : first + tokens] == ids[:, first + 1 : first + 1 + tokens]
        reaches.append(reaches[-1] & same)
    reaches += [jnp.zeros((rows, tokens), bool)] * (HALO - taps)
    return jnp.stack(reaches, axis=1).astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _conv(x, weights, masks, static):
    """x [B, T, W] with T whole blocks, weights [HALO, W] float32, masks [B, HALO, T]."""
    return _call(_forward_kernel, static, x, weights, masks)


def _conv_forward(x, weights, masks, static):
    return _conv(x, weights, masks, static), (x, weights, masks)


def _conv_backward(static, residuals, d_out):
    x, weights, masks = residuals
    d_x, d_weights = _call(_backward_kernel, static, x, weights, masks, d_out)
    return d_x, jnp.sum(d_weights, axis=0), jnp.zeros_like(masks)


_conv.defvjp(_conv_forward, _conv_backward)


def _call(kernel, static, x, weights, masks, *d_out):
    """`kernel` over a grid of (row, channel block, token block), the token blocks of a row in
    order (the backward: last first)."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows, tokens, width = x.shape
    backward = kernel is _backward_kernel
    blocks = tokens // static.tokens

    def block(s):
        return blocks - 1 - s if backward else s

    by_token = pl.BlockSpec(
        (None, static.tokens, static.channels), lambda b, c, s: (b, block(s), c)
    )
    per_token = pl.BlockSpec((None, HALO, static.tokens), lambda b, c, s: (b, 0, block(s)))
    taps = pl.BlockSpec((HALO, static.channels), lambda b, c, s: (0, c))
    in_specs = [by_token, taps, per_token]
    out_specs = [by_token]
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
    scratch = [pltpu.VMEM((HALO, static.channels), jnp.float32)]
    inputs = [x, weights, masks]
    if backward:
        # the HALO rows before a block: its input's, read again (the block before runs after it)
        halos = static.tokens // HALO

        def before(b, c, s):
            return (b, jnp.maximum(block(s) * halos - 1, 0), c)

        in_specs += [pl.BlockSpec((None, HALO, static.channels), before), by_token]
        inputs += [x, *d_out]
        out_specs.append(pl.BlockSpec((None, HALO, static.channels), lambda b, c, s: (b, 0, c)))
        out_shape.append(jax.ShapeDtypeStruct((rows, HALO, width), jnp.float32))
        scratch.append(pltpu.VMEM((HALO, HALO), jnp.float32))
    flops = 2 * static.taps * x.size * (3 if backward else 1)
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        name="short_conv_backward" if backward else "short_conv_forward",
        cost_estimate=pl.CostEstimate(
            flops=flops,
            transcendentals=x.size,
            bytes_accessed=sum(a.size * a.dtype.itemsize for a in (*inputs, *out_shape)),
        ),
        out_shape=out_shape if backward else out_shape[0],
        grid=(rows, width // static.channels, blocks),
        in_specs=in_specs,
        out_specs=out_specs if backward else out_specs[0],
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=static.interpret,
    )(*inputs)


def _where(masks, back, x):
    """x where tap `back` counts (masks [tokens, HALO]), else 0 (a select: what it drops never
    reaches the sum, even where not finite)."""
    return jnp.where(masks[:, back : back + 1] > 0, x, 0.0)


def _pre_activation(x, before, weights, masks, taps):
    """The convolution [tokens, channels] of a block x from the HALO rows `before` it, float32;
    masks [tokens, HALO]: column j where token t - j counts for token t."""
    extended = jnp.concatenate([before, x], axis=0)
    out = x * weights[0:1]
    for back in range(1, taps):
        shifted = extended[HALO - back : HALO - back + x.shape[0]]
        out = out + _where(masks, back, shifted) * weights[back : back + 1]
    return out


def _forward_kernel(x_ref, weights_ref, masks_ref, out_ref, before_ref, *, static):
    """One block: SiLU of its convolution; its last rows kept for the row's next block."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    x = x_ref[...].astype(jnp.float32)
    before = jnp.where(pl.program_id(2) == 0, 0.0, before_ref[...])  # a row starts from zeros
    pre = _pre_activation(x, before, weights_ref[...], masks_ref[...].T, static.taps)
    out_ref[...] = (pre * jax.nn.sigmoid(pre)).astype(out_ref.dtype)
    before_ref[...] = x[x.shape[0] - HALO :]


def _backward_kernel(
    x_ref, weights_ref, masks_ref, before_ref, d_out_ref, d_x_ref, d_weights_ref, d_after_ref,
    masks_after_ref, *, static,
):  # fmt: skip
    """One block, a row's last first: the gradient of its input, which takes each tap's share
    of the outputs up to taps - 1 tokens after it (from the block after, kept in scratch), and
    its share of each tap's weight gradient, summed over the row in the output block."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    step = pl.program_id(2)
    last, first = step == 0, step == pl.num_programs(2) - 1  # of the row's blocks
    x = x_ref[...].astype(jnp.float32)
    rows = x.shape[0]
    before = jnp.where(first, 0.0, before_ref[...].astype(jnp.float32))
    weights, masks = weights_ref[...], masks_ref[...].T
    pre = _pre_activation(x, before, weights, masks, static.taps)
    gate = jax.nn.sigmoid(pre)
    d_pre = d_out_ref[...].astype(jnp.float32) * gate * (1.0 + pre * (1.0 - gate))
    d_ahead = jnp.concatenate([d_pre, jnp.where(last, 0.0, d_after_ref[...])], axis=0)
    masks_ahead = jnp.concatenate([masks, jnp.where(last, 0.0, masks_after_ref[...])], axis=0)
    extended = jnp.concatenate([before, x], axis=0)
    d_x = d_pre * weights[0:1]
    sums = [jnp.sum(d_pre * x, axis=0, keepdims=True)]
    for back in range(1, static.taps):
        # token t feeds output t + back, where t + back reaches back to t
        ahead = _where(masks_ahead[back : back + rows], back, d_ahead[back : back + rows])
        d_x = d_x + ahead * weights[back : back + 1]
        shifted = _where(masks, back, extended[HALO - back : HALO - back + rows])
        sums.append(jnp.sum(d_pre * shifted, axis=0, keepdims=True))
    d_x_ref[...] = d_x.astype(d_x_ref.dtype)
    sums += [jnp.zeros_like(sums[0])] * (HALO - static.taps)
    d_weights = jnp.concatenate(sums, axis=0)
    d_weights_ref[...] = jnp.where(last, 0.0, d_weights_ref[...]) + d_weights
    d_after_ref[...] = d_pre[:HALO]
    masks_after_ref[...] = masks[:HALO]
