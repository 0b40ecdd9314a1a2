"""The sequential A/B's false claims and stopping times on a measured step series, by bootstrapping
its residuals (ab/sequential.py, ab/robust_fit.py, ab/sequential_forecast.py).

The plan's forecast assumes independent normal steps. A machine's steps are not: a host hiccup, a
garbage collection, a slow tail. This script takes a series the way `ab` writes it and asks what
the design does on *that* noise:

    1. the series' scored steps in run order are fitted by the run's own robust fit (a level, one
       effect per other setting, a linear drift); its residuals, the strays included, are the noise
    2. each simulated run draws the blocks order from its own schedule seed, as `ab` does, and its
       steps are the fitted level plus the effect under test (0, then each --effects percent of the
       median step, on the second setting) plus residuals drawn with replacement from step 1
    3. every look is fitted and judged by the run's rule (`sequential_forecast.stops`, which the
       tests hold to the scorer's verdicts), at the design's budget (--budget scored steps per
       setting, 1-step turns) and min effect

and prints, per effect, the share of runs that claim an effect (at 0: the false-positive rate, with
its 95% Clopper-Pearson-free Wilson interval), say NO-EFFECT or stay NOISY, and the scored steps per
setting spent (mean, and the share stopped by each look). With --metric first_call_extra_s the
first call's extra after the boundary is simulated instead of the step (min effect: a tenth of the
series' median of it, as the run judges it).

With --windows, `ab.json`'s arms are also cut into consecutive windows of --budget half-blocks
and each is scored by the run's own rule (`sequential.score`: the step's verdict, the boundary's,
where it stopped): one long run of 1-step turns on a chip read as several runs of the default
design, each with its verdict.

Input: `ab`'s `ab.json` (every arm's records, in run order, with its setting), or a
`results.jsonl` / `armN-SETTING.jsonl` of one series (one setting: level and drift only). Usage:

    PYTHONPATH=. python benchmarks/ab/ab_sequential_series.py ab-20261206-101500/ab.json
    PYTHONPATH=. python benchmarks/ab/ab_sequential_series.py --synthetic-chip   # the issue's figures

`--synthetic-chip` stands in for a chip series until one is measured: 24 steps of 2058 ms with 0.2%
normal noise (seeded) and one stray step of 2155 ms, the chip's `on#6`. `--normal-noise PCT` draws
independent normal steps of 2.058 s at that noise (the plan's model; with `--min-effect 0` only the
interval guards a claim). Raw figures go to benchmarks/results/ab_sequential_series-<name>.json.

Remakes BENCHMARKS.md's row "The A/B's false claims over all looks";
benchmarks/reports/ab-sequential-per-step_simulated_2026-12-06.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import robust_fit, sequential, sequential_forecast
from rl_trainer_bench.ab.sequential import BOUNDARY_MIN_EFFECT, Looks
from rl_trainer_bench.bench.results_file import read_results
from rl_trainer_bench.bench.step_record import ArmRun, StepRecord

RESULTS = Path(__file__).resolve().parents[1] / "results"
SETTINGS = ("A", "B")


def series_of(path: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The scored steps' `metric` in run order and each step's setting index (0: the first)."""
    if not path.is_file():
        sys.exit(f"{path}: no such file; give `ab`'s ab.json or a results .jsonl")
    if path.suffix == ".json":
        try:
            arms = json.loads(path.read_text())["arms"]
        except (json.JSONDecodeError, KeyError, TypeError):
            sys.exit(f"{path}: not an `ab` report (no `arms`); give `ab`'s ab.json")
        settings = list(dict.fromkeys(a["setting"] for a in arms))
        values, index = [], []
        for a in arms:
            for record in a["records"]:
                if not record["warmup"]:
                    values.append(record[metric])
                    index.append(settings.index(a["setting"]))
    else:
        records = [r for r in read_results(path) if not r.warmup]
        values = [getattr(r, metric) for r in records]
        index = [0] * len(values)
    if any(v is None for v in values):
        sys.exit(f"{path}: some scored step has no {metric}; give a series that measured it")
    return np.asarray(values, dtype=np.float64), np.asarray(index)


