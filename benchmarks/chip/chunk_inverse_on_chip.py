"""The chunked gated delta rule's triangular inverse on a TPU chip: XLA's batched matmuls against
the Pallas kernel (`linear_chunk_inverse`), time and error, at a micro-batch's count of systems.

Why: the step's profile charges `unit_lower_solve` with about 143 ms of a 1.97 s step on tpu-v5e-1
(BENCHMARKS.md); this times the inverse alone, so the kernel's share of a step change is its own.
Each method is jitted over the same systems (`rule_systems`: the rule's A without decay) and timed over
`chip_timing.REPEATS` calls after a warm-up, median per call; the error is the largest absolute difference from
NumPy's float64 inverse. The gradient (the same XLA rule for both) is left out.

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/chunk_inverse_on_chip.py --output inverse.json

Remakes BENCHMARKS.md's row "What the preset's kernel and keys bought on the chip" (the kernel
alone); benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md.
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
from chip_timing import positive, timed

from rl_trainer_bench.engine.builtin.unit_lower_inverse import unit_lower_inverse
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import check_output_file, write_text_atomically


def rule_systems(count: int, size: int, key_dim: int = 128) -> np.ndarray:
    """A_ti = beta_t k_t . k_i below the diagonal, unit keys of `key_dim` at random and beta in
    (0, 1): the rule's systems where nothing decays (decay only shrinks the entries)."""
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(count, size, key_dim))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    beta = rng.uniform(0, 1, (count, size, 1))
    return np.tril(beta * keys @ np.swapaxes(keys, -1, -2), -1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=positive, default=4096, help="systems a call (4,096)")
    parser.add_argument("--size", type=positive, default=64, help="C, the chunk size")
    parser.add_argument("--output", type=Path, required=True, help="the JSON report")
    args = parser.parse_args(argv)
    check_output_file(args.output, "--output")  # before any chip time
    if jax.default_backend() != "tpu":
        raise UserError("needs a TPU chip this process can open: the kernel runs only there")
    strict = rule_systems(args.count, args.size)
    reference = np.linalg.inv(np.eye(args.size) + strict)
    device_strict = jnp.asarray(strict, jnp.float32)
    report = {"device": jax.devices()[0].device_kind, "count": args.count, "size": args.size}
    for method in ("xla", "pallas"):
        fn = jax.jit(lambda a, method=method: unit_lower_inverse(a, method))
        seconds = timed(fn, device_strict)
        error = float(np.abs(np.asarray(fn(device_strict), np.float64) - reference).max())
        report[method] = {"median_ms": statistics.median(seconds) * 1e3, "max_abs_error": error}
        print(f"{method}: {report[method]['median_ms']:.3f} ms a call, max |error| {error:.2e}")
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("chunk_inverse_on_chip.py", lambda: main(sys.argv[1:])))
