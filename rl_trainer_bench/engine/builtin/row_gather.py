"""Rows of a bfloat16 table gathered by DMA in a Pallas TPU kernel.

The MoE's sorted layer gathers its pairs' rows five times a layer (`moe._sorted_experts`): each
[A N K, D] gather is a third of a millisecond of HBM traffic on a v5e chip at tpu-v5e-1's shapes,
and XLA's gather takes two to four times that (the chip's trace, BENCHMARKS.md). Here each row is
one DMA from HBM into VMEM, a block of rows at a time. A DMA moves whole 32-bit rows of a tiled
VMEM buffer, not single rows of bfloat16's packed tiles (Mosaic refuses a one-row slice of one),
so the table goes in packed: channel c's bits beside channel c + D/2's in one 32-bit word
(`pack_rows`, one element-wise pass over the table), and the kernel unpacks each block back to
bfloat16 as it writes it: a bfloat16's bits are a float32's upper half, so both halves come out
exact.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

ROWS_A_BLOCK = 256
HIGH_HALF = np.uint32(0xFFFF0000)


def pack_rows(table):
    """bfloat16 [T, D] -> uint32 [T, D/2]: channel c's bits in the upper half of word c, channel
    c + D/2's in its lower half."""
    half = table.shape[-1] // 2
    high, low = (
        jax.lax.bitcast_convert_type(part.astype(jnp.float32), jnp.uint32)
        for part in (table[:, :half], table[:, half:])
    )
    return (high & HIGH_HALF) | (low >> np.uint32(16))


def gather_rows(table, indices, *, rows_a_block=ROWS_A_BLOCK, interpret=False):
    """table[indices] for a bfloat16 table [T, D] (D a multiple of 256) and indices [P] in [0, T),
    by one DMA a row. `interpret` runs the kernel in Pallas's interpreter, to check it off a TPU."""
    rows, width = indices.shape[0], table.shape[-1]
    if table.dtype != jnp.bfloat16 or width % 256:
        raise ValueError(
            f"a bfloat16 table of a width that is a multiple of 256, not {table.dtype} [{width}]"
        )
    blocks = -(-rows // rows_a_block)
    padded = jnp.pad(indices.astype(jnp.int32), (0, blocks * rows_a_block - rows))
    out = _gather(pack_rows(table), padded, rows_a_block, interpret)
    return out[:rows]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _gather(packed, indices, rows_a_block, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    half = packed.shape[-1]
    blocks = indices.shape[0] // rows_a_block

    def kernel(index_ref, packed_hbm, out_ref, landed, sem):
        first = pl.program_id(0) * rows_a_block

        def row_copy(i, source):
            return pltpu.make_async_copy(
                packed_hbm.at[pl.ds(source, 1)], landed.at[pl.ds(i, 1)], sem
            )

        def start(i, carry):
            row_copy(i, index_ref[first + i]).start()
            return carry

        def wait(i, carry):
            row_copy(i, 0).wait()  # each wait takes one row's bytes off the shared semaphore
            return carry

        jax.lax.fori_loop(0, rows_a_block, start, 0, unroll=8)
        jax.lax.fori_loop(0, rows_a_block, wait, 0, unroll=8)
        words = landed[...]
        for part, bits in ((0, words & HIGH_HALF), (1, words << np.uint32(16))):
            value = jax.lax.bitcast_convert_type(bits, jnp.float32).astype(out_ref.dtype)
            out_ref[:, part * half : (part + 1) * half] = value

    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(blocks,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((rows_a_block, 2 * half), lambda i, index: (i, 0)),
            scratch_shapes=[pltpu.VMEM((rows_a_block, half), jnp.uint32), pltpu.SemaphoreType.DMA],
        ),
        out_shape=jax.ShapeDtypeStruct((indices.shape[0], 2 * half), jnp.bfloat16),
        interpret=interpret,
    )(indices, packed)
