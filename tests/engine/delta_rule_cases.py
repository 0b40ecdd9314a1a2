"""The gated delta rule's kernels against autodiff of the per-token recurrence in float64, case by
case: shared by the interpreter's test (`test_delta_rule_kernel.py`) and the chip's
(`test_delta_rule_kernel_on_chip.py`), which run the same cases, the kernels interpreted on the host
or compiled on the chip.

Rows of 200 tokens: 4 chunks of 64 (the last padded by the kernel from 192 on), 7 of 32 or 2 of
128. The state crosses a whole chunk (the chunk's decay `g` multiplies it, and the log decay's
gradient takes `g`'s share) only in a segment spanning three chunks or more, as production's rows
of thousands of tokens do: row 0's segment 2 opens inside a chunk (37) and runs across three chunks
of 64 into the row's padding (190 on); row 1's segment 4 opens on a chunk's first token (64) and runs
across three to the row's end; row 2 opens a segment on the first token of a chunk of any size
(128), has a segment of one token, and no padding."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gdn_reference import recurrence, rule_arrays

from rl_trainer_bench.engine.builtin.delta_rule_kernel import chunked_delta_rule

TOKENS = 200
SEGMENTS = np.array(
    [
        [1] * 37 + [2] * 153 + [0] * 10,
        [3] * 64 + [4] * 136,
        [5] * 128 + [6] * 1 + [7] * 71,
    ]
)
GRADIENTS = ("q", "k", "v", "log_decay", "beta")


class Case(NamedTuple):
    chunk: int
    key_heads: int
    heads: int
    per_program: int  # `heads_per_program`
    normalise: bool  # q and k as the layer's convolution gives them, normalised inside the kernels
    kept_dtype: object  # of the states and inverses the backward reads; None: the kernels' choice
    tolerance: float  # of the gradients, relative (elementwise in the interpreter)


CASES = {
    "chunks of 128, normalised q and k, a head a program": Case(128, 2, 2, 1, False, None, 1e-4),
    "chunks of 64, shared keys normalised inside, two heads a program": Case(
        64, 1, 2, 2, True, None, 1e-4
    ),
    "two key heads of two value heads each in one program, their gradients summed inside, "
    "chunks of 32": Case(32, 2, 4, 4, True, None, 1e-4),
    "a key head's four value heads over two programs, their gradients summed after": Case(
        64, 1, 4, 2, True, None, 1e-4
    ),
    "the states and inverses kept in bfloat16, as compiled kernels keep them on a TPU": Case(
        64, 1, 4, 2, True, jnp.bfloat16, 1e-2
    ),
}


def rule_inputs(key_heads, heads, key_dim, value_dim, seed=0):
    """q and k per key head as a layer's convolution gives them (not normalised), v, slow decays
    (the state carries across chunks) and beta, float64; NaN on the padding."""
    rng = np.random.default_rng(seed)
    shape = (len(SEGMENTS), TOKENS)
    arrays = rule_arrays(rng, shape, (key_heads, heads), (key_dim, value_dim), fastest_decay=0.2)
    padding = SEGMENTS == 0
    return tuple(np.where(padding.reshape(*shape, *[1] * (x.ndim - 2)), np.nan, x) for x in arrays)


def normalised(q, k, heads, scale):
    """The rule's q and k from the layer's: unit rows (q times `scale`), shared by value heads."""
    share = heads // q.shape[2]

    def unit(x):
        return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    return jnp.repeat(unit(q) * scale, share, axis=2), jnp.repeat(unit(k), share, axis=2)


def kernels_and_reference(case, key_dim, value_dim, *, interpret):
    """The kernels' outputs and gradients of q, k, v, log decay and beta (float32, padding NaN in
    their inputs) and the same by autodiff of the recurrence in float64 on the host's CPU (padding
    zeroed for it: it must not matter), of the loss `sum(out * weights)`: ((out, grads), (out,
    grads)), NumPy arrays."""
    arrays = rule_inputs(case.key_heads, case.heads, key_dim, value_dim)
    scale = key_dim**-0.5
    if not case.normalise:
        arrays = (*map(np.asarray, normalised(*arrays[:2], case.heads, scale)), *arrays[2:])
    weights = np.random.default_rng(1).normal(size=(*SEGMENTS.shape, case.heads, value_dim))

    def kernel_loss(*x):
        out = chunked_delta_rule(
            *x, jnp.asarray(SEGMENTS), chunk_size=case.chunk, heads_per_program=case.per_program,
            query_scale=scale if case.normalise else None, interpret=interpret,
            kept_dtype=case.kept_dtype,
        )  # fmt: skip
        return jnp.sum(out * weights.astype(np.float32)), out

    def reference_loss(q, k, v, log_decay, beta):
        if case.normalise:
            q, k = normalised(q, k, case.heads, scale)
        out = recurrence(q, k, v, log_decay, beta, jnp.asarray(SEGMENTS))
        return jnp.sum(out * weights), out

    kernel = jax.jit(jax.value_and_grad(kernel_loss, argnums=range(5), has_aux=True))
    (_, out), grads = jax.tree.map(
        np.asarray, kernel(*(jnp.asarray(x, jnp.float32) for x in arrays))
    )
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        finite = (jnp.asarray(np.nan_to_num(x, nan=0.0)) for x in arrays)
        reference = jax.jit(jax.value_and_grad(reference_loss, argnums=range(5), has_aux=True))
        (_, want), want_grads = jax.tree.map(np.asarray, reference(*finite))
    return (out, grads), (want, want_grads)


def largest_errors(got, want):
    """Each array's largest |difference| over its largest |value|, the output first, by name."""
    (out, grads), (want_out, want_grads) = got, want
    return {
        name: float(np.abs(a - r).max() / np.abs(r).max())
        for name, a, r in zip(
            ("out", *GRADIENTS), (out, *grads), (want_out, *want_grads), strict=True
        )
    }