def windows(path: Path, budget: int, min_effect_pct: float) -> list[str]:
    """`ab.json`'s arms cut into consecutive windows of `budget` half-blocks, each scored by the
    run's own rule (`sequential.score`, the boundary's metrics and the stop included) as if it were
    a run of the default design: one line per window, its verdicts and where it stopped."""
    if path.suffix != ".json":
        sys.exit(f"{path}: --windows reads `ab`'s ab.json (its arms and their settings)")
    report = json.loads(path.read_text())
    arms = [
        ArmRun(
            label=a["label"],
            setting=a["setting"],
            staged=a["staged"],
            records=[StepRecord.from_json(r) for r in a["records"]],
        )
        for a in report["arms"]
    ]
    settings = list(dict.fromkeys(a.setting for a in arms))
    deltas = (report.get("score") or {}).get("deltas") or [{"baseline": settings[0]}]
    baseline = deltas[0]["baseline"]  # the run's, which the blocks may not have run first
    span = budget * len(settings)
    lines = []
    for start in range(0, len(arms) - span + 1, span):
        window = arms[start : start + span]
        if sequential.halves([a.setting for a in window]) is None:
            sys.exit(f"{path}: arms {start}..{start + span} are not whole half-blocks")
        score = sequential.score(
            window, Looks(budget), min_effect_pct=min_effect_pct, baseline=baseline
        )
        stop = score.looks[-1]
        shown = [(d.name, d) for d in score.deltas] + [
            (f"{d.name} ({metric})", d) for metric, ds in score.boundary.items() for d in ds
        ]
        verdicts = "; ".join(
            f"{name} {1000 * d.delta_s:+.3g} ms [{1000 * d.ci_low_s:+.3g}, {1000 * d.ci_high_s:+.3g}]"
            f" -> {d.verdict}"
            for name, d in shown
        )
        lines.append(
            f"  window {start // span + 1} (arms {start + 1}-{start + span}): stopped after"
            f" {stop['units']} scored steps per setting (1-step turns), step noise"
            f" {100 * stop['step_noise']:.3g}%, judged by {stop['judged_by']}: {verdicts}"
        )
    return lines


def synthetic_chip() -> tuple[np.ndarray, np.ndarray]:
    """The issue's chip figures: 24 steps of 2058 ms, 0.2% noise, one stray step of 2155 ms."""
    rng = np.random.default_rng(61)
    steps = 2.058 * (1 + 0.002 * rng.standard_normal(24))
    steps[11] = 2.155
    return steps, np.array([0, 1, 1, 0] * 6)


def residuals(values: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, float]:
    """The series' residuals around the robust fit (its strays kept) and the fitted level."""
    settings = int(index.max()) + 1
    x = robust_fit.design(index, settings)
    if settings == 1:
        x = x[:, [0, -1]]  # one setting: a level and the drift
    fitted = robust_fit.fit(x, values)
    return values - x @ fitted.beta[0], float(fitted.beta[0, 0])


def simulate(
    noise: np.ndarray | float,
    level: float,
    looks: Looks,
    effect: float,
    min_effect: float,
    runs: int,
    seed,
) -> dict:
    """`runs` runs at `effect` (absolute) with `noise` resampled (or, a number, normal noise of
    that standard deviation): verdict shares and stops."""
    rng = np.random.default_rng(seed)
    steps = 2 * looks.max_units
    if isinstance(noise, float):
        draws = level + noise * rng.standard_normal((runs, steps))
    else:
        draws = level + rng.choice(noise, size=(runs, steps), replace=True)
    orders = [
        run_orders.run_order(
            list(SETTINGS), run_orders.BLOCKS, math.ceil(looks.max_units / 2), int(s)
        )
        for s in rng.integers(0, 2**31, runs)
    ]
    delta = np.zeros((runs, len(looks.units)))
    error = np.zeros_like(delta)
    df = np.zeros(delta.shape, dtype=int)
    groups: dict[tuple[str, ...], list[int]] = {}
    for row, order in enumerate(orders):
        groups.setdefault(tuple(order), []).append(row)
    for order, rows in groups.items():
        index = np.array([SETTINGS.index(s) for s in order])
        y = draws[rows] + effect * index
        for column, units in enumerate(looks.units):
            fitted = robust_fit.fit(robust_fit.design(index[: 2 * units], 2), y[:, : 2 * units])
            delta[rows, column], error[rows, column] = fitted.beta[:, 1], fitted.errors[:, 1]
            df[rows, column] = fitted.df
    stop, verdict = sequential_forecast.stops(delta, error, looks, df, min_effect)
    claimed = int(np.sum(verdict == sequential_forecast.CLAIMED))
    return {
        "runs": runs,
        "claimed": claimed,
        "claimed_wilson_95": _wilson(claimed, runs),
        "no_effect": int(np.sum(verdict == sequential_forecast.NO_EFFECT)),
        "noisy": int(np.sum(verdict == sequential_forecast.NOISY)),
        "mean_scored_per_setting": float(np.mean(stop)),
        "stopped_by": {int(k): float(np.mean(stop <= k)) for k in looks.units},
        "no_effect_by": {
            int(k): float(np.mean((stop <= k) & (verdict == sequential_forecast.NO_EFFECT)))
            for k in looks.units
        },
        "claimed_by": {
            int(k): float(np.mean((stop <= k) & (verdict == sequential_forecast.CLAIMED)))
            for k in looks.units
        },
    }


