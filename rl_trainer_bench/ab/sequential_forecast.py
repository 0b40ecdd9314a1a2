"""What a sequential A/B (sequential.py) is expected to cost and to find, before it runs.

The stopping look is random, so the plan states the expected and the most steps, and the effect it
resolves, from a simulation of the rule itself: runs of independent normal steps at the step noise
(every setting's step its mean plus noise; the model resolution.py derives the fixed design's
figures from), each half-block's difference the difference of two turn medians, every look judged
by the verdict's rule at the look's level. The draws are seeded, so the same design always prints
the same figures; they are ESTIMATES of a model, and say so. Numpy and the standard library only:
rendering and planning need no scipy.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from rl_trainer_bench.ab import resolution
from rl_trainer_bench.ab.sequential import Looks

RUNS = 4000  # simulated runs of a forecast: a share is known to about 0.5 points
SEED = 20261205
CLAIMED, NO_EFFECT, NOISY = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Forecast:
    """A design's simulated runs at one true effect: when they stop and what they say."""

    effect: float  # percent of the step
    mean_units: float  # half-blocks at the stopping look, averaged over runs
    most_units: int  # the budget's: the last look
    claimed: float  # share of runs whose verdict is FASTER or SLOWER
    no_effect: float  # share of runs whose verdict is NO-EFFECT


def stops(units: np.ndarray, looks: Looks, min_effect: float) -> tuple[np.ndarray, np.ndarray]:
    """For each run (a row of half-block differences, `looks.max_units` long), the half-blocks
    at which it stops and its verdict there (CLAIMED, NO_EFFECT or NOISY), by the verdict's rule
    at each look's level; `min_effect` in the unit of `units`."""
    runs = units.shape[0]
    stop = np.full(runs, looks.max_units)
    verdict = np.full(runs, NOISY)
    sums, squares = np.cumsum(units, axis=1), np.cumsum(units * units, axis=1)
    going = np.arange(runs)  # the runs not stopped yet: a look reads only theirs
    for n in looks.units:
        mean = sums[going, n - 1] / n
        spread = np.sqrt(np.maximum(squares[going, n - 1] - n * mean * mean, 0.0) / (n - 1))
        half_width = _t(looks, n) * spread / math.sqrt(n)
        low, high = mean - half_width, mean + half_width
        claimed = ((low > 0) | (high < 0)) & (np.abs(mean) > min_effect)
        quiet = ~claimed & (low >= -min_effect) & (high <= min_effect)
        now = claimed | quiet | (n == looks.max_units)
        verdict[going[now & claimed]] = CLAIMED
        verdict[going[now & quiet]] = NO_EFFECT
        stop[going[now]] = n
        going = going[~now]
        if going.size == 0:  # every run has stopped: later looks change nothing
            break
    return stop, verdict


@functools.lru_cache(maxsize=4096)
def _t(looks: Looks, units: int) -> float:
    return resolution.t_quantile(1 - looks.alpha(units) / 2, units - 1)


@functools.lru_cache(maxsize=64)
def _draws(max_units: int) -> np.ndarray:
    """Standard normal draws shared by every forecast of a budget: one effect's runs differ from
    another's only by the effect, so the forecasts are comparable and a bisection is monotone."""
    return np.random.default_rng([SEED, max_units]).standard_normal((RUNS, max_units))


def forecast(
    looks: Looks, effect: float, noise: float, turn_steps: int, min_effect: float
) -> Forecast:
    """The simulated runs at a true `effect` (all figures in percent of the step; `noise` the
    step noise's standard deviation)."""
    unit_sd = noise * math.sqrt(2 * resolution.median_variance(turn_steps))
    stop, verdict = stops(effect + unit_sd * _draws(looks.max_units), looks, min_effect)
    return Forecast(
        effect,
        float(np.mean(stop)),
        looks.max_units,
        float(np.mean(verdict == CLAIMED)),
        float(np.mean(verdict == NO_EFFECT)),
    )


def smallest_effect(looks: Looks, noise: float, turn_steps: int, min_effect: float) -> float:
    """The smallest true effect claimed in resolution.RESOLVED of the simulated runs."""

    def claimed(effect: float) -> float:
        return forecast(looks, effect, noise, turn_steps, min_effect).claimed

    low, high = 0.0, max(min_effect, noise)
    while claimed(high) < resolution.RESOLVED:
        low, high = high, 2 * high
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if claimed(middle) < resolution.RESOLVED else (low, middle)
    return high
