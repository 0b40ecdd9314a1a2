"""A chain of dependent 128 x 128 matmuls in one Pallas program on a TPU chip: its rate and its
error at each matmul precision, beside XLA's batched matmuls of the same chain.

Why: the Gated DeltaNet's kernels (`delta_rule_kernel.py`) are chains of small dependent matmuls
(a chunk's terms, the inverse's doubling, the state's update), and their row of the step's trace
sits about 3x above its roofline. This separates the two causes one could suspect: the precision
the kernels' float32 operands get (Mosaic's DEFAULT one bfloat16 pass, as XLA's, or several) and
the chain's latency (each matmul waits on the one before). Each program multiplies its [C, C]
float32 block by a [C, C] matrix CHAIN times in a row, each product scaled by 0.05 to stay
finite; arms: Pallas at Precision.DEFAULT, at HIGHEST, with operands cast to bfloat16, and XLA's
batched einsum of the same chain at its default and at highest. Then the overlap of independent
chains: 2, 4 and 8 chains a program (as many programs fewer, the same work) written one chain after
another (as the kernels' heads once were), one product of every chain at a time, and as one batched
matmul a step. Each arm is timed over TIMED calls
after a warm-up (median) and its error is the first program's largest difference from the chain
in float64 on the host, over the largest value.

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/matmul_chain_on_chip.py --output matmul_chain.json

Remakes the matmul chain's figures in BENCHMARKS.md's chip suite;
benchmarks/reports/chip-round-7_tpu-v5e_2026-12-07.md, chip-round-8.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.errors import run_guarded
from rl_trainer_bench.io import check_output_file, write_text_atomically

PROGRAMS, SIZE, CHAIN = 2048, 128, 16
# independent chains in one program: does the compiler overlap them, and in which program order
CHAINS_A_PROGRAM = (2, 4, 8)
TIMED = 5
SCALE = 0.05


def _product(x, b, mode):
    """x b at the arm's precision, float32 out, scaled to stay finite."""
    if mode == "bfloat16 operands":
        x, b, precision = x.astype(jnp.bfloat16), b.astype(jnp.bfloat16), None
    else:
        precision = jax.lax.Precision.HIGHEST if mode == "HIGHEST" else jax.lax.Precision.DEFAULT
    return jax.lax.dot(x, b, precision=precision, preferred_element_type=jnp.float32) * SCALE


def _chain_kernel(a_ref, b_ref, out_ref, *, mode, order):
    """The program's chains (a block's leading axis): `order` "chains": each chain's CHAIN
    products before the next chain's (as the delta-rule kernels' heads are written); "steps": one
    product of every chain, then the next; "batched": every chain's product as one batched
    matmul."""
    chains = a_ref.shape[0]
    if order == "batched":
        x, b = a_ref[...], b_ref[...]
        for _ in range(CHAIN):
            x = jnp.einsum("nij,njk->nik", x, b, preferred_element_type=jnp.float32) * SCALE
        out_ref[...] = x
        return
    xs, bs = [a_ref[n] for n in range(chains)], [b_ref[n] for n in range(chains)]
    if order == "chains":
        xs = [_chained(x, b, mode) for x, b in zip(xs, bs, strict=True)]
    else:
        for _ in range(CHAIN):
            xs = [_product(x, b, mode) for x, b in zip(xs, bs, strict=True)]
    for n, x in enumerate(xs):
        out_ref[n] = x


def _chained(x, b, mode):
    for _ in range(CHAIN):
        x = _product(x, b, mode)
    return x


def pallas_chain(mode, chains, order, a, b):
    """Each [SIZE, SIZE] block of `a` times `b`'s CHAIN times, `chains` blocks a kernel program."""
    from jax.experimental import pallas as pl

    block = pl.BlockSpec((chains, SIZE, SIZE), lambda i: (i, 0, 0))
    return pl.pallas_call(
        functools.partial(_chain_kernel, mode=mode, order=order),
        out_shape=jax.ShapeDtypeStruct(a.shape, jnp.float32),
        grid=(a.shape[0] // chains,),
        in_specs=[block, block],
        out_specs=block,
    )(a, b)


def xla_chain(precision, a, b):
    """The same chain by XLA's batched matmuls."""
    x = a
    for _ in range(CHAIN):
        x = jnp.einsum("nij,njk->nik", x, b, precision=precision) * SCALE
    return x


def arms() -> dict:
    """name -> the chain on (a, b)."""
    found = {
        f"pallas, {mode}": functools.partial(pallas_chain, mode, 1, "chains")
        for mode in ("DEFAULT", "HIGHEST", "bfloat16 operands")
    }
    for chains in CHAINS_A_PROGRAM:
        for order in ("chains", "steps", "batched"):
            name = f"pallas, DEFAULT, {chains} chains a program, by {order}"
            found[name] = functools.partial(pallas_chain, "DEFAULT", chains, order)
    found["xla, default"] = functools.partial(xla_chain, None)
    found["xla, highest"] = functools.partial(xla_chain, "highest")
    return found


def measure(chain, a, b, want) -> dict:
    """One arm's median time a call, its rate and its error against `want`."""
    fn = jax.jit(chain)
    jax.block_until_ready(fn(a, b))
    times = []
    for _ in range(TIMED):
        start = time.perf_counter()
        jax.block_until_ready(fn(a, b))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    got = np.asarray(fn(a, b)[0], np.float64)
    return {
        "ms": 1e3 * seconds,
        "tflops": 2 * PROGRAMS * CHAIN * SIZE**3 / seconds / 1e12,
        "rel_err": float(np.abs(got - want).max() / np.abs(want).max()),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="the JSON report")
    args = parser.parse_args(argv)
    check_output_file(args.output, "--output")  # before any chip time
    a_key, b_key = jax.random.split(jax.random.key(0))
    a = jax.random.normal(a_key, (PROGRAMS, SIZE, SIZE), jnp.float32)
    b = jax.random.normal(b_key, (PROGRAMS, SIZE, SIZE), jnp.float32)
    want, first_b = np.asarray(a[0], np.float64), np.asarray(b[0], np.float64)
    for _ in range(CHAIN):
        want = (want @ first_b) * SCALE
    report = {}
    for name, chain in arms().items():
        report[name] = measure(chain, a, b, want)
        print(name, report[name], flush=True)
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("matmul_chain_on_chip.py", lambda: main(sys.argv[1:])))