def _wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("series", nargs="?", type=Path, help="ab.json, or a results .jsonl")
    parser.add_argument("--synthetic-chip", action="store_true")
    parser.add_argument(
        "--normal-noise",
        type=float,
        help="percent: independent normal steps of 2.058 s at this noise instead of a series",
    )
    parser.add_argument("--metric", default="step_s", help="step_s or first_call_extra_s")
    parser.add_argument("--budget", type=int, default=8, help="scored steps per setting at most")
    parser.add_argument("--min-effect", type=float, default=0.5, help="percent of the median")
    parser.add_argument(
        "--effects", default="1,7.2", help="percents of the median, comma-separated"
    )
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument(
        "--windows",
        action="store_true",
        help="also score ab.json's arms in consecutive windows of --budget half-blocks by the"
        " run's own rule (a long run of 1-step turns read as several runs of the default design)",
    )
    args = parser.parse_args()
    if [args.synthetic_chip, args.series is not None, args.normal_noise is not None].count(
        True
    ) != 1:
        parser.error("give a series file, --synthetic-chip or --normal-noise, one of them")
    if args.normal_noise is not None:
        values = 2.058 + 2.058 * args.normal_noise / 100 * np.random.default_rng(
            61
        ).standard_normal(64)
        index, name = np.array([0, 1, 1, 0] * 16), f"normal-{args.normal_noise:g}pct"
    elif args.synthetic_chip:
        values, index, name = (*synthetic_chip(), "synthetic-chip")
    else:
        values, index = series_of(args.series, args.metric)
        name = f"{args.series.parent.name or args.series.stem}-{args.metric}"
    if len(values) < 8:
        sys.exit(f"{len(values)} scored steps: a bootstrap of the noise needs 8 or more")
    noise, level = residuals(values, index)
    median = float(np.median(values))
    if args.normal_noise is not None:
        noise, level, median = 2.058 * args.normal_noise / 100, 2.058, 2.058
    boundary = args.metric != "step_s"
    name += "-min-effect-tenth-of-median" if boundary else f"-min-effect-{args.min_effect:g}"
    min_effect = BOUNDARY_MIN_EFFECT * abs(median) if boundary else args.min_effect / 100 * median
    looks = Looks(args.budget)
    effects = [0.0] + [float(e) for e in args.effects.split(",")]
    cases = {}
    for number, effect in enumerate(effects):
        cases[f"{effect:g}%"] = simulate(
            noise, level, looks, effect / 100 * median, min_effect, args.runs, [61, number]
        )
    residual = np.atleast_1d(noise)
    robust_sd = noise if isinstance(noise, float) else 1.4826 * float(np.median(np.abs(noise)))
    result = {
        "series": name,
        "steps": len(values),
        "median": median,
        "noise_robust_sd_pct": 100 * robust_sd / median,
        "noise_max_abs_pct": 100 * float(np.max(np.abs(residual))) / median,
        "budget": args.budget,
        "min_effect": min_effect,
        "metric": args.metric,
        "cases": cases,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"ab_sequential_series-{name}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{name}: {len(values)} steps, median {1000 * median:.4g} ms, robust noise"
        f" {result['noise_robust_sd_pct']:.3g}%, largest residual {result['noise_max_abs_pct']:.3g}%;"
        f" budget {args.budget} scored steps per setting, min effect {1000 * min_effect:.3g} ms"
    )
    for label, case in cases.items():
        low, high = case["claimed_wilson_95"]
        by = ", ".join(f"{k}: {v:.0%}" for k, v in case["stopped_by"].items())
        print(
            f"  effect {label}: claimed {case['claimed']}/{case['runs']}"
            f" ({100 * case['claimed'] / case['runs']:.3g}%, 95% [{100 * low:.2g}, {100 * high:.2g}]%),"
            f" NO-EFFECT {case['no_effect']}, NOISY {case['noisy']}; scored steps per setting"
            f" {case['mean_scored_per_setting']:.2f} on average; stopped by {by}"
        )
    if args.windows:
        lines = windows(args.series, args.budget, args.min_effect)
        print(f"{len(lines)} windows of {args.budget} half-blocks, each scored as a run:")
        print("\n".join(lines))
        result["windows"] = lines
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
