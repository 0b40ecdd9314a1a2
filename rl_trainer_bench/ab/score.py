"""A/B scoring: medians and spread per arm, the delta with a bootstrap interval, the noise floor, a verdict.

Step times are not normal (a stray host hiccup makes a long tail), so everything is a median and the
interval comes from a bootstrap, stratified by arm so each arm keeps its own step count; the seed is
fixed so the same records always give the same report. A confidence interval only says the two
arms' steps differ; the noise floor (the same setting run twice in one process) says how far apart
two runs of *nothing changed* land. A change counts only when it clears both, and the rule that
decides is printed with its numbers beside the verdict, so a reader can check it by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.ab.arms import ArmRun
from rl_trainer_bench.errors import UserError

FASTER, SLOWER, NO_EFFECT, NOISY = "FASTER", "SLOWER", "NO-EFFECT", "NOISY"
CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median and spread of step seconds (scored steps only)."""

    steps: int
    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread:
        x = np.asarray(seconds, dtype=np.float64)
        q25, median, q75 = np.percentile(x, [25, 50, 75])
        return cls(len(x), float(median), float(q25), float(q75), float(x.min()), float(x.max()))

    @property
    def iqr_s(self) -> float:
        return self.q75_s - self.q25_s


@dataclasses.dataclass(frozen=True)
class NoiseFloor:
    """How far apart the runs of one setting landed: max minus min of their medians."""

    setting: str
    labels: tuple[str, ...]
    seconds: float


@dataclasses.dataclass(frozen=True)
class Delta:
    """`setting` minus `baseline`, pooled medians, with its bootstrap interval and verdict."""

    setting: str
    baseline: str
    delta_s: float
    ci_low_s: float
    ci_high_s: float
    baseline_median_s: float
    verdict: str
    reason: str

    @property
    def name(self) -> str:
        return f"{self.setting}-{self.baseline}"

    def percent(self, seconds: float) -> float:
        return 100.0 * seconds / self.baseline_median_s


@dataclasses.dataclass(frozen=True)
class Score:
    arms: dict[str, Spread]  # by arm label
    settings: dict[str, Spread]  # by setting, all its arms' scored steps pooled
    noise: list[NoiseFloor]  # one per repeated setting
    noise_floor_s: float | None  # the largest of them; None without a repeat (or across pods)
    min_effect_s: float
    cross_pod: bool
    deltas: list[Delta]
    rule: str

    def to_json(self) -> dict[str, Any]:
        return {
            "arms": {k: dataclasses.asdict(v) for k, v in self.arms.items()},
            "settings": {k: dataclasses.asdict(v) for k, v in self.settings.items()},
            "noise": [dataclasses.asdict(n) for n in self.noise],
            "noise_floor_s": self.noise_floor_s,
            "min_effect_s": self.min_effect_s,
            "cross_pod": self.cross_pod,
            "confidence": CONFIDENCE,
            "bootstrap": {"resamples": RESAMPLES, "stratified_by": "arm", "statistic": "median"},
            "deltas": [
                {**dataclasses.asdict(d), "name": d.name, "delta_pct": d.percent(d.delta_s)}
                for d in self.deltas
            ],
            "rule": self.rule,
        }


