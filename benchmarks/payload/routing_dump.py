"""How long `profile-routing` takes to read a routed-experts dump, and what its checks cost.

Writes a dump of random distinct top-k experts (int16, BTLK) to a temporary .npy, then times, on
the memory-mapped file as the command reads it: the per-row counting alone (`np.bincount` over
each row, what the command did before it checked for repeated experts) and the whole extraction
(`profile_from_dump`: range checks, counts with the per-token repeat check, the padding layout).
Each figure is the best of `--repeats` runs, so the page cache holds the file after the first.

Usage: PYTHONPATH=. python benchmarks/payload/routing_dump.py [--rows 4] [--tokens 16384] [--layers 60]
       [--top-k 10] [--experts 512] [--repeats 3]

Remakes BENCHMARKS.md's payload suite; benchmarks/reports/reliability_cpu_2026-12-03.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from rl_trainer_bench.payload.routing_dump import profile_from_dump


def random_dump(rows: int, tokens: int, layers: int, top_k: int, experts: int) -> np.ndarray:
    """Distinct experts per token and layer: one random set of `top_k` experts, rotated by a random
    offset per token and layer (a rotation keeps them distinct), generated row by row."""
    rng = np.random.default_rng(0)
    chosen = rng.permutation(experts)[:top_k]
    dump = np.empty((rows, tokens, layers, top_k), np.int16)
    for row in range(rows):
        offsets = rng.integers(0, experts, (tokens, layers, 1))
        dump[row] = (offsets + chosen) % experts
    return dump


def counting_only(dump: np.ndarray, experts: int) -> None:
    """The count the command made before the repeat check: one bincount per row."""
    layers = dump.shape[2]
    offsets = (np.arange(layers) * experts)[:, None]
    for row in dump:
        per_layer = np.moveaxis(np.asarray(row), 1, 0).reshape(layers, -1).astype(np.int64)
        np.bincount((per_layer + offsets)[per_layer >= 0], minlength=layers * experts)


def best_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("rows", 4), ("tokens", 16384), ("layers", 60), ("top-k", 10)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dump = random_dump(args.rows, args.tokens, args.layers, args.top_k, args.experts)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dump.npy"
        np.save(path, dump)
        mapped = np.load(path, mmap_mode="r")
        counting = best_seconds(lambda: counting_only(mapped, args.experts), args.repeats)
        whole = best_seconds(
            lambda: profile_from_dump(mapped, num_experts=args.experts), args.repeats
        )
    print(
        json.dumps(
            {
                "shape": list(dump.shape),
                "megabytes": round(dump.nbytes / 1e6, 1),
                "counting_only_s": round(counting, 3),
                "profile_from_dump_s": round(whole, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
