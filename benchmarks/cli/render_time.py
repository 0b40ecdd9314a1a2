"""Render time and manifest size for the real launch renders in ../shared/reference/launch-renders.

Usage: PYTHONPATH=. python benchmarks/cli/render_time.py [REPEATS]
Prints, per input, the median and range of wall-clock render time (read, render, validate, dump;
the schema is compiled once before timing, as in a long-lived process), the manifest's size, the
bytes of annotations once `kubectl apply` stores it (the API server's limit is 262,144) and the
size of the resolved plan embedded in it; then the same for a same-pod A/B render of the built-in
engine (two arms), the largest manifest the renderer makes of these inputs.

Remakes BENCHMARKS.md's row "Render speed and size"; benchmarks/reports/render_cpu_2026-12-05.md.
"""

import statistics
import sys
import time
from pathlib import Path

import yaml

from rl_trainer_bench.ab.render_command import plan_for_render
from rl_trainer_bench.launch.apply_size import stored_annotation_bytes
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan
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
    # The gsm8k trainer's 1.7B model has no preset: the 30B cell's shapes, at its lengths.
    gsm8k = {
        "driver_env": "PRESET=qwen3-30b-a3b-cell",
        "engine_flags": "train_micro_batch_size=8 compute_logps_chunk_size=128",
    }
    cases = [(INPUTS[0], RenderKnobs.from_strings(gsm8k)), (INPUTS[1], RenderKnobs())]
    cases.append((INPUTS[1], RenderKnobs.from_strings({"engine": "builtin", "ab_arms": "off,on"})))
    for name, knobs in cases:
        text = (folder / name).read_text()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = render_with_plan(text, name, knobs, plan_for_render)
            seconds.append(time.perf_counter() - start)
        stored = stored_annotation_bytes(yaml.safe_load(result.yaml))
        label = name + (
            f" (ENGINE={knobs.passed('ENGINE')}, AB_ARMS={knobs.ab_arms})" if knobs.ab_arms else ""
        )
        print(
            f"{label}: median {statistics.median(seconds) * 1e3:.1f} ms "
            f"(min {min(seconds) * 1e3:.1f}, max {max(seconds) * 1e3:.1f}, n={repeats}), "
            f"manifest {len(result.yaml.encode())} bytes, {stored} bytes of annotations once"
            f" kubectl apply stores it, resolved plan {len(result.document.to_json().encode())}"
            " bytes before xz"
        )


if __name__ == "__main__":
    main()
