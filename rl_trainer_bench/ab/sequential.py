"""An A/B of separate arms in blocks that stops as soon as its verdict is settled: group-sequential
looks, with the error rate spent across them.

A fixed design runs its whole budget and judges once. When the effect is large against the step
noise (a switch that moves a 100 s step by 7%, steps that scatter by 0.15%), the verdict is settled
after a few steps and the rest of the budget buys nothing. This design looks after every
half-block (`halves`: each setting's turn once) from the MIN_UNITS-th on, and stops at the first
look whose verdict is FASTER, SLOWER or NO-EFFECT for every delta; at the budget's last look it
stops with the verdict it has.

Looking many times at a 99% interval would claim an effect that is not there far more often than 1
run in 100. So look k builds its interval at its own level 1 - a_k, the a_k being the increments of
an alpha-spending function of the information fraction t = k / K (Lan and DeMets, Biometrika 70:659,
1983): the Pocock type, a(t) = a ln(1 + (e - 1) t) (Kim and DeMets, Biometrika 74:149, 1987), with a
= 1%, the fixed design's. The a_k sum to a, so by the union bound every look's interval covers the
true delta at once in at least 99% of runs, whatever the looks' correlation. A verdict that claims
an effect where there is none, or of the wrong sign, or says NO-EFFECT of an effect beyond the min
effect, needs an interval that misses the true delta: it happens in at most 1% of runs, a bound (the
looks' positive correlation keeps the true rate well under it). The Pocock type spends early (a
third of a at a quarter of the budget), so a large effect is called at the first look; the price is
the last look's small share, which widens its interval against the fixed design's.

The unit of every look is the half-block: the setting's turn median minus the baseline's, in a
half-block where each runs once (with 1-step turns, 3 units are 3 scored steps per setting). A
block (A B B A) is two of them, and a drift linear in the run enters them with opposite signs: it
cancels at an even look, leaves at most one half-block's drift over k at an odd look k, and its
swing between halves widens the interval, so the verdict stays honest and a drifting host stops
later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.ab import resolution
from rl_trainer_bench.ab import score as ab_score
from rl_trainer_bench.ab.score import CONFIDENCE, FASTER, NO_EFFECT, SLOWER, Delta, Score
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.units import confidence_level, milliseconds

MIN_UNITS = 3  # the first look: two degrees of freedom, as the fixed design's fewest blocks
ALPHA = 1 - CONFIDENCE  # spent over all the looks of a run
SETTLED = (FASTER, SLOWER, NO_EFFECT)
DESIGN = ab_score.SEQUENTIAL
SPENDING = "a(t) = 1% ln(1 + (e - 1) t)"


def spent(fraction: float) -> float:
    """The error rate spent by the information fraction `fraction` (0..1) of the budget."""
    return ALPHA * math.log(1 + (math.e - 1) * min(1.0, fraction))


@dataclasses.dataclass(frozen=True)
class Looks:
    """The looks of a run whose budget holds `max_units` half-blocks (two per block)."""

    max_units: int

    @property
    def units(self) -> range:
        """The half-blocks after which a look is taken."""
        return range(MIN_UNITS, self.max_units + 1)

    def alpha(self, units: int) -> float:
        """What the look after `units` half-blocks spends: the spending function's increment
        since the look before (the first look spends all that is spent by then)."""
        before = 0.0 if units == MIN_UNITS else spent((units - 1) / self.max_units)
        return spent(units / self.max_units) - before

    def confidence(self, units: int) -> float:
        return 1 - self.alpha(units)

    def rule(self) -> str:
        """The stopping rule as the plan and the report print it."""
        first, last = self.units[0], self.units[-1]
        return (
            f"looks after every half-block, from half-block {first} to {last}; look k's interval"
            f" at 1 - a_k, a_k the increments of {SPENDING}, t = k/{last} (Lan-DeMets, Pocock"
            f" type: {confidence_level(self.confidence(first))} at the first look,"
            f" {confidence_level(self.confidence(last))} at the last; 1% spent in all); stops at"
            " the first look whose verdict is FASTER, SLOWER or NO-EFFECT for every delta, else"
            " at the last"
        )


def halves(settings_in_run_order: Sequence[str]) -> list[range] | None:
    """The run cut into consecutive half-blocks, each setting once in each; None when it cannot
    be cut so."""
    count = len(set(settings_in_run_order))
    cuts = [range(start, start + count) for start in range(0, len(settings_in_run_order), count)]
    # a short last cut holds fewer settings than `count`, so it fails this too
    whole = all(len(set(settings_in_run_order[c.start : c.stop])) == count for c in cuts)
    return cuts if whole else None


@dataclasses.dataclass(frozen=True)
class Look:
    """One look: its half-blocks, its interval's level, and each delta judged at that level."""

    units: int
    confidence: float
    deltas: list[Delta]
    last: bool  # the budget's last look: the run stops here whatever the verdict
    differences_s: dict[str, list[float]]  # each half-block's difference, by delta name
    # The step noise the look measured, a fraction of the baseline's median step: the spread of
    # its half-blocks' differences over what one step's noise gives them (`step_noise`)
    noise: float

    def noise_text(self) -> str:
        return (
            f"step noise measured {100 * self.noise:.3g}% of the step (the spread of"
            f" {self.units} half-blocks' differences; the next plan's --step-noise)"
        )

    @property
    def settled(self) -> bool:
        return self.last or all(d.verdict in SETTLED for d in self.deltas)

    def why(self) -> str:
        """Why the run stops, or goes on, at this look."""
        if all(d.verdict in SETTLED for d in self.deltas):
            return "every verdict settled: " + "; ".join(
                f"{d.name} {d.verdict} ({d.reason})" for d in self.deltas
            )
        unsettled = ", ".join(d.name for d in self.deltas if d.verdict not in SETTLED)
        if self.last:
            return f"the budget's last look, {unsettled} still NOISY: the verdict it has"
        return f"{unsettled} NOISY: going on"

    def line(self) -> str:
        """The look as the run's progress prints it."""
        intervals = "; ".join(
            f"{d.name} {milliseconds(d.delta_s, '+.3g')} ms,"
            f" [{milliseconds(d.ci_low_s, '+.3g')}, {milliseconds(d.ci_high_s, '+.3g')}] ms"
            f" -> {d.verdict}"
            for d in self.deltas
        )
        return (
            f"look after half-block {self.units} ({confidence_level(self.confidence)} CI):"
            f" {intervals}; step noise {100 * self.noise:.3g}%;"
            f" {'stops' if self.settled else 'goes on'}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "confidence": self.confidence,
            "step_noise": self.noise,
            "settled": self.settled,
            "deltas": {
                d.name: {
                    "delta_s": d.delta_s,
                    "ci_low_s": d.ci_low_s,
                    "ci_high_s": d.ci_high_s,
                    "verdict": d.verdict,
                }
                for d in self.deltas
            },
        }


