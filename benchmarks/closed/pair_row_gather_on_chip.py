"""Closed probe: the MoE's pair-row gathers on a TPU chip, alone: XLA's gather against a Pallas
kernel that gathers bfloat16 rows by DMA, time and bit-equality, at a micro-batch's token group of
the preset. The answer (the kernel lost where it mattered: 1.37 ms against XLA's 0.83 for the
tokens' rows, 1.93 against 2.08 for the pairs' rows into slot order) is in
benchmarks/reports/chip-round-10_tpu-v5e_2026-12-07.md; the engine keeps XLA's gather.

Why it was asked: the step's trace charges the sorted layer's five [A N K, D] gathers a layer
about 118 ms of tpu-v5e-1's step at 0.74 ms each, where their bytes are about 0.27 ms of HBM
traffic. The kernel here DMAs each row from HBM into VMEM, a block of rows at a time. A DMA moves
whole 32-bit rows of a tiled VMEM buffer, not single rows of bfloat16's packed tiles (Mosaic
refuses a one-row slice of one), so the table goes in packed: channel c's bits beside channel
c + D/2's in one 32-bit word (one element-wise pass over the table), and the kernel unpacks each
block back to bfloat16 as it writes it: a bfloat16's bits are a float32's upper half, so both
halves come out exact.

Each gather of the layer is timed on routing drawn as the preset's (K of E experts a token, the
pairs sorted by expert as `moe.sort_pairs` sorts them): the tokens' rows into expert order
(`tokens[order // K]`), the pairs' rows back into slot order (`pairs[by_slot]`), and a float32
gradient's rows into expert order, cast (`grad[token_of]`), with a copy of the pairs' buffer
(`x + 1`) for the chip's HBM rate. Each arm is jitted over the same inputs and timed over
`chip_timing.REPEATS` calls after a warm-up, median per call (a call's dispatch included, the same
in every arm).

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/closed/pair_row_gather_on_chip.py --output gather.json
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chip"))
from chip_timing import chip_parser, preset_on_the_chip, timed

from rl_trainer_bench.engine.builtin.moe import sort_pairs
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import write_text_atomically

BLOCKS = (128, 256, 512)
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


def routing(tokens: int, experts: int, k: int, seed: int = 0):
    """(token_of [N K], by_slot [N K]): each pair's token in expert order, and the sorted
    positions of the pairs listed slot by slot, for K distinct experts a token drawn uniformly."""
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k].astype(np.int32)
    placed, _ = sort_pairs(jnp.asarray(chosen), 0, experts)
    return placed.order // k, placed.position.reshape(-1, k).T.reshape(-1)


def arm(fn, *args) -> dict:
    """A jitted `fn(*args)`'s median call and its rows' bytes written a millisecond."""
    jitted = jax.jit(fn)
    out = jitted(*args)
    ms = statistics.median(timed(jitted, *args)) * 1e3
    return {"ms": ms, "written_gb_s": out.size * out.dtype.itemsize / ms / 1e6}, out


def main(argv: list[str]) -> int:
    args = chip_parser(__doc__).parse_args(argv)
    engine = preset_on_the_chip(args.preset, args.output)
    m = engine.model
    tokens = engine.micro_batch_rows * engine.seq_len // engine.moe.token_chunks
    k, width = m.top_k, m.d_model
    token_of, by_slot = routing(tokens, m.num_experts, k)
    rng = np.random.default_rng(1)
    table = jnp.asarray(rng.standard_normal((tokens, width)), jnp.bfloat16)
    pairs = jnp.asarray(rng.standard_normal((tokens * k, width)), jnp.bfloat16)
    grad = jnp.asarray(rng.standard_normal((tokens, width)), jnp.float32)
    cases = {
        "tokens[order // K]": (table, token_of),
        "pairs[by_slot]": (pairs, by_slot),
    }
    report = {"device": jax.devices()[0].device_kind, "preset": args.preset, "arms": {}}
    report["arms"]["copy x + 1 [N K, D]"], _ = arm(lambda x: x + 1, pairs)
    report["arms"]["xla grad[token_of] f32 -> bf16"], _ = arm(
        lambda g, i: g[i].astype(jnp.bfloat16), grad, token_of
    )
    for name, (source, index) in cases.items():
        report["arms"][f"xla {name}"], want = arm(lambda t, i: t[i], source, index)
        for block in BLOCKS:
            result, got = arm(
                lambda t, i, block=block: gather_rows(t, i, rows_a_block=block), source, index
            )
            result["bit_equal_to_xla"] = bool(
                jnp.all(
                    jax.lax.bitcast_convert_type(got, jnp.uint16)
                    == jax.lax.bitcast_convert_type(want, jnp.uint16)
                )
            )
            report["arms"][f"pallas {name} rows_a_block={block}"] = result
    for name, result in report["arms"].items():
        print(f"{name}: {result}")
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("pair_row_gather_on_chip.py", lambda: main(sys.argv[1:]), (UserError,)))
