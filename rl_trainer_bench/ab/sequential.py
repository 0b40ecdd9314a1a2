"""An A/B of separate arms in blocks that stops as soon as its verdict is settled: group-sequential
looks, every scored step a datum, the error rate spent across the looks.

A fixed design runs its whole budget and judges once. When the effect is large against the step
noise (a switch that moves a 100 s step by 7%, steps that scatter by 0.15%), the verdict is settled
after a few steps and the rest of the budget buys nothing. This design looks after every
half-block (`halves`: each setting's turn once) from the MIN_UNITS-th on, and stops at the first
look whose verdict is FASTER, SLOWER or NO-EFFECT for every delta (and, for a switch that acts at
the update boundary, for the boundary's metric too: `judged_by`); at the budget's last look it
stops with the verdict it has.

What a look reads: every scored step so far, fitted by robust_fit.py (Huber's M-estimate of the
baseline's level, one effect per other setting and one drift per step of the run; its sandwich
standard error), so a look after k half-blocks of one-step turns has 2k - 3 degrees of freedom
where one difference per half-block left k - 1, and a single stray step counts as 1.345 scales,
not as itself. The blocks order (A B B A, in complementary pairs) keeps the effect nearly
orthogonal to the drift, so fitting the drift costs the effect almost nothing.

Looking many times at a 99% interval would claim an effect that is not there far more often than 1
run in 100. So look k builds its interval at its own level 1 - a_k, the a_k being the increments of
an alpha-spending function of the information fraction t = k / K (Lan and DeMets, Biometrika 70:659,
1983): the Pocock type, a(t) = a ln(1 + (e - 1) t) (Kim and DeMets, Biometrika 74:149, 1987). With a =
1%, the fixed design's, the union bound has every look's interval cover the true delta at once in at
least 99% of runs when each interval is exact. Student's t on Huber's fit runs a little past its
nominal level at a single look (up to 1.4 times, simulated on normal steps), but the looks share
most of their steps, so the bound has room: the simulated family-wise rates are 0.80% (false
claims, the interval alone) and 0.64% (false NO-EFFECT at the min effect;
benchmarks/reports/ab-sequential-per-step_simulated_2026-12-06.md), a simulation, not a
bound.

Two intervals per look, one per kind of error. FASTER or SLOWER needs the two-sided interval at
1 - a_k to exclude 0 (and the delta past the min effect): a false claim at no effect has a chance
of at most a over all looks. NO-EFFECT needs the interval whose each side is one-sided at a_k (two
one-sided tests: Schuirmann, J. Pharmacokinet. Biopharm. 15:657, 1987) to lie within the min
effect: a NO-EFFECT where the true effect is the min effect or more has a chance of at most a over
all looks, as well. Each error is bounded alone, and the NO-EFFECT interval is narrower, so a run
with nothing to find settles sooner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.ab import robust_fit, student_t
from rl_trainer_bench.ab import score as ab_score
from rl_trainer_bench.ab.score import CONFIDENCE, FASTER, NO_EFFECT, SLOWER, Delta, Score
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.units import confidence_level, milliseconds

MIN_UNITS = 3  # the first look: three steps of each setting in one-step turns
ALPHA = 1 - CONFIDENCE  # spent over all the looks of a run, for each kind of error
SETTLED = (FASTER, SLOWER, NO_EFFECT)
DESIGN = ab_score.SEQUENTIAL
SPENDING = "a(t) = 1% ln(1 + (e - 1) t)"
STEP = "step"
# The update boundary's own figures, by the StepRecord field that holds each: judged beside the
# step where every scored step has one, each against a tenth of the baseline's median of it (the
# step's min effect would hide them: a 2 ms change of a 4 ms gap is 0.1% of a 2 s step)
BOUNDARY_METRICS = {"first call's extra": "first_call_extra_s", "boundary idle": "boundary_idle_s"}
BOUNDARY_MIN_EFFECT = 0.10
FIRST_CALL = "first call's extra"


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

    def claim_quantile(self, units: int, df: int) -> float:
        """Student's t quantile of the look's two-sided interval (FASTER, SLOWER)."""
        return student_t.t_quantile(1 - self.alpha(units) / 2, df)

    def no_effect_quantile(self, units: int, df: int) -> float:
        """Student's t quantile of the look's NO-EFFECT interval, each side one-sided."""
        return student_t.t_quantile(1 - self.alpha(units), df)

    def rule(self) -> str:
        """The stopping rule as the plan and the report print it."""
        first, last = self.units[0], self.units[-1]
        return (
            f"looks after every half-block, from half-block {first} to {last}, every scored step a"
            " datum (Huber's robust fit of a level, the effect and a linear drift); look k's"
            f" interval at 1 - a_k, a_k the increments of {SPENDING}, t = k/{last} (Lan-DeMets,"
            f" Pocock type: {confidence_level(self.confidence(first))} at the first look,"
            f" {confidence_level(self.confidence(last))} at the last), its NO-EFFECT interval"
            " one-sided at a_k on each side; a false claim, and a false NO-EFFECT, each in at most"
            " 1% of runs (simulated: 0.80% and 0.64%); stops at the first look whose verdict is"
            " FASTER, SLOWER or NO-EFFECT for every delta, else at the last"
        )


def halves(settings_in_run_order: Sequence[str]) -> list[range] | None:
    """The run cut into consecutive half-blocks, each setting once in each; None when it cannot
    be cut so."""
    count = len(set(settings_in_run_order))
    cuts = [range(start, start + count) for start in range(0, len(settings_in_run_order), count)]
    # a short last cut holds fewer settings than `count`, so it fails this too
    whole = all(len(set(settings_in_run_order[c.start : c.stop])) == count for c in cuts)
    return cuts if whole else None


def judged_by(runs: Sequence[ArmRun]) -> str:
    """The metric a switch is judged by: a switch that acts at the update boundary (its settings
    differ in staging, as STAGE_BEFORE_UPDATE's do) by the first call's extra after the boundary,
    the time it exists to remove, where every scored step measured it; any other by the step."""
    staged = {run.setting: run.staged for run in runs}
    measured = all(r.first_call_extra_s is not None for run in runs for r in run.scored)
    return FIRST_CALL if len(set(staged.values())) > 1 and measured else STEP


@dataclasses.dataclass(frozen=True)
class SetAside:
    """A scored step the look's fit left out (robust_fit.fit: its own outlier test, or more than
    SET_ASIDE scales off): named so a reader can find it in the arm's steps and see what it was."""

    label: str  # the arm's
    step: int  # among the arm's scored steps, from 0
    value_s: float
    # its residual from the fit without it, in the fit's noise scales; None where the others fit
    # exactly (no spread to measure it by)
    scales: float | None

    def text(self) -> str:
        off = (
            "off a fit of no spread"
            if self.scales is None
            else f"{self.scales:+.3g} scales off the fit"
        )
        return f"{self.label} step {self.step} ({milliseconds(self.value_s, '.4g')} ms, {off})"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Look:
    """One look: its half-blocks, its interval's level, and each delta judged at that level."""

    units: int
    confidence: float
    deltas: list[Delta]  # the step's
    last: bool  # the budget's last look: the run stops here whatever the verdict
    # The step noise the look measured, a fraction of the baseline's median step: the Huber fit's
    # scale of the steps around it
    noise: float
    steps: int  # scored steps the look read, every setting's
    boundary: dict[str, list[Delta]] = dataclasses.field(default_factory=dict)  # by metric
    judged_by: str = STEP
    # The steps each fit left out, by metric (STEP: the step's own)
    set_aside: dict[str, list[SetAside]] = dataclasses.field(default_factory=dict)

    def noise_text(self) -> str:
        return (
            f"step noise measured {100 * self.noise:.3g}% of the step (the robust scale of"
            f" {self.steps} scored steps around the fit; the next plan's --step-noise)"
            f"{f'; {aside}' if (aside := self.set_aside_text()) else ''}"
        )

    def _judged(self) -> list[Delta]:
        """The deltas the run stops on: the step's, and the boundary metric the switch is
        judged by."""
        return [*self.deltas, *self.boundary.get(self.judged_by, [])]

    @property
    def settled(self) -> bool:
        return self.last or all(d.verdict in SETTLED for d in self._judged())

    def why(self) -> str:
        """Why the run stops, or goes on, at this look."""
        judged = self._judged()
        named = [(self._name(d), d) for d in judged]
        if all(d.verdict in SETTLED for d in judged):
            return "every verdict settled: " + "; ".join(
                f"{name} {d.verdict} ({d.reason})" for name, d in named
            )
        unsettled = ", ".join(name for name, d in named if d.verdict not in SETTLED)
        if self.last:
            return f"the budget's last look, {unsettled} still NOISY: the verdict it has"
        return f"{unsettled} NOISY: going on"

    def _name(self, delta: Delta) -> str:
        for metric, deltas in self.boundary.items():
            if any(delta is d for d in deltas):
                return f"{delta.name} ({metric})"
        return delta.name

    def line(self) -> str:
        """The look as the run's progress prints it."""
        intervals = "; ".join(
            f"{self._name(d)} {milliseconds(d.delta_s, '+.3g')} ms,"
            f" [{milliseconds(d.ci_low_s, '+.3g')}, {milliseconds(d.ci_high_s, '+.3g')}] ms"
            f" -> {d.verdict}"
            for d in [*self.deltas, *(d for ds in self.boundary.values() for d in ds)]
        )
        return (
            f"look after half-block {self.units} ({confidence_level(self.confidence)} CI):"
            f" {intervals}; step noise {100 * self.noise:.3g}%;"
            f"{f' {aside};' if (aside := self.set_aside_text()) else ''}"
            f" {'stops' if self.settled else 'goes on'}"
        )

    def set_aside_text(self) -> str:
        """The steps the fits left out, as the look's line and the report name them ('' for
        none), each with the metric whose fit left it out."""
        named = [
            f"{aside.text()}{'' if metric == STEP else f' ({metric})'}"
            for metric, steps in self.set_aside.items()
            for aside in steps
        ]
        return f"set aside: {', '.join(named)}" if named else ""

    def to_json(self) -> dict[str, Any]:
        def each(deltas: list[Delta]) -> dict[str, Any]:
            return {
                d.name: {
                    "delta_s": d.delta_s,
                    "ci_low_s": d.ci_low_s,
                    "ci_high_s": d.ci_high_s,
                    "no_effect_low_s": d.no_effect_low_s,
                    "no_effect_high_s": d.no_effect_high_s,
                    "verdict": d.verdict,
                }
                for d in deltas
            }

        return {
            "units": self.units,
            "steps": self.steps,
            "confidence": self.confidence,
            "step_noise": self.noise,
            "settled": self.settled,
            "judged_by": self.judged_by,
            "deltas": each(self.deltas),
            "boundary": {metric: each(deltas) for metric, deltas in self.boundary.items()},
            "set_aside": {
                metric: [aside.to_json() for aside in steps]
                for metric, steps in self.set_aside.items()
            },
        }


