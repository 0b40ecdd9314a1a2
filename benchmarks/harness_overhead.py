"""Harness overhead: the bench's scored step time against a bare loop over the same compiled programs.

The bench adds a worker layer, trace annotations, the device-timeline watcher thread, per-step
records and a flushed JSON line to every step. This script runs the bench and a bare loop (the
engine's `fwd_bwd` x MICRO_STEPS, `update`, `get_metrics`, nothing else) on one engine, the same
micro-batches in the same order, alternating rounds so drift on a shared machine hits both alike,
and prints the medians and the overhead. Usage:

    PYTHONPATH=. python benchmarks/harness_overhead.py --preset cpu-tiny --steps 10 --rounds 3

`--engine matmul` swaps the JAX MoE engine for a one-program engine (a jitted n x n matmul chain per
micro-batch) so the harness's fixed per-step cost can be measured apart from any model: the bench
adds the same host work per step whatever the engine runs.
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

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.bench.distributed import initialize_runtime
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.engine.contract import Payload


class MatmulEngine:
    """The smallest real engine: one jitted program per fwd_bwd, one per update, on device 0."""

    def __init__(self, size: int):
        self.weights = jnp.eye(size, dtype=jnp.float32)
        self.gradient = jnp.zeros_like(self.weights)
        self._train_step = 0
        self._last: jax.Array = self.weights
        self._fwd_bwd = jax.jit(lambda w, g, x: g + jnp.tanh(x @ w @ w) @ w)
        self._update = jax.jit(lambda w, g: (w - 1e-6 * g, jnp.zeros_like(g), jnp.linalg.norm(g)))

    @property
    def train_step(self) -> int:
        return self._train_step

    def compile(self, example: Payload) -> dict[str, float]:
        started = time.perf_counter()
        self.fwd_bwd(example)
        self.update()
        self.get_metrics()
        return {"matmul_fwd_bwd+update": time.perf_counter() - started}

    def fwd_bwd(self, batch: Payload) -> None:
        size = self.weights.shape[0]
        x = jnp.asarray(np.resize(batch.advantages, (size, size)))
        self.gradient = self._last = self._fwd_bwd(self.weights, self.gradient, x)

    def update(self) -> int:
        self.weights, self.gradient, self._norm = self._update(self.weights, self.gradient)
        self._last = self.weights
        self._train_step += 1
        return self._train_step

    def get_metrics(self, clear_cache: bool = True) -> dict[str, float]:
        norm = float(self._norm)
        return {"loss": norm, "grad_norm": norm, "loss_denominator": 1.0}

    def completion_marker(self) -> jax.Array:
        return self._last


def matmul_pool(count: int, size: int) -> list[Payload]:
    rng = np.random.default_rng(0)
    pool = []
    for i in range(count):
        rows = np.ones((size, size), np.int32)
        values = rng.standard_normal((size, size)).astype(np.float32)
        arrays = dict(
            input_ids=rows,
            segment_ids=rows,
            positions=rows,
            completion_mask=rows,
            advantages=values,
            old_logps=values,
        )
        pool.append(Payload(**arrays, name=f"matmul_{i}", digests={"advantages": str(i)}))
    return pool


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
    parser.add_argument("--engine", choices=("jax", "matmul"), default="jax")
    parser.add_argument("--matmul-size", type=int, default=512)
    args = parser.parse_args()
    config = BenchConfig.from_env({"PRESET": args.preset, "STEPS": str(args.steps)})
    print(initialize_runtime(os.environ, config.preset.host_devices), file=sys.stderr)
    if args.engine == "matmul":
        size = args.matmul_size
        bench = Bench(
            config,
            log=lambda line: None,
            engine_factory=lambda _: MatmulEngine(size),
            pool=matmul_pool(config.distinct_micro_batches, size),
        )
    else:
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
        "engine": args.engine if args.engine == "jax" else f"matmul {args.matmul_size}",
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
