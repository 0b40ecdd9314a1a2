"""The chunked gated delta rule in Pallas TPU kernels, forward and backward (`linear_chunk_kernel`).

The XLA path (`linear_attention.py`) builds every chunk's terms for all chunks at once, then scans
the chunks: each `[C, C]` and `[C, D]` term of every chunk passes through HBM in float32, most of
them several times, for little matmul work (BENCHMARKS.md: the Gated DeltaNet's rows are mostly
element-wise passes). Here one kernel program takes one chunk of a few heads
(`linear_chunk_kernel_heads`): one head's chain of small dependent matmuls leaves the matrix
units waiting on each result, and the compiler overlaps the heads' chains only where each step
takes every head at once (the per-head math is `jax.vmap`ped over the program's heads; written one
head after another, the heads run one after another: BENCHMARKS.md's chip suite, the matmul chain).
It reads the chunk's q, k, v and per-token scalars once, builds each head's decays, A, P, the
inverse of I + A (the doubling of `unit_lower_inverse.py`), U and W in VMEM, writes the chunk's
outputs and advances the states, which stay in VMEM from chunk to chunk (the grid's chunk axis runs
in order). The backward pass is a
second kernel that runs the chunks in reverse, carrying the state's gradient in VMEM; it rebuilds
each chunk's terms from its inputs (a few C x C matmuls, each off the others' path) but the
inverse, and reads the state each chunk started from and its inverse, the two things the forward
kernel writes beside the outputs: the inverse's doubling is the longest chain of dependent
matmuls in a chunk, run once rather than twice. The math is docs/gated-deltanet.md's, "The gated
delta rule in one kernel".

q and k are read per key head (value head h reads key head h // (H / Hk)), so the grouped heads are
never repeated in memory; with `query_scale` the kernel also L2-normalises them (and scales q) in
VMEM, so the layer's normalised copies never reach HBM. Context shards are not supported: a
configuration with them is refused before anything compiles (`engine/config.py`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rl_trainer_bench.engine.builtin.linear_attention import segment_starts
from rl_trainer_bench.engine.builtin.unit_lower_inverse import doubled, kernel_precision
from rl_trainer_bench.engine.kernel_vmem import GATED_DELTA_RULE_BACKWARD, GATED_DELTA_RULE_FORWARD

# Rows of the per-token block each program reads, [ROWS, C] a chunk and head: the log decay summed
# from the chunk start, beta, the segment starts seen so far in the chunk, and 1 on real tokens.
CUM, BETA, RUN, REAL = range(4)
ROWS = 8  # a float32 tile's rows; the rows past REAL are zero
# L2 normalisation's epsilon, as the layer's `l2_normalize`
NORM_EPS = 1e-6
# The name the forward kernel's results (the outputs, and each chunk's incoming state and inverse)
# carry for the layer's remat policy with `keep_delta_rule_outputs`: kept for the backward pass,
# which then never runs the forward kernel again (nothing carries the name without the key).
KEPT = "delta_rule_outputs"


class Static(NamedTuple):
    """What the kernels are built for, besides the arrays' shapes."""

    chunk: int
    heads: int  # value heads a program takes, one after another in its code
    share: int  # value heads per key head
    query_scale: float | None  # None: q and k arrive normalised; else normalised here, q scaled
    precision: jax.lax.Precision
    interpret: bool
    kept_dtype: jnp.dtype  # of the states and inverses the forward kernel writes for the backward
    keep: bool  # the forward's results named `KEPT`, for the remat policy to keep


