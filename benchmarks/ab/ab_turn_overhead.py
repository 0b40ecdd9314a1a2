"""What a same-process A/B spends besides its scored steps: set-up before the compile, and the
harness's time between two turns.

Runs the real `ab` command (its parser, plan, benches, turns, looks and report files) with each
Bench timed from outside: when `build` (the micro-batch pool, the engine and its training state)
and `compile` start and end, and when each turn's `run` starts and ends. A turn's overhead is the
wall time from its start to the next turn's start (or to its own end, for the last) minus its
steps' own clocks (`step_s`): everything the harness does around the steps, the staging lead-in,
the parameter digest, the results lines, the log, the sequential look.

Usage (any `ab` flag may follow; the defaults time a short cpu-tiny A/B):

    PYTHONPATH=. python benchmarks/ab/ab_turn_overhead.py --out /tmp/ab-overhead -- --budget 6 --steps 1

On a chip, the same with its preset (`-- --preset tpu-v5e-1`). It prints one line per figure and
a JSON line with every turn's overhead.

Remakes BENCHMARKS.md's row "The main job on one v5e chip" (README's `ab` timed from outside);
benchmarks/reports/ab-turn-overhead_cpu-v5e_2026-12-06.md,
benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.cli import build_parser


class Timings:
    """Stamps (perf_counter seconds) of every Bench's set-up and of every turn."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.builds: list[tuple[float, float]] = []
        self.compiles: list[tuple[float, float]] = []
        self.turns: list[dict[str, Any]] = []

    def factory(self, plan: Any, log: Any) -> Any:
        """The driver's Bench of one arm's plan, its set-up and turns stamped here."""
        from rl_trainer_bench.bench.driver import Bench  # imports JAX, after the runtime started

        timings = self

        class TimedBench(Bench):
            def build(self, *args: Any, **kwargs: Any) -> None:
                start = time.perf_counter()
                super().build(*args, **kwargs)
                timings.builds.append((start, time.perf_counter()))

            def compile(self) -> dict[str, float]:
                start = time.perf_counter()
                seconds = super().compile()
                timings.compiles.append((start, time.perf_counter()))
                return seconds

            def run(self, **kwargs: Any) -> Any:
                start = time.perf_counter()
                result = super().run(**kwargs)
                steps = [r.step_s for r in result.records if not r.warmup]
                warm = sum(r.step_s for r in result.records if r.warmup)
                timings.turns.append(
                    {
                        "arm": kwargs.get("arm", ""),
                        "start": start,
                        "end": time.perf_counter(),
                        "step_s": steps,
                        "warmup_step_s": warm,
                    }
                )
                return result

        return TimedBench(plan.config, log, engine_config=plan.engine)

    def summary(self) -> dict[str, Any]:
        scored = [t for t in self.turns if t["step_s"]]
        overheads = []
        for index, turn in enumerate(scored):
            until = scored[index + 1]["start"] if index + 1 < len(scored) else turn["end"]
            overheads.append(until - turn["start"] - sum(turn["step_s"]))
        steps = [s for t in scored for s in t["step_s"]]
        step = statistics.median(steps) if steps else float("nan")
        first_compile = self.compiles[0][0] if self.compiles else float("nan")
        return {
            "setup_before_compile_s": sum(end - start for start, end in self.builds),
            "command_start_to_compile_s": first_compile - self.started,
            "compile_s": sum(end - start for start, end in self.compiles),
            "turns": len(scored),
            "median_step_s": step,
            "turn_overhead_s": overheads,
            "turn_overhead_median_s": statistics.median(overheads) if overheads else None,
            "turn_overhead_max_s": max(overheads) if overheads else None,
            "turn_overhead_median_of_step": statistics.median(overheads) / step
            if overheads
            else None,
            "wall_s": time.perf_counter() - self.started,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the A/B's --out folder")
    parser.add_argument("ab_flags", nargs="*", help="flags for `ab`, after --")
    args = parser.parse_args()
    timings = Timings()
    ab_args = build_parser(["ab"]).parse_args(["ab", "--out", str(args.out), *args.ab_flags])
    code = ab_command.run(ab_args, make_bench=timings.factory)
    figures = timings.summary()
    share = figures["turn_overhead_median_of_step"]
    print(f"set-up before compile (pool, engine, state): {figures['setup_before_compile_s']:.2f} s")
    print(f"command start to compile: {figures['command_start_to_compile_s']:.2f} s")
    print(f"compile: {figures['compile_s']:.2f} s")
    if share is not None:
        print(
            f"per-turn overhead: median {figures['turn_overhead_median_s'] * 1e3:.1f} ms"
            f" ({share:.1%} of the median step {figures['median_step_s'] * 1e3:.1f} ms),"
            f" max {figures['turn_overhead_max_s'] * 1e3:.1f} ms over {figures['turns']} turns"
        )
    print(f"wall: {figures['wall_s']:.1f} s; ab exit code {code}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
