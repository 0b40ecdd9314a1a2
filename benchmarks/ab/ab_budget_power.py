"""Power and false claims of the accelerator's default A/B design, by simulation through the
project's own scoring (ab/score.py), against the figure ab/resolution.py derives for it.

The seeds' case: two settings on a ~100 s step, the accelerator's default budget (12 scored steps
per setting: 6 blocks of 1-step turns, in the blocks order with turns drawn from a seed, min
effect 0.5%), and 2 warm-up steps per program set, once. Each simulated run draws its step times:
100 s, times 1 + the effect for the second setting, plus independent normal noise of the given
percent of the step, plus a drift linear in the run's steps (its total over the run given as a
percent of the step). The runs are scored by `score.score`, exactly as `ab` scores a pod's arms;
a run finds the effect when its verdict is SLOWER (the second setting is the slower one), and
claims one at no effect when its verdict is FASTER or SLOWER. At the smallest effect
resolution.py derives for each noise, the share found checks the derivation (90% by it). Usage (about 5 minutes on the 2-core machine):

    PYTHONPATH=. python benchmarks/ab/ab_budget_power.py --runs 500

Raw counts go to benchmarks/results/ab_budget_power.json.

Remakes BENCHMARKS.md's ab suite; benchmarks/reports/ab-budget-power_simulated_2026-12-04.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "ab"))
from ab_synthetic import arm

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import resolution
from rl_trainer_bench.ab.budget import ACCELERATOR, PLATFORMS
from rl_trainer_bench.ab.score import SLOWER, score

RESULTS = Path(__file__).resolve().parents[1] / "results" / "ab_budget_power.json"
STEP_S = 100.0
SETTINGS = ("off", "on")
WARMUPS = 2  # per program set, once (MaxText's engine)


def one_run(rng, effect_pct, noise_pct, drift_pct, blocks, turn, min_effect_pct, seed) -> str:
    """One simulated A/B scored by score.py: its verdict."""
    order = run_orders.run_order(list(SETTINGS), run_orders.BLOCKS, blocks, seed)
    steps = len(order) * turn
    drift = np.linspace(0.0, drift_pct / 100 * STEP_S, steps)
    noise = rng.normal(0.0, noise_pct / 100 * STEP_S, steps)
    seen: dict[str, int] = {}
    runs = []
    for index, setting in enumerate(order):
        mean = STEP_S * (1 + effect_pct / 100 * (setting == "on"))
        times = (
            mean
            + drift[index * turn : (index + 1) * turn]
            + noise[index * turn : (index + 1) * turn]
        )
        occurrence = seen.get(setting, 0)
        seen[setting] = occurrence + 1
        runs.append(
            arm(f"{setting}#{occurrence}", setting, [float(t) for t in times], warmup_s=STEP_S)
        )
    result = score(runs, min_effect_pct=min_effect_pct, baseline="off")
    return result.deltas[0].verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    platform = PLATFORMS[ACCELERATOR]
    turn = platform.turn_steps
    blocks = platform.budget.scored_steps // (2 * turn)
    min_effect = platform.min_effect_pct
    rng = np.random.default_rng(20261204)
    rows = []
    for noise in (0.1, 0.15, 0.2, 0.3):
        for drift in (0.0, 1.0):
            found = sum(
                one_run(rng, 1.0, noise, drift, blocks, turn, min_effect, int(rng.integers(2**32)))
                == SLOWER
                for _ in range(args.runs)
            )
            smallest = resolution.smallest_effect(noise, blocks, turn, min_effect)
            at_smallest = sum(
                one_run(
                    rng, smallest, noise, drift, blocks, turn, min_effect, int(rng.integers(2**32))
                )
                == SLOWER
                for _ in range(args.runs)
            )
            null = [
                one_run(rng, 0.0, noise, drift, blocks, turn, min_effect, int(rng.integers(2**32)))
                for _ in range(args.runs)
            ]
            claimed = sum(verdict in ("FASTER", SLOWER) for verdict in null)
            row = {
                "noise_pct": noise,
                "drift_pct_over_run": drift,
                "runs": args.runs,
                "found_1pct": found,
                "claimed_at_0pct": claimed,
                "derived_power_1pct": resolution.claim_rate(1.0, noise, blocks, turn, min_effect),
                "derived_smallest_effect_pct": smallest,
                "found_at_derived_smallest": at_smallest,
            }
            rows.append(row)
            print(
                f"noise {noise:.2f}% drift {drift:.1f}%/run: found a 1% effect in {found}/{args.runs}"
                f" (derived {row['derived_power_1pct']:.4f}), claimed one at 0% in"
                f" {claimed}/{args.runs}; the derived smallest resolved effect {smallest:.3f}% found in"
                f" {at_smallest}/{args.runs} (derived {resolution.RESOLVED:.0%})",
                flush=True,
            )
    steps = len(SETTINGS) * 2 * blocks * turn
    print(
        f"steps per run: {steps} scored ({steps // 2} per setting) + {WARMUPS} warm-up = {steps + WARMUPS}"
    )
    design = {
        "blocks": blocks,
        "turn_steps": turn,
        "min_effect_pct": min_effect,
        "warmups": WARMUPS,
    }
    RESULTS.write_text(json.dumps({"design": design, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
