"""MFU of a run's scored steps, recounted from its results.jsonl by the built-in engine's count.

A run whose engine counted no FLOPs (MaxText's adapter before it counted them) has step times and
micro-batch names but no MFU. The pool is a function of the preset, the engine flags and the
seed, so this rebuilds it on the CPU, counts each micro-batch's model FLOPs of real tokens
(engine/builtin/flops.py, docs/engine.md) and divides each scored step's by its time and the
chip's peak. Micro-batch k of the run (counted over all its steps, warm-up included) is the
pool's k mod DISTINCT_MICRO_BATCHES, as the driver draws them.

    PYTHONPATH=. python benchmarks/chip/mfu_from_results.py --preset tpu-v5e-1 \\
        --engine-flags train_micro_batch_size=1 --chip "TPU v5 lite" RESULTS.jsonl

Remakes MaxText's MFU on the chip before its adapter counted FLOPs (BENCHMARKS.md, chip suite);
benchmarks/reports/chip-round-3_tpu-v5e_2026-12-06.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rl_trainer_bench.bench.plan import resolve
from rl_trainer_bench.bench.results_file import read_results
from rl_trainer_bench.bench.step_record import StepRecord
from rl_trainer_bench.chips.accelerators import chip_for_device_kind
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.engine.builtin import flops
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.payload import build as payload
from rl_trainer_bench.payload import routing_profile


def scored_records(path: Path) -> list[StepRecord]:
    """The run's records, warm-up included; one-line UserError for a file that holds no run's
    scored steps (binary, empty, another file's JSON)."""
    read_user_text(str(path), "RESULTS")  # a missing, special or binary file refused in its words
    try:
        records = read_results(path)
    except (KeyError, TypeError, ValueError):
        records = []
    if not any(not r.warmup and r.step_s > 0 and r.micro_batches for r in records):
        raise UserError(f"RESULTS {path}: no scored step in it; give a run's results.jsonl")
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--engine-flags", default="")
    parser.add_argument("--chip", required=True, help="the device kind, as JAX names it")
    args = parser.parse_args()
    chip = chip_for_device_kind(args.chip)
    if chip is None:
        raise UserError(f"--chip {args.chip!r}: no chip of that kind; give one as JAX names it")
    records = scored_records(args.results)
    env = {"PRESET": args.preset, "ENGINE_FLAGS": args.engine_flags}
    config = BenchConfig.from_env({k: v for k, v in env.items() if v})
    engine_config = resolve(config, rendering=True).engine
    profile = routing_profile.load_profile(config.routing_profile, config.preset.routing_profile)
    pool = [
        payload.build_calibrated(engine_config, profile, seed=config.seed, index=index).payload
        for index in range(config.distinct_micro_batches)
    ]
    per_batch = [flops.micro_batch_flops(engine_config, p.segment_ids, False) for p in pool]
    peak = chip.per_device(chip.peak_bf16_flops) * engine_config.mesh.size
    drawn, rows = 0, []
    for record in records:
        count = len(record.micro_batches)
        step_flops = sum(per_batch[(drawn + k) % len(pool)] for k in range(count))
        drawn += count
        if not record.warmup and record.step_s > 0:
            rows.append((record.step, record.step_s, step_flops / record.step_s / peak))
    for step, seconds, mfu in rows:
        print(f"step {step}: {seconds:.4f} s, MFU {100 * mfu:.2f}%")
    print(f"median MFU {100 * statistics.median(m for *_, m in rows):.2f}% over {len(rows)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("mfu_from_results.py", main))
