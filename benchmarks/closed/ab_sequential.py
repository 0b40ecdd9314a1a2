"""Error rates and cost of the A/B that stops when settled (ab/sequential.py), by simulation through
the project's own scorer, on a normal model and on a recorded step series.

Each simulated run lays its steps out as `ab` does (the blocks order, turns drawn from a seed),
scores a look after every half-block with `sequential.look` exactly as the run loop does, stops at
the first settled look, and records the verdict and the scored steps per setting it spent. Runs:

    model    independent normal steps: 100 s, the given noise, the second setting 1 + effect
    series   a recorded run's scored steps (results.jsonl) in order: each simulated run takes a
             window of consecutive steps at a random start and lays the arms over it, so the
             real noise, drift and neighbour correlation of that machine are in every run; the
             arms are relabelled for the null, and the second setting's steps are shifted by the
             effect (a percent of the series' median) for the alternatives

A run finds an effect when its verdict is SLOWER (the second setting is the slower one), claims one
at no effect when it is FASTER or SLOWER. Beside it, the fixed design's verdict on the same steps:
the whole budget's arms scored once (`score.score`, `--stop budget`). The forecast the plan prints (sequential_forecast.py) is
written beside each model case. Usage (about 4 minutes on the 2-core machine):

    PYTHONPATH=. python benchmarks/closed/ab_sequential.py --runs 1000 \\
        --series benchmarks/results/2026-12-05-cpu-tiny-series.jsonl

Raw counts go to benchmarks/results/ab_sequential.json.

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/ab-sequential-half-block_simulated_2026-12-05.md.
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
from rl_trainer_bench.ab import sequential, sequential_forecast
from rl_trainer_bench.ab.score import FASTER, SLOWER, score
from rl_trainer_bench.ab.sequential import Looks
from rl_trainer_bench.bench.results_file import read_results

RESULTS = Path(__file__).resolve().parents[1] / "results" / "ab_sequential.json"
SETTINGS = ("off", "on")
EFFECTS = (0.0, 0.5, 1.0, 7.2)


def one_run(steps: np.ndarray, effect_s: float, blocks: int, turn: int, min_effect: float, seed):
    """One sequential A/B over `steps` (enough for the whole budget, in run order): its verdict
    and the scored steps per setting it spent, and the fixed design's verdict on the whole
    budget's arms (the same steps, judged once by `score.score`)."""
    order = run_orders.run_order(list(SETTINGS), run_orders.BLOCKS, blocks, seed)
    looks = Looks(2 * blocks)
    runs, seen, stopped = [], {}, None
    for index, setting in enumerate(order):
        times = steps[index * turn : (index + 1) * turn] + effect_s * (setting == "on")
        occurrence = seen[setting] = seen.get(setting, -1) + 1
        runs.append(arm(f"{setting}#{occurrence}", setting, [float(t) for t in times]))
        look = sequential.look(runs, looks, min_effect, "off") if stopped is None else None
        if look is not None and look.settled:
            stopped = look.deltas[0].verdict, look.units * turn
    fixed = score(runs, min_effect_pct=min_effect, baseline="off").deltas[0].verdict
    return (*stopped, fixed)


def tally(verdicts: list[tuple[str, int, str]]) -> dict:
    words = [v for v, _, _ in verdicts]
    spent = [s for _, s, _ in verdicts]
    fixed = [f for _, _, f in verdicts]
    return {
        "fixed_claimed": sum(w in (FASTER, SLOWER) for w in fixed),
        "fixed_no_effect": fixed.count("NO-EFFECT"),
        "runs": len(words),
        "claimed": sum(w in (FASTER, SLOWER) for w in words),
        "slower": words.count(SLOWER),
        "no_effect": words.count("NO-EFFECT"),
        "noisy": words.count("NOISY"),
        "mean_scored_per_setting": float(np.mean(spent)),
        "max_scored_per_setting": int(max(spent)),
    }


def model_case(rng, runs, noise_pct, blocks, turn, min_effect) -> dict:
    out = {}
    for effect in EFFECTS:
        verdicts = []
        for _ in range(runs):
            steps = 100.0 + rng.normal(0.0, noise_pct, 2 * 2 * blocks * turn)
            verdicts.append(
                one_run(steps, effect, blocks, turn, min_effect, int(rng.integers(2**32)))
            )
        predicted = sequential_forecast.forecast(
            Looks(2 * blocks), effect, noise_pct, turn, min_effect
        )
        out[f"{effect:g}%"] = {
            **tally(verdicts),
            "forecast_mean_scored_per_setting": predicted.mean_units * turn,
            "forecast_claimed": predicted.claimed,
        }
    return out


def series_case(rng, runs, path: Path, blocks, turn, min_effect) -> dict:
    steps = np.array([r.step_s for r in read_results(path) if not r.warmup])
    need = 2 * 2 * blocks * turn
    median = float(np.median(steps))
    out = {"steps": len(steps), "median_s": median}
    for effect in EFFECTS:
        verdicts = []
        for _ in range(runs):
            start = int(rng.integers(0, len(steps) - need + 1))
            window = steps[start : start + need]
            verdicts.append(
                one_run(
                    window,
                    effect / 100 * median,
                    blocks,
                    turn,
                    min_effect,
                    int(rng.integers(2**32)),
                )
            )
        out[f"{effect:g}%"] = tally(verdicts)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--series", type=Path, action="append", default=[])
    args = parser.parse_args()
    rng = np.random.default_rng(20261205)
    cases = {
        # the 397B slice: the accelerator's default budget (12 scored steps per setting, 1-step
        # turns), min effect 0.5%, at the same-pod noise and at twice it
        "model 0.15% noise": model_case(rng, args.runs, 0.15, 6, 1, 0.5),
        "model 0.3% noise": model_case(rng, args.runs, 0.3, 6, 1, 0.5),
        # a step noise of 0.017%, as a one-chip A/B's interval implied (BENCHMARKS.md)
        "model 0.017% noise": model_case(rng, args.runs, 0.017, 6, 1, 0.5),
    }
    for path in args.series:
        # the CPU's figures: 1-step and 3-step turns, min effect 2% (the CPU's default)
        for turn in (1, 3):
            cases[f"series {path.name}, {turn}-step turns"] = series_case(
                rng, args.runs, path, 6, turn, 2.0
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cases": cases}, indent=1)
        + "\n"
    )
    print(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
