"""What the one-kernel chip benchmarks share: their arguments (`--preset`, `--output` and counts),
their opening (the output file and the chip checked first) and a call's time on the chip.

Each times a jitted function alone (a kernel against its alternatives) so a change in the step's
profile can be split into its parts; all time the same way, so their figures compare.

Shared by chunk_inverse_on_chip.py, gmm_tiling_on_chip.py, delta_rule_kernel_on_chip.py and
conv_kernel_on_chip.py (the last two also time a function with its gradient), whose figures are in
benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md and
benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md (BENCHMARKS.md, chip suite), and by the
closed probe benchmarks/closed/pair_row_gather_on_chip.py
(benchmarks/reports/chip-round-10_tpu-v5e_2026-12-07.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_output_file

REPEATS = 20


def chip_parser(doc: str) -> argparse.ArgumentParser:
    """A one-kernel benchmark's arguments: the cell's shapes (`--preset`) and the JSON report
    (`--output`), described by the first paragraph of the script's `doc`; a script adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--preset", default="tpu-v5e-1", help="the cell's shapes (tpu-v5e-1)")
    parser.add_argument("--output", type=Path, required=True, help="the JSON report")
    return parser


def preset_on_the_chip(name: str, output: Path):
    """The preset's engine config, once `output` is a file the report can go to and this process
    has a TPU chip: either refused in one line (UserError) before any chip time."""
    check_output_file(output, "--output")
    if jax.default_backend() != "tpu":
        raise UserError("needs a TPU chip this process can open: the kernels run only there")
    return preset(name).engine


def timed(fn, *args) -> list[float]:
    """Seconds per call of `fn(*args)`, each call waited for, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def forward_and_gradient(fn, inputs, weights, calls_a_step: int) -> tuple[dict, list]:
    """`fn(*inputs)` timed alone and with the gradient of every input through a weighted sum of
    its output by `weights`: ({forward_ms, forward_and_backward_ms, step_ms_inferred (`calls_a_step`
    x the two: a layer's forward, then its rematerialized forward and backward)}, [out, each
    input's gradient] in float32)."""

    def loss(*x):
        out = fn(*x)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    both = jax.jit(jax.value_and_grad(loss, argnums=range(len(inputs)), has_aux=True))
    forward_ms = statistics.median(timed(jax.jit(fn), *inputs)) * 1e3
    both_ms = statistics.median(timed(both, *inputs)) * 1e3
    (_, out), grads = both(*inputs)
    arm = {
        "forward_ms": forward_ms,
        "forward_and_backward_ms": both_ms,
        "step_ms_inferred": calls_a_step * (forward_ms + both_ms),
    }
    return arm, [np.asarray(a, np.float32) for a in (out, *grads)]


def timing_words(arm: dict, calls_a_step: int) -> str:
    """`forward_and_gradient`'s times as a line says them."""
    return (
        f"forward {arm['forward_ms']:.2f} ms, forward and backward"
        f" {arm['forward_and_backward_ms']:.2f} ms a call; a step's share, INFERRED"
        f" ({calls_a_step} x the two): {arm['step_ms_inferred']:.1f} ms"
    )


def positive(text: str) -> int:
    """An argument that counts something: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value
