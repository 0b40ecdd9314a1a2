"""The drift of step time over a run: how fast the machine itself sped up or slowed down.

An A/B compares steps taken at different moments, so a machine that drifts (thermal state, other
jobs, caches warming) adds to whatever the change did. The run order can cancel a linear drift
(order.py), but the reader should still see how large it was: a drift bigger than the smallest
effect worth finding means the separate-arm numbers lean on that cancellation.

Time is the run clock: the sum of the step times before a step, in run order, warm-up steps
included, taken at the step's midpoint. Gaps between steps (logging, an arm's parameter digest) are
left out, so it is the run's busy time, the same in a log read back as in the live run. The slope is
the median of the slopes between every two steps of the same group (Theil-Sen, pooled over groups):
one stray 10x step on a shared host moves a least-squares slope anywhere, a median of pairwise slopes
hardly at all. Pairing only within a group means differences between groups (the effect under test)
never pass for drift: within arms the groups are the arms, across the run they are the settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.bench.step_record import ArmRun


@dataclasses.dataclass(frozen=True)
class TimedStep:
    """One scored step placed on the run clock."""

    arm: str
    setting: str
    clock_s: float  # run clock at the step's midpoint
    step_s: float


@dataclasses.dataclass(frozen=True)
class Drift:
    """Slopes are seconds of step time per second of run clock; None where they cannot be fitted."""

    within_arms: float | None  # one slope, one intercept per arm
    per_arm: dict[str, float | None]  # each arm's own slope
    across_run: float | None  # one slope, one intercept per setting (None across pods)
    span_s: float  # run clock from the first scored step to the last
    moved_s: float  # |slope| x span, the slope across the run where there is one
    min_effect_s: float
    bias_s: dict[str, float]  # per setting against the baseline: slope x mean clock offset

    @property
    def exceeds_min_effect(self) -> bool:
        return self.moved_s > self.min_effect_s

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "exceeds_min_effect": self.exceeds_min_effect,
            "clock": "sum of step times in run order (warm-up included), at each step's midpoint",
            "fit": "median of pairwise slopes within each group (arms within, settings across)",
        }


def timed_steps(
    runs: Sequence[ArmRun],
    shared_clock: bool,
    setting_of_step: Mapping[tuple[str, int], str] | None = None,
) -> list[TimedStep]:
    """Every scored step on the run clock; each run restarts the clock unless `shared_clock`.

    `setting_of_step` names the setting of a step where it is not its arm's (interleaved runs),
    keyed by (arm label, step number); steps it leaves out keep their arm's setting.
    """
    out = []
    clock = 0.0
    for run in runs:
        if not shared_clock:
            clock = 0.0
        for record in run.records:
            if not record.warmup:
                setting = (setting_of_step or {}).get((run.label, record.step), run.setting)
                out.append(TimedStep(run.label, setting, clock + record.step_s / 2, record.step_s))
            clock += record.step_s
    return out


def measure(
    steps: Sequence[TimedStep], *, baseline: str, shared_clock: bool, min_effect_s: float
) -> Drift:
    """Fit the slopes and say how far the drift moved step time over the run."""
    labels = list(dict.fromkeys(s.arm for s in steps))
    within = _slope([(s.arm, s.clock_s, s.step_s) for s in steps])
    per_arm = {
        label: _slope([(s.arm, s.clock_s, s.step_s) for s in steps if s.arm == label])
        for label in labels
    }
    across = _slope([(s.setting, s.clock_s, s.step_s) for s in steps]) if shared_clock else None
    clocks = [s.clock_s for s in steps]
    span = max(clocks) - min(clocks) if clocks else 0.0
    slope = across if across is not None else within
    bias = {}
    if across is not None:
        centres = {
            setting: _mean([s.clock_s for s in steps if s.setting == setting])
            for setting in dict.fromkeys(s.setting for s in steps)
        }
        bias = {
            setting: across * (centre - centres[baseline])
            for setting, centre in centres.items()
            if setting != baseline and baseline in centres
        }
    return Drift(
        within_arms=within,
        per_arm=per_arm,
        across_run=across,
        span_s=span,
        moved_s=abs(slope or 0.0) * span,
        min_effect_s=min_effect_s,
        bias_s=bias,
    )


def _slope(points: Sequence[tuple[str, float, float]]) -> float | None:
    """Median slope of y on t over every two points of the same group (None: no such pair).
    Each point's slopes to the later ones at once in numpy: a run's thousands of steps make
    millions of pairs, which one at a time took seconds."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for group, t, y in points:
        groups.setdefault(group, []).append((t, y))
    slopes = []
    for members in groups.values():
        t, y = np.asarray(members, dtype=np.float64).reshape(-1, 2).T
        for i in range(len(t) - 1):
            dt, dy = t[i + 1 :] - t[i], y[i + 1 :] - y[i]
            slopes.append(dy[dt != 0] / dt[dt != 0])
    found = np.concatenate(slopes) if slopes else np.empty(0)
    return float(np.median(found)) if found.size else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
