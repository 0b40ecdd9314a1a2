"""Render time and manifest size for the real launch renders in ../shared/reference/launch-renders.

Usage: PYTHONPATH=. python benchmarks/render_time.py [REPEATS]
Prints, per input, the median and range of wall-clock render time (read, render, validate, dump;
the schema is compiled once before timing, as in a long-lived process) and the manifest's size.
"""

import statistics
import sys
import time
from pathlib import Path

from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render
from rl_trainer_bench.launch.validate import schema_validator

INPUTS = ("tunix-gsm8k-start.yaml", "tunix-mlperf-397b-256-v5p-trainer.stdout.txt")


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    folder = next(
        (
            p / "shared/reference/launch-renders"
            for p in Path(__file__).resolve().parents
            if (p / "shared/reference/launch-renders").is_dir()
        ),
        Path("../shared/reference/launch-renders"),
    )
    start = time.perf_counter()
    schema_validator()
    print(f"schema compile: {time.perf_counter() - start:.3f} s")
    for name in INPUTS:
        text = (folder / name).read_text()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            manifest = render(text, name, RenderKnobs())
            seconds.append(time.perf_counter() - start)
        print(
            f"{name}: median {statistics.median(seconds) * 1e3:.1f} ms "
            f"(min {min(seconds) * 1e3:.1f}, max {max(seconds) * 1e3:.1f}, n={repeats}), "
            f"manifest {len(manifest.encode())} bytes"
        )


if __name__ == "__main__":
    main()
