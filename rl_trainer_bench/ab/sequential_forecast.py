"""What a sequential A/B (sequential.py) is expected to cost and to find, before it runs.

The stopping look is random, so the plan states the expected and the most steps, and the effect it
resolves, from a simulation of the rule itself: runs of independent normal steps at the step noise
(every setting's step its mean plus noise), laid out in the blocks order with its turns drawn as a
run draws them, every look fitted by the run's own robust fit (robust_fit.py) and judged by the
verdict's rule at the look's level. The fit is equivariant, so one set of simulated runs at no
effect and unit noise serves every effect and noise: a run at effect e and noise s has the delta
e + s d and the standard error s se of the unit run's d and se. The draws are seeded, so the same
design always prints the same figures; they are ESTIMATES of a model, and say so. Numpy and the
standard library only: rendering and planning need no scipy.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import robust_fit
from rl_trainer_bench.ab.resolution import RESOLVED
from rl_trainer_bench.ab.sequential import Looks

RUNS = 4000  # simulated runs of a forecast: a share is known to about 0.5 points
FEWEST_RUNS = 1000  # a longer budget's: a share known to about 1.5 points
# Steps fitted per simulated run, summed over its looks, that 4,000 runs fit in a few seconds on
# the 2-core development machine (the seeds' 8 half-blocks fit 66; 17 half-blocks of 1-step turns
# 300): a longer budget is simulated with fewer runs, down to FEWEST_RUNS (35 half-blocks), and
# beyond that not at all (the cost grows with the square of the budget: 1,000 blocks, hours)
WORK = RUNS * 300
SEED = 20261205
CLAIMED, NO_EFFECT, NOISY = 0, 1, 2
SETTINGS = ("A", "B")
SHARE = 0.8  # the plan states the scored steps by which this share of runs has stopped


@dataclasses.dataclass(frozen=True)
class Forecast:
    """A design's simulated runs at one true effect: when they stop and what they say."""

    effect: float  # percent of the step
    mean_units: float  # half-blocks at the stopping look, averaged over runs
    most_units: int  # the budget's: the last look
    claimed: float  # share of runs whose verdict is FASTER or SLOWER
    no_effect: float  # share of runs whose verdict is NO-EFFECT
    share_units: int  # half-blocks by which SHARE of the runs have stopped


@dataclasses.dataclass(frozen=True)
class UnitRuns:
    """Simulated runs at no effect and unit noise: each look's delta, its standard error and its
    degrees of freedom (runs x looks)."""

    delta: np.ndarray
    error: np.ndarray
    df: np.ndarray


def runs_for(looks: Looks, turn_steps: int) -> int:
    """The simulated runs a forecast of this design affords (0: none, the budget is too long)."""
    fitted = sum(len(SETTINGS) * units * turn_steps for units in looks.units)
    runs = min(RUNS, WORK // fitted)
    return runs if runs >= FEWEST_RUNS else 0


@functools.lru_cache(maxsize=16)
def unit_runs(looks: Looks, turn_steps: int, runs: int = RUNS, seed: int = SEED) -> UnitRuns:
    """`runs` runs of `looks`' budget in `turn_steps`-step turns, each in the blocks order turned
    by its own schedule seed, fitted at every look (the runs that share an order at once)."""
    rng = np.random.default_rng([seed, looks.max_units, turn_steps])
    steps = len(SETTINGS) * looks.max_units * turn_steps
    draws = rng.standard_normal((runs, steps))
    blocks = math.ceil(looks.max_units / 2)
    orders = [
        run_orders.run_order(list(SETTINGS), run_orders.BLOCKS, blocks, int(s))
        for s in rng.integers(0, 2**31, runs)
    ]
    delta = np.zeros((runs, len(looks.units)))
    error = np.zeros_like(delta)
    df = np.zeros(delta.shape, dtype=int)
    by_order: dict[tuple[str, ...], list[int]] = {}
    for row, order in enumerate(orders):
        by_order.setdefault(tuple(order), []).append(row)
    for order, rows in by_order.items():
        index = np.repeat([SETTINGS.index(s) for s in order], turn_steps)
        for column, units in enumerate(looks.units):
            n = len(SETTINGS) * units * turn_steps
            fitted = robust_fit.fit(robust_fit.design(index[:n], 2), draws[rows, :n])
            delta[rows, column], error[rows, column] = fitted.beta[:, 1], fitted.errors[:, 1]
            df[rows, column] = fitted.df
    return UnitRuns(delta, error, df)


def stops(
    delta: np.ndarray, error: np.ndarray, looks: Looks, df: np.ndarray, min_effect: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each run (a row of each look's delta and standard error), the half-blocks at which it
    stops and its verdict there (CLAIMED, NO_EFFECT or NOISY), by the verdict's rule at each
    look's level; `min_effect` in the unit of `delta`."""
    runs = delta.shape[0]
    stop = np.full(runs, looks.max_units)
    verdict = np.full(runs, NOISY)
    going = np.arange(runs)  # the runs not stopped yet: a look reads only theirs
    for column, units in enumerate(looks.units):
        d, e, f = delta[going, column], error[going, column], df[going, column]
        claim = _quantiles(looks.claim_quantile, units, f) * e
        quiet = _quantiles(looks.no_effect_quantile, units, f) * e
        claimed = ((d - claim > 0) | (d + claim < 0)) & (np.abs(d) > min_effect)
        settled = ~claimed & (d - quiet >= -min_effect) & (d + quiet <= min_effect)
        now = claimed | settled | (units == looks.max_units)
        verdict[going[now & claimed]] = CLAIMED
        verdict[going[now & settled]] = NO_EFFECT
        stop[going[now]] = units
        going = going[~now]
        if going.size == 0:  # every run has stopped: later looks change nothing
            break
    return stop, verdict


def _quantiles(quantile, units: int, df: np.ndarray) -> np.ndarray:
    """A look's t quantile at each run's degrees of freedom (all but a few share one)."""
    values = {int(each): quantile(units, int(each)) for each in np.unique(df)}
    return np.array([values[int(each)] for each in df])


def forecast(
    looks: Looks, effect: float, noise: float, turn_steps: int, min_effect: float
) -> Forecast:
    """The simulated runs at a true `effect` (all figures in percent of the step; `noise` the
    step noise's standard deviation)."""
    unit = unit_runs(looks, turn_steps, runs_for(looks, turn_steps))
    stop, verdict = stops(
        effect + noise * unit.delta, noise * unit.error, looks, unit.df, min_effect
    )
    return Forecast(
        effect,
        float(np.mean(stop)),
        looks.max_units,
        float(np.mean(verdict == CLAIMED)),
        float(np.mean(verdict == NO_EFFECT)),
        int(np.quantile(stop, SHARE, method="higher")),
    )


def smallest_effect(looks: Looks, noise: float, turn_steps: int, min_effect: float) -> float:
    """The smallest true effect claimed in RESOLVED of the simulated runs."""

    def claimed(effect: float) -> float:
        return forecast(looks, effect, noise, turn_steps, min_effect).claimed

    low, high = 0.0, max(min_effect, noise)
    while claimed(high) < RESOLVED:
        low, high = high, 2 * high
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if claimed(middle) < RESOLVED else (low, middle)
    return high