def look(runs: Sequence[ArmRun], looks: Looks, min_effect_pct: float, baseline: str) -> Look | None:
    """The look the runs so far allow: None unless they end a half-block and hold MIN_UNITS or
    more."""
    cuts = halves([run.setting for run in runs])
    if cuts is None or len(cuts) < MIN_UNITS:
        return None
    summary = ab_score.summarise(runs, min_effect_pct, False, baseline)
    return _judged(runs, len(cuts), summary, looks)


def _judged(runs: Sequence[ArmRun], units: int, summary: ab_score.Summary, looks: Looks) -> Look:
    """Every delta of the steps of the first `units` half-blocks, judged at the look's level: the
    step's, and each boundary metric's that every one of those steps measured."""
    settings = list(summary.by_setting)
    within = runs[: units * len(settings)]
    index = [settings.index(run.setting) for run in within for _ in run.scored]
    places = [(run.label, k) for run in within for k in range(len(run.scored))]
    step_s = [r.step_s for run in within for r in run.scored]
    baseline_step = summary.settings[settings[0]].median_s
    deltas, scale, aside = _fitted(
        settings, index, step_s, baseline_step, summary.min_effect_s, looks, units
    )
    boundary, set_aside = {}, {STEP: _named(aside, places)} if aside else {}
    for metric, field in BOUNDARY_METRICS.items():
        values = [getattr(r, field) for run in within for r in run.scored]
        if any(v is None for v in values):
            continue
        base = float(np.median([v for v, i in zip(values, index, strict=True) if i == 0]))
        bar = BOUNDARY_MIN_EFFECT * abs(base)
        boundary[metric], _, aside = _fitted(settings, index, values, base, bar, looks, units)
        if aside:
            set_aside[metric] = _named(aside, places)
    return Look(
        units,
        looks.confidence(units),
        deltas,
        units >= looks.max_units,
        scale / baseline_step,
        len(step_s),
        boundary,
        judged_by(within),
        set_aside,
    )


