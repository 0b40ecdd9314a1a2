"""The smallest effect a blocks design resolves, derived from the rule that scores it (score.py).

A budget is only worth printing with what it buys, so the figure comes from the scoring itself,
not from a fit to past runs. The model: every step of a setting takes its setting's mean plus
independent noise of standard deviation sigma (the step noise); a drift linear within a block
cancels in it (order.py) and is left out. score.py takes each turn's median of its n scored steps
and each block's difference of the settings' means of their turn medians (every setting runs two
turns per block), so a block's difference D is normal with mean delta (the effect) and variance
sigma^2 v_n, where v_n is the variance of the median of n standard normal draws. Over b blocks the
mean of D is normal with variance sigma^2 v_n / b, independent of the blocks' sample standard
deviation s, whose (b - 1) s^2 / (sigma^2 v_n) is chi-square with b - 1 degrees of freedom. The
verdict claims an effect (FASTER or SLOWER) when the 99% Student's t interval excludes 0 and
|mean| passes the min effect:

    |mean| > max(min_effect, t * s / sqrt(b)),   t = Student's t quantile at 0.995, b - 1 df

so the chance of a claim at a true effect delta is one integral over the mean (`claim_rate`), and
the smallest resolvable effect is the delta at which that chance reaches RESOLVED (`smallest_effect`).
At delta = 0 the same integral is the design's false-claim rate.

Everything here is numpy and the standard library (Student's t from `student_t`, an exact finite sum
for the chi-square distribution at whole degrees of freedom), so rendering and planning need no scipy.
"""

from __future__ import annotations

import math

import numpy as np

from rl_trainer_bench.ab.score import CONFIDENCE
from rl_trainer_bench.ab.student_t import t_quantile

RESOLVED = 0.9  # a resolvable effect is claimed in at least 9 runs of 10
# Turns longer than this use the large-n variance of a median, pi / (2 n): the exact integral's
# powers of the normal CDF underflow past it, and the two agree within 1.5% there.
_EXACT_MEDIAN_STEPS = 64
_GRID = 4001  # points of every numeric integral (trapezoid rule)


def _chi2_cdf(w: np.ndarray, df: int) -> np.ndarray:
    """The chi-square distribution function at whole `df` (the regularized lower incomplete gamma
    function at a whole or half-whole argument: a finite sum)."""
    x = np.asarray(w, dtype=np.float64) / 2
    if df % 2 == 0:
        term, total = np.ones_like(x), np.zeros_like(x)
        for k in range(df // 2):
            total += term
            term = term * x / (k + 1)
        return 1 - np.exp(-x) * total
    erf = np.vectorize(math.erf, otypes=[float])
    root = np.sqrt(x)
    term, total = root / math.gamma(1.5), np.zeros_like(x)
    for j in range((df - 1) // 2):
        total += term
        term = term * x / (j + 1.5)
    return erf(root) - np.exp(-x) * total


def _normal(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The standard normal density and distribution function at `x`."""
    erfc = np.vectorize(math.erfc, otypes=[float])
    return np.exp(-x * x / 2) / math.sqrt(2 * math.pi), erfc(-x / math.sqrt(2)) / 2


def median_variance(n: int) -> float:
    """Var of the median of `n` independent standard normal draws (numpy's median: the middle
    draw, or the mean of the two middle ones), by integrating the order statistics' densities."""
    if n > _EXACT_MEDIAN_STEPS:
        return math.pi / (2 * n)
    half = min(10.0, 15 / math.sqrt(n))
    x = np.linspace(-half, half, _GRID)
    density, below = _normal(x)
    above = 1 - below
    if n % 2:
        r = n // 2
        weight = math.comb(n, r) * (n - r) * below**r * above**r * density
        return float(np.trapezoid(x * x * weight, x))
    r = n // 2  # the mean of the r-th and (r + 1)-th draws; their laws mirror each other
    lower = math.comb(n, r) * r * below ** (r - 1) * above**r * density  # the r-th draw's
    second_moment = float(np.trapezoid(x * x * lower, x))
    # E[X_(r) X_(r+1)]: given X_(r) = x, X_(r+1) is the least of the n - r draws above x, whose
    # mean is x + G(x) / above(x)^(n-r) with G(x) the integral of above^(n-r) from x upward.
    tail = above ** (n - r)
    steps = (tail[1:] + tail[:-1]) / 2 * np.diff(x)
    g = np.concatenate([np.cumsum(steps[::-1])[::-1], [0.0]])
    joint = math.comb(n, r) * r * below ** (r - 1) * density * x * (x * tail + g)
    product = float(np.trapezoid(joint, x))
    return (2 * second_moment + 2 * product) / 4


def claim_rate(
    effect: float, noise: float, blocks: int, turn_steps: int, min_effect: float
) -> float:
    """The chance that the verdict claims an effect (FASTER or SLOWER) when the true effect is
    `effect`; `effect`, `noise` (the step noise's standard deviation) and `min_effect` in one unit."""
    df = blocks - 1
    t = t_quantile(0.5 + CONFIDENCE / 2, df)
    block_sd = noise * math.sqrt(median_variance(turn_steps))
    mean_sd = block_sd / math.sqrt(blocks)
    x = np.linspace(effect - 12 * mean_sd, effect + 12 * mean_sd, _GRID)
    density = np.exp(-(((x - effect) / mean_sd) ** 2) / 2) / (mean_sd * math.sqrt(2 * math.pi))
    # s < |x| sqrt(b) / t  <=>  (b - 1) s^2 / block_sd^2 < (b - 1) b x^2 / (t block_sd)^2
    small_spread = _chi2_cdf(df * blocks * x * x / (t * block_sd) ** 2, df)
    claimed = np.where(np.abs(x) > min_effect, small_spread, 0.0)
    return float(np.clip(np.trapezoid(density * claimed, x), 0.0, 1.0))


def smallest_effect(noise: float, blocks: int, turn_steps: int, min_effect: float) -> float:
    """The smallest true effect the design claims in RESOLVED of its runs (bisection of
    `claim_rate`, which grows with the effect), in the unit of `noise` and `min_effect`."""
    low, high = 0.0, max(min_effect, noise)
    while claim_rate(high, noise, blocks, turn_steps, min_effect) < RESOLVED:
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        if claim_rate(middle, noise, blocks, turn_steps, min_effect) < RESOLVED:
            low = middle
        else:
            high = middle
    return high