def chunked_delta_rule(
    q, k, v, log_decay, beta, segment_ids, *, chunk_size, heads_per_program, query_scale=None,
    interpret=False, keep=False, kept_dtype=None,
):  # fmt: skip
    """Outputs o [B, T, H, Dv] of the gated delta rule over packed rows, in v's dtype.

    q, k: [B, T, Hk, Dk], H a multiple of Hk; normalised and scaled already when `query_scale` is
    None, else L2-normalised here (q then times `query_scale`); v: [B, T, H, Dv]; log_decay, beta:
    [B, T, H]; segment_ids: [B, T], 0 = padding, whose outputs are zero and whose inputs are ignored
    (non-finite values included). T is padded up to whole chunks of `chunk_size` with such tokens.
    A kernel program takes `heads_per_program` heads of a chunk (cut to what divides the heads and
    lines up with the key heads); `interpret` runs the kernels in Pallas's interpreter, to check
    them off a TPU. `keep` names the forward kernel's results for the layer's remat policy
    (`KEPT`); `kept_dtype`, that of the states and inverses the backward reads (None:
    `kept_dtype_for` the kernels' precision).
    """
    tokens, key_heads, heads = q.shape[1], q.shape[2], v.shape[2]
    padded = -(-tokens // chunk_size) * chunk_size
    q, k, v = (jnp.pad(x, ((0, 0), (0, padded - tokens), (0, 0), (0, 0))) for x in (q, k, v))
    share = heads // key_heads
    precision = kernel_precision()
    static = Static(
        chunk_size, program_heads(heads, share, heads_per_program), share, query_scale,
        precision, interpret, kept_dtype or kept_dtype_for(precision, interpret), keep,
    )  # fmt: skip
    per_token = token_rows(log_decay, beta, segment_ids, chunk_size, padded)
    return _rule(q, k, v, per_token, static)[:, :tokens]


def kept_dtype_for(precision, interpret):
    """The dtype of the states and inverses the forward kernel writes for the backward: bfloat16
    where the compiled kernels' matmuls, the only readers but one sum, take their operands so
    (the default precision on a TPU), so rounding them first loses nothing more and halves their
    bytes; float32 under a finer precision and in the interpreter (whose host matmuls take
    float32 at any precision)."""
    return jnp.bfloat16 if precision == jax.lax.Precision.DEFAULT and not interpret else jnp.float32


def program_heads(heads, share, wanted):
    """The most heads up to `wanted` a program can take: a divisor of `heads` whose programs hold
    whole groups of value heads that share a key head, or lie inside one group."""
    fits = [
        n for n in range(1, min(wanted, heads) + 1)
        if heads % n == 0 and (n % share == 0 or share % n == 0)
    ]  # fmt: skip
    return max(fits)


def token_rows(log_decay, beta, segment_ids, chunk, padded):
    """The per-token scalars [B, H, n x ROWS, C] the kernels read, a [ROWS, C] block a chunk and
    head (rows CUM, BETA, RUN, REAL), float32, T padded to `padded` tokens; padding's log decay and
    beta zeroed."""
    rows, tokens, heads = log_decay.shape
    real = segment_ids != 0
    widths = ((0, 0), (0, padded - tokens))
    starts = jnp.pad(segment_starts(segment_ids), widths)
    log_decay, beta = (
        jnp.pad(jnp.where(real[..., None], x, 0).astype(jnp.float32), (*widths, (0, 0)))
        for x in (log_decay, beta)
    )

    def chunked(x):  # [B, padded, H] -> [B, H, n, C]
        return jnp.moveaxis(x.reshape(rows, padded // chunk, chunk, heads), 3, 1)

    def per_head(x):  # [B, padded] -> [B, H, n, C]
        x = x.reshape(rows, 1, padded // chunk, chunk).astype(jnp.float32)
        return jnp.broadcast_to(x, (rows, heads, *x.shape[2:]))

    named = [
        jnp.cumsum(chunked(log_decay), axis=-1),  # CUM
        chunked(beta),  # BETA
        per_head(jnp.cumsum(starts.reshape(rows, -1, chunk), axis=-1)),  # RUN
        per_head(jnp.pad(real, widths)),  # REAL
    ]
    named += [jnp.zeros_like(named[0])] * (ROWS - len(named))
    return jnp.stack(named, axis=3).reshape(rows, heads, -1, chunk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _rule(q, k, v, per_token, static):
    """o [B, T, H, Dv] from q, k [B, T, Hk, Dk], v [B, T, H, Dv] and `token_rows`, T whole chunks."""
    return _forward(q, k, v, per_token, static, keep_states=False)[0]


def _rule_forward(q, k, v, per_token, static):
    out, kept = _forward(q, k, v, per_token, static, keep_states=True)
    if static.keep:
        out, kept = checkpoint_name((out, kept), KEPT)
    return out, (q, k, v, per_token, kept)


def _rule_backward(static, residuals, d_out):
    q, k, v, per_token, kept = residuals
    d_q, d_k, d_v, d_per_token = _backward(q, k, v, per_token, kept, d_out, static)
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), d_per_token


_rule.defvjp(_rule_forward, _rule_backward)


# dot_general's contracting dims: a b, a b^T, a^T b
NN, NT, TN = ((1,), (0,)), ((1,), (1,)), ((0,), (0,))


def _calls(static, rows, heads, chunks, reverse):
    """The grid and block specs both kernels share: one program a (row, `static.heads` heads,
    chunk), the chunks in order (`reverse`: last first); keys' and values' blocks [C, heads x D] of
    [B, T, heads x D], a program's key block the key heads its value heads read."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    per_key = max(1, static.heads // static.share)  # key heads a program reads
    groups = max(1, static.share // static.heads)  # programs that read one key head

    def chunk(s):
        return chunks - 1 - s if reverse else s

    def of_heads(width, count, block):
        index = lambda i, j, s: (i, chunk(s), block(j))  # noqa: E731
        return pl.BlockSpec((None, static.chunk, count * width), index)

    per_token = (None, static.heads, ROWS, static.chunk)
    return {
        "grid": (rows, heads // static.heads, chunks),
        # lax.div: `//` lowers to a floor with signs, which Mosaic's index maps cannot take here
        "key": lambda dk: of_heads(dk, per_key, lambda j: jax.lax.div(j, j.dtype.type(groups))),
        "value": lambda width: of_heads(width, static.heads, lambda j: j),
        "rows": pl.BlockSpec(per_token, lambda i, j, s: (i, j, chunk(s), 0)),
        "state": lambda dk, dv: pl.BlockSpec(
            (None, static.heads, dk, dv), lambda i, j, s: (i, j, chunk(s), 0)
        ),
    }


def _pallas(kernel, static, calls, specs, out_shape, scratch, *inputs):
    """`kernel` on `inputs` over `calls`' grid, the chunk axis in order, `scratch` in VMEM; the
    call named as `kernel_vmem` knows it (so a compile's VMEM overflow names its engine key) and
    stating its matmuls' FLOPs and its bytes (what the AOT check counts for it)."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    in_specs, out_specs = specs
    rows, groups, chunks = calls["grid"]
    heads, key_dim, value_dim = scratch
    flops, exps = _chunk_cost(static.chunk, key_dim, value_dim, kernel is _backward_kernel)
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        name=GATED_DELTA_RULE_BACKWARD if kernel is _backward_kernel else GATED_DELTA_RULE_FORWARD,
        cost_estimate=pl.CostEstimate(
            flops=flops * rows * groups * heads * chunks,
            transcendentals=exps * rows * groups * heads * chunks,
            bytes_accessed=sum(x.size * x.dtype.itemsize for x in (*inputs, *out_shape)),
        ),
        out_shape=out_shape,
        grid=calls["grid"],
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM(scratch, jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=static.interpret,
    )(*inputs)


def _chunk_cost(size, key_dim, value_dim, backward):
    """(matmul FLOPs, exponentials) of one chunk of one head in the forward or backward kernel
    (docs/engine.md): `k k^T`, `q k^T`, `U`, `W`, the inverse's doubling (two C x C x C matmuls a
    level past the first) and the state's three products; in the backward those terms again but
    the inverse (the forward kept it), and the gradients' products."""
    levels = max(0, math.ceil(math.log2(size)) - 1)  # the doubling's levels with matmuls
    square, state = 2 * size * size, 2 * size * key_dim * value_dim
    terms = square * (3 * key_dim + value_dim)
    if backward:
        flops = terms + square * (6 * key_dim + 4 * value_dim) + 7 * state
    else:
        flops = terms + 4 * size**3 * levels + square * value_dim + 3 * state
    return flops, size * size + 3 * size


def _forward(q, k, v, per_token, static, *, keep_states):
    """o [B, T, H, Dv] and, with `keep_states`, what the backward kernel reads of each chunk: the
    state it starts from [B, H, n x Dk, Dv] and the inverse of its I + A [B, H, n x C, C] (which
    it would otherwise rebuild by the doubling's chain of dependent matmuls)."""
    rows, tokens, key_dim = q.shape[0], q.shape[1], q.shape[3]
    heads, value_dim = v.shape[2:]
    chunks = tokens // static.chunk
    calls = _calls(static, rows, heads, chunks, reverse=False)
    out_specs = [calls["value"](value_dim)]
    out_shape = [jax.ShapeDtypeStruct((rows, tokens, heads * value_dim), v.dtype)]
    if keep_states:
        for width, height in ((key_dim, value_dim), (static.chunk, static.chunk)):
            out_specs.append(calls["state"](width, height))
            out_shape.append(
                jax.ShapeDtypeStruct((rows, heads, chunks * width, height), static.kept_dtype)
            )
    key = calls["key"](key_dim)
    in_specs = [key, key, calls["value"](value_dim), calls["rows"]]
    outs = _pallas(
        _forward_kernel, static, calls, (in_specs, out_specs), out_shape,
        (static.heads, key_dim, value_dim),
        *(x.reshape(rows, tokens, -1) for x in (q, k, v)), per_token,
    )  # fmt: skip
    return outs[0].reshape(v.shape), (tuple(outs[1:]) if keep_states else None)


def _backward(q, k, v, per_token, kept, d_out, static):
    """Gradients of q and k [B, T, Hk, Dk] (a key head's sums the value heads it serves), of v and
    of `token_rows`. Where a program holds whole groups of value heads that share a key head, it
    sums each group in VMEM and writes its key heads' gradients in q's dtype; where a group spans
    programs, each writes its value heads' gradients in float32 and they are summed here."""
    rows, tokens, key_dim = q.shape[0], q.shape[1], q.shape[3]
    heads, value_dim = v.shape[2:]
    calls = _calls(static, rows, heads, tokens // static.chunk, reverse=True)
    value, key = calls["value"](value_dim), calls["key"](key_dim)
    if _sums_key_heads(static):
        grads_spec, grads_heads, grads_dtype = key, q.shape[2], q.dtype
    else:
        grads_spec, grads_heads, grads_dtype = calls["value"](key_dim), heads, jnp.float32
    out_shape = [
        jax.ShapeDtypeStruct((rows, tokens, grads_heads * key_dim), grads_dtype),
        jax.ShapeDtypeStruct((rows, tokens, grads_heads * key_dim), grads_dtype),
        jax.ShapeDtypeStruct((rows, tokens, heads * value_dim), v.dtype),
        jax.ShapeDtypeStruct(per_token.shape, jnp.float32),
    ]
    state = calls["state"](key_dim, value_dim)
    inverse = calls["state"](static.chunk, static.chunk)
    in_specs = [key, key, value, calls["rows"], state, inverse, value]
    out_specs = [grads_spec, grads_spec, value, calls["rows"]]
    d_q, d_k, d_v, d_per_token = _pallas(
        _backward_kernel, static, calls, (in_specs, out_specs), out_shape,
        (static.heads, key_dim, value_dim),
        *(x.reshape(rows, tokens, -1) for x in (q, k, v)), per_token, *kept,
        d_out.reshape(rows, tokens, -1),
    )  # fmt: skip
    d_q, d_k = (d.reshape(rows, tokens, grads_heads, -1) for d in (d_q, d_k))
    if not _sums_key_heads(static):
        d_q, d_k = (d.reshape(*q.shape[:3], static.share, -1).sum(3) for d in (d_q, d_k))
    return d_q, d_k, d_v.reshape(v.shape), d_per_token


def _sums_key_heads(static):
    """Whether a backward program holds whole groups of the value heads that share a key head."""
    return static.heads % static.share == 0


def _head_columns(head, width):
    """The columns of a program's `head`-th head in a block of heads side by side."""
    return slice(head * width, (head + 1) * width)


class Chunk(NamedTuple):
    """One chunk of one head in VMEM, float32: [C, D] arrays, [C, 1] per-token columns, [C, C]."""

    q: jax.Array  # masked, normalised and scaled as the rule takes it
    k: jax.Array
    v: jax.Array
    norms: tuple | None  # (q's, k's) 1 / |x| [C, 1] where the kernel normalises, else None
    real: jax.Array  # [C, 1] bool
    beta: jax.Array  # [C, 1]
    from_start: jax.Array  # G [C, 1]
    to_end: jax.Array  # e [C, 1]
    across: jax.Array  # g [1, 1]
    causal_decay: jax.Array  # G_t / G_i where i <= t in one segment, else 0
    strict_decay: jax.Array  # the same where i < t
    kk: jax.Array  # k k^T
    system: jax.Array  # A
    inverse: jax.Array  # (I + A)^-1
    u: jax.Array  # U [C, Dv]
    w: jax.Array  # W [C, Dk]
    p: jax.Array  # P


def _matmul(static):
    """a b over the contracting dims `dims` at the kernel's precision, float32 out."""

    def matmul(a, b, dims=NN):
        return jax.lax.dot_general(
            a, b, (dims, ((), ())), precision=static.precision, preferred_element_type=jnp.float32
        )

    return matmul


def _chunk(q, k, v, per_token, static, inverse=None):
    """Everything of a chunk that does not depend on its incoming state (docs/gated-deltanet.md);
    its `inverse` of I + A where the forward kernel kept it."""
    matmul, size = _matmul(static), static.chunk
    columns = per_token.T  # [C, ROWS]: a token a row
    cum, beta, run, real = (columns[:, i : i + 1] for i in (CUM, BETA, RUN, REAL))
    cum_row, run_row = per_token[CUM : CUM + 1], per_token[RUN : RUN + 1]  # [1, C]
    real = real > 0
    q, k, v = (jnp.where(real, x.astype(jnp.float32), 0.0) for x in (q, k, v))
    norms = None
    if static.query_scale is not None:
        norms = tuple(
            jax.lax.rsqrt(jnp.sum(x * x, axis=1, keepdims=True) + NORM_EPS) for x in (q, k)
        )
        q, k = q * norms[0] * static.query_scale, k * norms[1]
    row, col = (jax.lax.broadcasted_iota(jnp.int32, (size, size), axis) for axis in (0, 1))
    causal_decay = jnp.exp(jnp.where((run == run_row) & (row >= col), cum - cum_row, -jnp.inf))
    strict_decay = jnp.where(row > col, causal_decay, 0.0)
    from_start = jnp.where(run == 0, jnp.exp(cum), 0.0)
    cum_last, run_last = cum_row[:, size - 1 :], run_row[:, size - 1 :]  # [1, 1]
    kk = matmul(k, k, NT)
    system = strict_decay * kk * beta
    if inverse is None:
        inverse = doubled(system, (row, col), matmul)
    return Chunk(
        q, k, v, norms, real, beta, from_start,
        to_end=jnp.where(run == run_last, jnp.exp(cum_last - cum), 0.0),
        across=jnp.where(run_last == 0, jnp.exp(cum_last), 0.0),
        causal_decay=causal_decay,
        strict_decay=strict_decay,
        kk=kk,
        system=system,
        inverse=inverse,
        u=matmul(inverse, v * beta),
        w=matmul(inverse, k * (beta * from_start)),
        p=causal_decay * matmul(q, k, NT),
    )  # fmt: skip


def _heads(ref, width, count, per):
    """A program's `count` heads [count, C, width] from a block [C, n x width], head h from the
    block's column group h // `per` (`per`: value heads a key head serves, for q and k)."""
    return jnp.stack([ref[:, _head_columns(head // per, width)] for head in range(count)])


def _forward_kernel(q_ref, k_ref, v_ref, rows_ref, out_ref, *refs, static):
    """One chunk of a program's heads, all heads at each stage (batched, so the compiler overlaps
    their chains of small matmuls; written one head after another they run one after another):
    its outputs and the states it hands on (refs: the states it starts from and its inverses,
    when kept, then the states in VMEM scratch, carried from the chunk before)."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    *kept, state_ref = refs
    key_dim, value_dim = state_ref.shape[1:]
    incoming = jnp.where(pl.program_id(2) == 0, 0.0, state_ref[...])  # a row starts from zero
    q, k = (_heads(ref, key_dim, static.heads, static.share) for ref in (q_ref, k_ref))
    v = _heads(v_ref, value_dim, static.heads, 1)
    chunk_forward = jax.vmap(functools.partial(_chunk_forward, static=static))
    out, outgoing, inverse = chunk_forward(q, k, v, rows_ref[...], incoming)
    if kept:
        kept[0][...], kept[1][...] = (x.astype(kept[0].dtype) for x in (incoming, inverse))
    for head in range(static.heads):
        out_ref[:, _head_columns(head, value_dim)] = out[head].astype(out_ref.dtype)
    state_ref[...] = outgoing


def _chunk_forward(q, k, v, per_token, incoming, static):
    """One head's chunk: its outputs, the state it hands on and its inverse."""
    matmul = _matmul(static)
    chunk = _chunk(q, k, v, per_token, static)
    deltas = chunk.u - matmul(chunk.w, incoming)
    out = matmul(chunk.from_start * chunk.q, incoming) + matmul(chunk.p, deltas)
    outgoing = chunk.across * incoming + matmul(chunk.to_end * chunk.k, deltas, TN)
    return out, outgoing, chunk.inverse


def _backward_kernel(
    q_ref, k_ref, v_ref, rows_ref, state_ref, inverse_ref, d_out_ref, d_q_ref, d_k_ref, d_v_ref,
    d_rows_ref, d_state_ref, *, static,
):  # fmt: skip
    """One chunk of a program's heads, all heads at each stage as the forward's, the chunks of a
    row last first: the gradients of its inputs, and of the states it started from (carried in
    VMEM scratch to the chunk before)."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    key_dim, value_dim = d_state_ref.shape[1:]
    # the row's last chunk: nothing comes after it
    d_outgoing = jnp.where(pl.program_id(2) == 0, 0.0, d_state_ref[...])
    q, k = (_heads(ref, key_dim, static.heads, static.share) for ref in (q_ref, k_ref))
    v, d_out = (_heads(ref, value_dim, static.heads, 1) for ref in (v_ref, d_out_ref))
    chunk_backward = jax.vmap(functools.partial(_chunk_backward, static=static))
    grads = chunk_backward(
        q, k, v, rows_ref[...], *(ref[...].astype(jnp.float32) for ref in (state_ref, inverse_ref)),
        d_out.astype(jnp.float32), d_outgoing,
    )  # fmt: skip
    d_state_ref[...] = grads["incoming"]
    d_rows_ref[...] = grads["rows"]
    for head in range(static.heads):
        d_v_ref[:, _head_columns(head, value_dim)] = grads["v"][head].astype(d_v_ref.dtype)
    # a key head's gradient sums the value heads it serves, in VMEM where the program holds them
    group = static.share if _sums_key_heads(static) else 1
    for column in range(static.heads // group):
        served = slice(column * group, (column + 1) * group)
        for ref, name in ((d_q_ref, "q"), (d_k_ref, "k")):
            ref[:, _head_columns(column, key_dim)] = grads[name][served].sum(0).astype(ref.dtype)


def _chunk_backward(q, k, v, per_token, incoming, inverse, d_out, d_outgoing, static):
    """One head's chunk: the gradients of its inputs, per-token rows and incoming state."""
    chunk = _chunk(q, k, v, per_token, static, inverse)
    grads = _gradients(chunk, incoming, d_out, d_outgoing, static)
    return {
        **{name: grads[name] for name in ("incoming", "q", "k", "v")},
        "rows": _per_token_gradients(chunk, grads, static),
    }


def _gradients(chunk, incoming, d_out, d_outgoing, static):
    """The gradients of one chunk's inputs and incoming state from those of its outputs and of the
    state it hands on (docs/engine.md); the matrix parts, per-token sums left to the caller."""
    matmul = _matmul(static)
    deltas = chunk.u - matmul(chunk.w, incoming)
    to_end_k = chunk.to_end * chunk.k
    d_deltas = matmul(chunk.p, d_out, TN) + matmul(to_end_k, d_outgoing)
    d_incoming = (
        matmul(chunk.from_start * chunk.q, d_out, TN)
        + chunk.across * d_outgoing
        - matmul(chunk.w, d_deltas, TN)
    )
    d_p = matmul(d_out, deltas, NT)
    d_from_start_q = matmul(d_out, incoming, NT)  # of G q
    d_to_end_k = matmul(deltas, d_outgoing, NT)  # of e k
    d_beta_v = matmul(chunk.inverse, d_deltas, TN)  # U = X (b v)
    d_beta_gk = -matmul(chunk.inverse, matmul(d_deltas, incoming, NT), TN)  # W = X (b G k)
    d_system = -(matmul(d_beta_v, chunk.u, NT) + matmul(d_beta_gk, chunk.w, NT))
    d_kk = d_system * chunk.strict_decay * chunk.beta
    d_qk = d_p * chunk.causal_decay
    d_q = matmul(d_qk, chunk.k) + chunk.from_start * d_from_start_q
    d_k = (
        matmul(d_kk, chunk.k)
        + matmul(d_kk, chunk.k, TN)
        + matmul(d_qk, chunk.q, TN)
        + chunk.beta * chunk.from_start * d_beta_gk
        + chunk.to_end * d_to_end_k
    )
    if chunk.norms is not None:  # through x / |x| (and q's scale)
        d_q = _through_norm(d_q * static.query_scale, chunk.q / static.query_scale, chunk.norms[0])
        d_k = _through_norm(d_k, chunk.k, chunk.norms[1])
    return {
        "incoming": d_incoming,
        "q": jnp.where(chunk.real, d_q, 0.0),
        "k": jnp.where(chunk.real, d_k, 0.0),
        "v": jnp.where(chunk.real, chunk.beta * d_beta_v, 0.0),
        "from_start_q": d_from_start_q,
        "to_end_k": d_to_end_k,
        "beta_v": d_beta_v,
        "beta_gk": d_beta_gk,
        "system": d_system,
        "p": d_p,
        "across": jnp.sum(incoming * d_outgoing, keepdims=True),  # [1, 1]
    }


def _through_norm(d_unit, unit, norm):
    """The gradient of x from that of x / |x| (`unit`, with 1 / |x| `norm`)."""
    return norm * (d_unit - unit * jnp.sum(d_unit * unit, axis=1, keepdims=True))


def _per_token_gradients(chunk, grads, static):
    """The gradients of the chunk's per-token rows [ROWS, C]: of its decays (row CUM, the log decay
    summed from the chunk start) and of beta (row BETA), zero in the other rows."""
    size = static.chunk

    def row_sums(x):
        return jnp.sum(x, axis=1, keepdims=True)

    gk = row_sums(grads["beta_gk"] * chunk.k)
    d_from_start = row_sums(grads["from_start_q"] * chunk.q) + chunk.beta * gk
    d_to_end = row_sums(grads["to_end_k"] * chunk.k)
    d_beta = (
        row_sums(grads["system"] * chunk.strict_decay * chunk.kk)
        + row_sums(grads["beta_v"] * chunk.v)
        + chunk.from_start * gk
    )
    # a decay G_t / G_i is exp(cum_t - cum_i): its gradient enters cum_t and leaves cum_i
    gaps = grads["system"] * chunk.system + grads["p"] * chunk.p
    last = jax.lax.broadcasted_iota(jnp.int32, (size, 1), 0) == size - 1
    to_last = jnp.sum(d_to_end * chunk.to_end, keepdims=True) + grads["across"] * chunk.across
    d_cum = (
        row_sums(gaps)
        + d_from_start * chunk.from_start
        - d_to_end * chunk.to_end
        + jnp.where(last, to_last, 0.0)
    )
    lane = jax.lax.broadcasted_iota(jnp.int32, (size, ROWS), 1)
    columns = jnp.where(lane == CUM, d_cum, jnp.where(lane == BETA, d_beta, 0.0))
    first = jax.lax.broadcasted_iota(jnp.int32, (ROWS, size), 0) == CUM
    return columns.T + jnp.where(first, -jnp.sum(gaps, axis=0, keepdims=True), 0.0)