def _named(
    aside: list[tuple[int, float, float | None]], places: list[tuple[str, int]]
) -> list[SetAside]:
    return [SetAside(*places[at], value, scales) for at, value, scales in aside]


def _fitted(
    settings: list[str],
    index: list[int],
    values: Sequence[float],
    baseline_median: float,
    min_effect: float,
    looks: Looks,
    units: int,
) -> tuple[list[Delta], float, list[tuple[int, float, float | None]]]:
    """Each other setting's delta of `values` (the steps' figures in run order, `index` their
    settings') by the robust fit, judged at the look's level; the fit's noise scale; and the
    steps it left out (place in `values`, value, residual in scales)."""
    x, y = robust_fit.design(index, len(settings)), np.asarray(values, dtype=np.float64)
    fitted = robust_fit.fit(x, y)
    beta, errors, df = fitted.beta, fitted.errors, int(fitted.df[0])
    residual = y - x @ beta[0]
    scale = float(fitted.scale[0])
    aside = [
        (int(at), float(y[at]), float(residual[at] / scale) if scale else None)
        for at in np.flatnonzero(fitted.set_aside[0])
    ]
    claim, quiet = looks.claim_quantile(units, df), looks.no_effect_quantile(units, df)
    confidence = looks.confidence(units)
    deltas = []
    for column, setting in enumerate(settings[1:], 1):
        delta, error = float(beta[0, column]), float(errors[0, column])
        deltas.append(
            Delta.judged(
                setting,
                settings[0],
                delta,
                delta - claim * error,
                delta + claim * error,
                baseline_median,
                None,
                min_effect,
                confidence,
                (delta - quiet * error, delta + quiet * error, 1 - 2 * looks.alpha(units)),
            )
        )
    return deltas, scale, aside


