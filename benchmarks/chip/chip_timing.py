"""What the one-kernel chip benchmarks share: a call's time on the chip, and their count arguments.

Each times a jitted function alone (a kernel against its alternatives) so a change in the step's
profile can be split into its parts; both benchmarks time the same way, so their figures compare.

Shared by chunk_inverse_on_chip.py and gmm_tiling_on_chip.py, whose figures are in
benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md and
benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md (BENCHMARKS.md, chip suite).
"""

from __future__ import annotations

import argparse
import time

import jax

REPEATS = 20


def timed(fn, *args) -> list[float]:
    """Seconds per call of `fn(*args)`, each call waited for, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def positive(text: str) -> int:
    """An argument that counts something: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value