def look(runs: Sequence[ArmRun], looks: Looks, min_effect_pct: float, baseline: str) -> Look | None:
    """The look the runs so far allow: None unless they end a half-block and hold MIN_UNITS or
    more."""
    cuts = halves([run.setting for run in runs])
    if cuts is None or len(cuts) < MIN_UNITS:
        return None
    summary = ab_score.summarise(runs, min_effect_pct, False, baseline)
    return _judged(runs, cuts, summary, looks)


def _judged(
    runs: Sequence[ArmRun], cuts: list[range], summary: ab_score.Summary, looks: Looks
) -> Look:
    """Each delta over the half-blocks `cuts`, judged at the look's level."""
    units = len(cuts)
    confidence = looks.confidence(units)
    baseline, *others = summary.by_setting
    medians = {run.label: summary.arms[run.label].median_s for run in runs}
    deltas, differences = [], {}
    for setting in others:
        unit_s = [
            _turn_median(runs, cut, medians, setting) - _turn_median(runs, cut, medians, baseline)
            for cut in cuts
        ]
        delta, low, high = ab_score.t_interval(unit_s, confidence)
        baseline_median = summary.settings[baseline].median_s
        deltas.append(
            Delta.judged(
                setting,
                baseline,
                delta,
                low,
                high,
                baseline_median,
                None,
                summary.min_effect_s,
                confidence,
            )
        )
        differences[deltas[-1].name] = unit_s
    turn_steps = len(runs[0].scored)
    noise = step_noise(differences, turn_steps, summary.settings[baseline].median_s)
    return Look(units, confidence, deltas, units >= looks.max_units, differences, noise)


def step_noise(differences_s: dict[str, list[float]], turn_steps: int, step_s: float) -> float:
    """One step's noise, a fraction of `step_s`, from the half-blocks' differences: each is the
    difference of two turn medians of `turn_steps` steps, whose variance is 2 v_n sigma^2
    (resolution.median_variance), so sigma is their pooled spread over sqrt(2 v_n). What the
    plan's forecast takes as its step noise, measured by the run itself."""
    spreads = [float(np.var(units, ddof=1)) for units in differences_s.values()]
    pooled = math.sqrt(sum(spreads) / len(spreads))
    return pooled / math.sqrt(2 * resolution.median_variance(turn_steps)) / step_s


def _turn_median(
    runs: Sequence[ArmRun], cut: range, medians: dict[str, float], setting: str
) -> float:
    (label,) = [runs[i].label for i in cut if runs[i].setting == setting]
    return medians[label]


def score(runs: Sequence[ArmRun], looks: Looks, *, min_effect_pct: float, baseline: str) -> Score:
    """Score a sequential run: every look its half-blocks allow, the verdict of the first settled
    one (where the run stopped), or of the last."""
    summary = ab_score.summarise(runs, min_effect_pct, False, baseline)
    cuts = halves([run.setting for run in runs])
    if cuts is None or len(cuts) < MIN_UNITS:  # the run loop stops only after a look
        raise ValueError(f"{len(runs)} arms do not end a half-block after {MIN_UNITS} or more")
    taken = []
    for units in range(MIN_UNITS, len(cuts) + 1):
        taken.append(_judged(runs, cuts[:units], summary, looks))
        if taken[-1].settled:
            break
    stop = taken[-1]
    blocks = [[runs[i].label for i in cut] for cut in cuts[: stop.units]]
    return Score(
        summary.arms,
        summary.settings,
        [],
        None,
        summary.min_effect_s,
        False,
        stop.deltas,
        ab_score.rule_text(None, summary.min_effect_s, False, DESIGN, stop.confidence),
        DESIGN,
        summary.drift,
        _drift_answer(stop.units),
        blocks,
        stop.differences_s,
        stop.confidence,
        [each.to_json() for each in taken],
        f"{looks.rule()}. Stopped at the look after half-block {stop.units} of"
        f" {looks.max_units}: {stop.why()}; {stop.noise_text()}",
    )


def _drift_answer(units: int) -> str:
    parity = (
        "an even number of them: a drift linear in the run cancels"
        if units % 2 == 0
        else f"an odd number: at most 1/{units} of one half-block's drift is left in the delta"
    )
    return f"{units} half-blocks, each setting side by side in each; {parity}"