def score(runs: Sequence[ArmRun], looks: Looks, *, min_effect_pct: float, baseline: str) -> Score:
    """Score a sequential run: every look its half-blocks allow, the verdict of the first settled
    one (where the run stopped), or of the last."""
    summary = ab_score.summarise(runs, min_effect_pct, False, baseline)
    cuts = halves([run.setting for run in runs])
    if cuts is None or len(cuts) < MIN_UNITS:  # the run loop stops only after a look
        raise ValueError(f"{len(runs)} arms do not end a half-block after {MIN_UNITS} or more")
    taken = []
    for units in range(MIN_UNITS, len(cuts) + 1):
        taken.append(_judged(runs, units, summary, looks))
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
        f"{stop.units} half-blocks, each setting side by side in each; a drift linear in the run"
        " is fitted (one parameter) and taken out of the delta",
        blocks,
        {},
        stop.confidence,
        [each.to_json() for each in taken],
        f"{looks.rule()}. Stopped at the look after half-block {stop.units} of"
        f" {looks.max_units}: {stop.why()}; {stop.noise_text()}",
        stop.boundary,
        _judged_by_text(stop.judged_by),
    )


def _judged_by_text(metric: str) -> str:
    if metric == STEP:
        return "the step: the switch does not act at the update boundary alone"
    return (
        f"the {metric} after the update boundary: the switch acts there (its settings differ in"
        " staging), and the step's verdict says what that is worth to the whole step"
    )