def score(
    runs: Sequence[ArmRun], *, min_effect_pct: float, cross_pod: bool = False, seed: int = 0
) -> Score:
    """Score arms: every later setting against the first one (the baseline)."""
    times = {run.label: [r.step_s for r in run.scored] for run in runs}
    empty = [label for label, t in times.items() if not t]
    if empty:
        raise UserError(f"arm(s) {', '.join(empty)} have no scored steps; run with --steps >= 1")
    by_setting: dict[str, list[str]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run.label)
    if len(by_setting) < 2:
        raise UserError("an A/B needs at least two different settings")

    arms = {label: Spread.of(t) for label, t in times.items()}
    settings = {
        s: Spread.of([x for lb in labels for x in times[lb]]) for s, labels in by_setting.items()
    }
    noise = [
        NoiseFloor(s, tuple(labels), _range([arms[lb].median_s for lb in labels]))
        for s, labels in by_setting.items()
        if len(labels) > 1
    ]
    floor = None if cross_pod or not noise else max(n.seconds for n in noise)
    baseline, *others = by_setting
    min_effect_s = min_effect_pct / 100.0 * settings[baseline].median_s

    deltas = []
    for index, setting in enumerate(others):
        rng = np.random.default_rng([seed, index])
        a = _bootstrap_medians([times[lb] for lb in by_setting[baseline]], rng)
        b = _bootstrap_medians([times[lb] for lb in by_setting[setting]], rng)
        low, high = np.percentile(b - a, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
        delta = settings[setting].median_s - settings[baseline].median_s
        word, reason = verdict(delta, float(low), float(high), floor, min_effect_s)
        deltas.append(
            Delta(
                setting,
                baseline,
                delta,
                float(low),
                float(high),
                settings[baseline].median_s,
                word,
                reason,
            )
        )
    return Score(
        arms,
        settings,
        noise,
        floor,
        min_effect_s,
        cross_pod,
        deltas,
        rule_text(floor, min_effect_s, cross_pod),
    )


def verdict(
    delta_s: float, ci_low_s: float, ci_high_s: float, floor_s: float | None, min_effect_s: float
) -> tuple[str, str]:
    """The verdict word and the numbers that decided it (see `rule_text`)."""
    bar = min_effect_s if floor_s is None else floor_s
    bar_name = "min effect" if floor_s is None else "noise floor"
    ci = f"{CONFIDENCE:.0%} CI [{_ms(ci_low_s)}, {_ms(ci_high_s)}] ms"
    if (ci_low_s > 0 or ci_high_s < 0) and abs(delta_s) > bar:
        word = FASTER if delta_s < 0 else SLOWER
        return (
            word,
            f"{ci} excludes 0 and |delta| {_ms(abs(delta_s))} ms > {bar_name} {_ms(bar)} ms",
        )
    if bar <= min_effect_s and -min_effect_s <= ci_low_s and ci_high_s <= min_effect_s:
        return (
            NO_EFFECT,
            f"{ci} and {bar_name} {_ms(bar)} ms lie within min effect +-{_ms(min_effect_s)} ms",
        )
    not_moved = f"{ci} includes 0" if ci_low_s <= 0 <= ci_high_s else ""
    not_moved = not_moved or f"|delta| {_ms(abs(delta_s))} ms <= {bar_name} {_ms(bar)} ms"
    undecided = (
        f"{bar_name} {_ms(bar)} ms > min effect {_ms(min_effect_s)} ms"
        if bar > min_effect_s
        else f"the CI reaches past min effect +-{_ms(min_effect_s)} ms"
    )
    return NOISY, f"{not_moved}, and {undecided}"


def rule_text(floor_s: float | None, min_effect_s: float, cross_pod: bool) -> str:
    """The verdict rule, with this run's numbers, as printed beside the verdict."""
    if floor_s is None:
        why = "cross-pod: no shared noise floor" if cross_pod else "no repeated arm: no noise floor"
        bar = f"min effect {_ms(min_effect_s)} ms (stands in for the noise floor; {why})"
    else:
        bar = f"noise floor {_ms(floor_s)} ms"
    return (
        f"FASTER/SLOWER if the {CONFIDENCE:.0%} bootstrap CI of the median delta excludes 0 and "
        f"|delta| > {bar}; NO-EFFECT if that bar and the CI lie within min effect "
        f"+-{_ms(min_effect_s)} ms; otherwise NOISY. Any failed exact check: FAIL."
    )


def _bootstrap_medians(groups: Sequence[Sequence[float]], rng: np.random.Generator) -> np.ndarray:
    """Medians of RESAMPLES pooled resamples, each arm resampled within itself."""
    samples = []
    for group in groups:
        x = np.asarray(group, dtype=np.float64)
        samples.append(x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))])
    return np.median(np.concatenate(samples, axis=1), axis=1)


def _range(values: Sequence[float]) -> float:
    return float(max(values) - min(values))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.3g}" if seconds < 0 else f"{seconds * 1e3:.3g}"
