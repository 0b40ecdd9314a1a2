"""Harness overhead: the bench's scored step time against a bare loop over the same compiled programs.

The bench adds a worker layer, trace annotations, the device-timeline watcher thread, per-step
records and a flushed JSON line to every step. This script runs the bench and a bare loop (the
engine's `fwd_bwd` x MICRO_STEPS, `update`, `get_metrics`, nothing else) on one engine, the same
micro-batches in the same order, alternating rounds so drift on a shared machine hits both alike,
and prints the medians and the overhead. Usage:

    PYTHONPATH=. python benchmarks/harness_overhead.py --preset cpu-tiny --steps 10 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rl_trainer_bench.config import BenchConfig, StageConfig
from rl_trainer_bench.distributed import initialize_runtime
from rl_trainer_bench.driver import Bench


def bare_loop(bench: Bench, steps: int) -> list[float]:
    """Step seconds of the plain trainer loop on the bench's engine and micro-batches."""
    engine, times = bench.engine, []
    for step in range(steps + 1):  # step 0 matches the bench's warm-up
        batches = [bench.micro_batch(step, i).payload for i in range(bench.micro_steps)]
        started = time.perf_counter()
        for batch in batches:
            engine.fwd_bwd(batch)
        engine.update()
        engine.get_metrics(clear_cache=True)
        if step:
            times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-tiny")
    parser.add_argument("--steps", type=int, default=10, help="scored steps per round and loop")
    parser.add_argument("--rounds", type=int, default=3, help="bench/bare alternations")
    args = parser.parse_args()
    config = BenchConfig.from_env({"PRESET": args.preset, "STEPS": str(args.steps)})
    print(initialize_runtime(os.environ, config.preset.host_devices), file=sys.stderr)
    bench = Bench(config, log=lambda line: None)
    compile_s = bench.setup()
    bench_s, bare_s = [], []
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            result = bench.run(
                steps=args.steps,
                stage=StageConfig(),
                results_path=Path(folder) / f"round{round_index}.jsonl",
            )
            bench_s += [r.step_s for r in result.records if not r.warmup]
            bare_s += bare_loop(bench, args.steps)
    bench.close()
    bench_median, bare_median = statistics.median(bench_s), statistics.median(bare_s)
    summary = {
        "preset": args.preset,
        "steps": len(bench_s),
        "compile_s": compile_s,
        "bench_step_s_median": bench_median,
        "bench_step_s_range": [min(bench_s), max(bench_s)],
        "bare_step_s_median": bare_median,
        "bare_step_s_range": [min(bare_s), max(bare_s)],
        "overhead": bench_median / bare_median - 1.0,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
