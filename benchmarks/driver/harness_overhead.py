"""Harness overhead: the bench's scored step time against a bare loop over the same compiled programs.

The bench adds a worker layer, trace annotations, the device-timeline watcher thread, per-step
records and a flushed JSON line to every step. This script runs the bench and a bare loop (the
engine's `fwd_bwd` x MICRO_STEPS, `update`, `get_metrics`, nothing else) on one engine, the same
micro-batches in the same order, alternating rounds so drift on a shared machine hits both alike,
and prints the medians, the overhead, and the overhead per round with a 95% bootstrap interval
over rounds (on a shared machine the interval, not the point figure, says what can be claimed).
Usage:

    PYTHONPATH=. python benchmarks/driver/harness_overhead.py --preset cpu-tiny --steps 10 --rounds 20

`--engine matmul` swaps the JAX MoE engine for a one-program engine (a jitted n x n matmul chain per
micro-batch) so the harness's fixed per-step cost can be measured apart from any model: the bench
adds the same host work per step whatever the engine runs.

Remakes BENCHMARKS.md's driver suite; benchmarks/reports/harness-overhead_cpu_2026-11-30.md.
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
        batches = [entry.payload for entry in bench.pool.for_step(step)]
        started = time.perf_counter()
        for batch in batches:
            engine.fwd_bwd(batch)
        engine.update()
        engine.get_metrics(clear_cache=True)
        if step:
            times.append(time.perf_counter() - started)
    return times


def bench_loop(bench: Bench, steps: int, results: Path) -> list[float]:
    """Scored step seconds of one bench arm (staging off), as the driver records them."""
    result = bench.run(steps=steps, stage=StageConfig(), results_path=results)
    return [r.step_s for r in result.records if not r.warmup]


def alternated_rounds(
    bench: Bench, steps: int, rounds: int
) -> list[tuple[list[float], list[float]]]:
    """(bench step seconds, bare step seconds) per round; the order flips every round, so a drift
    of the machine's speed within a round hits both loops alike."""
    out = []
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "results.jsonl"
        for index in range(rounds):
            if index % 2:
                bare = bare_loop(bench, steps)
                timed = bench_loop(bench, steps, results)
            else:
                timed = bench_loop(bench, steps, results)
                bare = bare_loop(bench, steps)
            out.append((timed, bare))
    return out


def overhead_spread(rounds: list[tuple[list[float], list[float]]], seed: int = 0) -> dict:
    """The overhead per round (bench median / bare median - 1), its median and a 95% bootstrap
    interval over rounds: what the figure is, and how far the noise lets it be trusted."""
    per_round = np.array([statistics.median(b) / statistics.median(a) - 1 for b, a in rounds])
    rng = np.random.default_rng(seed)
    resampled = np.median(rng.choice(per_round, size=(4000, len(per_round))), axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return {
        "overhead_per_round": [round(float(x), 5) for x in per_round],
        "overhead_median_of_rounds": float(np.median(per_round)),
        "overhead_ci95": [float(low), float(high)],
        "overhead_pooled_ci95": pooled_interval(rounds, rng),
    }


def pooled_interval(rounds: list[tuple[list[float], list[float]]], rng) -> list[float]:
    """A 95% interval of the pooled overhead (median of every bench step over median of every bare
    step, minus 1), resampling whole rounds: a round's steps share the machine's state, so the round
    is the unit of independence. It uses every step, so it is tighter than the median of per-round
    ratios, each of which rests on one round's few steps."""
    bench = [np.asarray(timed) for timed, _ in rounds]
    bare = [np.asarray(plain) for _, plain in rounds]
    figures = []
    for _ in range(2000):
        chosen = rng.integers(0, len(rounds), len(rounds))
        timed = np.concatenate([bench[i] for i in chosen])
        plain = np.concatenate([bare[i] for i in chosen])
        figures.append(np.median(timed) / np.median(plain) - 1.0)
    low, high = np.percentile(figures, [2.5, 97.5])
    return [float(low), float(high)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-tiny")
    parser.add_argument("--steps", type=int, default=10, help="scored steps per round and loop")
    parser.add_argument("--rounds", type=int, default=20, help="bench/bare alternations")
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
    rounds = alternated_rounds(bench, args.steps, args.rounds)
    bench.close()
    bench_s = [t for timed, _ in rounds for t in timed]
    bare_s = [t for _, bare in rounds for t in bare]
    bench_median, bare_median = statistics.median(bench_s), statistics.median(bare_s)
    summary = {
        "preset": args.preset,
        "engine": args.engine if args.engine == "jax" else f"matmul {args.matmul_size}",
        "rounds": args.rounds,
        "steps": len(bench_s),
        "compile_s": compile_s,
        "bench_step_s_median": bench_median,
        "bench_step_s_range": [min(bench_s), max(bench_s)],
        "bare_step_s_median": bare_median,
        "bare_step_s_range": [min(bare_s), max(bare_s)],
        "overhead": bench_median / bare_median - 1.0,
        **overhead_spread(rounds),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
