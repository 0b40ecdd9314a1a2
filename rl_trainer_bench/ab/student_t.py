"""Student's t distribution at whole degrees of freedom, exactly, in the standard library: the
verdict's interval, the design's forecasts and the stray-step test all take its quantiles, and
rendering, planning and a run's scoring then import no scipy (whose `stats` takes seconds to load,
at the end of every A/B)."""

from __future__ import annotations

import math


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function at whole `df` (Abramowitz and Stegun 26.7.3-4: exact)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, series = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + (2 4)/(3 5) cos^5 ...
            series += term
            term *= cos2 * (2 * k) / (2 * k + 1)
        inside = (2 / math.pi) * (theta + sin * series)
    else:
        term, series = 1.0, 0.0
        for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 ...
            series += term
            term *= cos2 * (2 * k - 1) / (2 * k)
        inside = sin * series
    return 0.5 + math.copysign(inside / 2, t)


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile of Student's t at whole `df`, by bisection of `t_cdf`."""
    low, high = -1.0, 1.0
    while t_cdf(low, df) > p:
        low *= 2
    while t_cdf(high, df) < p:
        high *= 2
    while high - low > 1e-13 * max(1.0, abs(low), abs(high)):  # to double precision, ~50 steps
        middle = (low + high) / 2
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2
