"""The MoE's pair-row gathers on a TPU chip, alone: XLA's gather against the Pallas DMA kernel
(`row_gather.gather_rows`), time and bit-equality, at a micro-batch's token group of the preset.

Why: the step's trace charges the sorted layer's five [A N K, D] gathers a layer about 118 ms of
tpu-v5e-1's step at 0.74 ms each, where writing their rows once is about 0.27 ms of HBM traffic
(chip round 10). This times each gather of the layer alone on routing drawn as the preset's (K
of E experts a token, the pairs sorted by expert as `moe.sort_pairs` sorts them): the tokens'
rows into expert order (`tokens[order // K]`, the forward's and backward's), the pairs' rows
back into slot order (`pairs[by_slot]`), and a float32 gradient's rows into expert order, cast
(`grad[token_of]`), with a copy of the pairs' buffer (`x + 1`) for the chip's HBM rate. Each arm
is jitted over the same inputs and timed over `chip_timing.REPEATS` calls after a warm-up, median
per call (a call's dispatch included, the same in every arm).

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/row_gather_on_chip.py --output gather.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from chip_timing import preset_on_the_chip, timed

from rl_trainer_bench.engine.builtin.moe import sort_pairs
from rl_trainer_bench.engine.builtin.row_gather import gather_rows
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import write_text_atomically

BLOCKS = (128, 256, 512)


def routing(tokens: int, experts: int, k: int, seed: int = 0):
    """(token_of [N K], by_slot [N K]): each pair's token in expert order, and the sorted
    positions of the pairs listed slot by slot, for K distinct experts a token drawn uniformly."""
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k].astype(np.int32)
    placed, _ = sort_pairs(jnp.asarray(chosen), 0, experts)
    return placed.order // k, placed.position.reshape(-1, k).T.reshape(-1)


def arm(fn, *args) -> dict:
    """A jitted `fn(*args)`'s median call and its rows' bytes written a millisecond."""
    out = jax.jit(fn)(*args)
    ms = statistics.median(timed(jax.jit(fn), *args)) * 1e3
    return {"ms": ms, "written_gb_s": out.size * out.dtype.itemsize / ms / 1e6}, out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tpu-v5e-1", help="the cell's shapes (tpu-v5e-1)")
    parser.add_argument("--output", type=Path, required=True, help="the JSON report")
    args = parser.parse_args(argv)
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
    sys.exit(run_guarded("row_gather_on_chip.py", lambda: main(sys.argv[1:]), (UserError,)))
