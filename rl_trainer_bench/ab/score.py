"""A/B scoring: medians and spread per arm, the delta with a bootstrap interval, the noise floor, a verdict.

Step times are not normal (a stray host hiccup makes a long tail), so each arm is summarised by its
median, and a setting by the mean of its arms' medians: averaging arms, rather than pooling their
steps, keeps a mirrored order's cancellation of a drift exact (the pooled median of an early and a
late arm lands anywhere in the gap between them). The interval comes from a bootstrap, stratified
by arm so each arm keeps its own step count; the seed is fixed so the same records always give the
same report. A confidence interval only says the two
arms' steps differ; the noise floor (the same setting run twice in one process) says how far apart
two runs of *nothing changed* land. A change counts only when it clears both, and the rule that
decides is printed with its numbers beside the verdict, so a reader can check it by hand.
The drift of the machine over the run (drift.py) is scored beside the delta, with the design's
answer to it: an order that cancels it, or none.

When the run order is made of balanced blocks (order.py's `blocks`, the default), each block is one
repeat of the whole experiment, and the block, not the step, is the unit: the delta is the mean over
blocks of each block's difference of arm medians, its interval Student's t over blocks. Steps within
an arm share the moment's load, so a bootstrap over steps measures only the jitter within arms and
takes the load that moves between arms for an effect; the range of two arms' medians, the floor
that stood guard, said nothing when both baseline arms sat in the same loaded ends of the run. The
spread of the blocks' differences carries every noise that moves an arm (jitter, a burst of other
work, drift the order left over), so the interval widens with it; the min effect is the bar.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.ab import drift as ab_drift
from rl_trainer_bench.ab import interleave, student_t
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.units import confidence_level, milliseconds

FASTER, SLOWER, NO_EFFECT, NOISY = "FASTER", "SLOWER", "NO-EFFECT", "NOISY"
SEPARATE_ARMS, INTERLEAVED = run_orders.DESIGN, interleave.DESIGN
BLOCKED = run_orders.BLOCKED_DESIGN
SEQUENTIAL = run_orders.SEQUENTIAL_DESIGN
# 99%, not 95%: a 95% interval claims an effect in 1 of 20 runs of nothing changed by construction,
# so a user's batch of A/As, or any bias left by a load, meets or exceeds 1 in 20; at 99% the
# nominal rate is 1 in 100 and a residual bias has room below 1 in 20
# (benchmarks/reports/ab-load-patterns_cpu_2026-12-03.md). The price is a wider interval (t over 5
# degrees of freedom: 4.03 standard errors against 2.57): effects near the min effect come back
# NOISY, and --blocks buys them back.
CONFIDENCE = 0.99
RESAMPLES = 2000
_RULE_MS = ".3g"  # milliseconds in the rule text: three significant digits, sign when negative


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
    """`setting` minus `baseline`, means of arm medians, with its bootstrap interval and verdict."""

    setting: str
    baseline: str
    delta_s: float
    ci_low_s: float
    ci_high_s: float
    baseline_median_s: float
    verdict: str
    reason: str
    # A sequential look's NO-EFFECT interval (`verdict`'s `no_effect_interval`); None: the CI's
    no_effect_low_s: float | None = None
    no_effect_high_s: float | None = None

    @classmethod
    def judged(
        cls,
        setting: str,
        baseline: str,
        delta_s: float,
        ci_low_s: float,
        ci_high_s: float,
        baseline_median_s: float,
        floor_s: float | None,
        min_effect_s: float,
        confidence: float = CONFIDENCE,
        no_effect_interval: tuple[float, float, float] | None = None,
    ) -> Delta:
        """The delta with its verdict, so every design decides by the one rule (`verdict`)."""
        word, reason = verdict(
            delta_s, ci_low_s, ci_high_s, floor_s, min_effect_s, confidence, no_effect_interval
        )
        low, high = (None, None) if no_effect_interval is None else no_effect_interval[:2]
        return cls(
            setting,
            baseline,
            delta_s,
            ci_low_s,
            ci_high_s,
            baseline_median_s,
            word,
            reason,
            low,
            high,
        )

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
    design: str  # SEPARATE_ARMS, BLOCKED or INTERLEAVED: which design produced the verdict
    drift: ab_drift.Drift
    drift_answer: str  # how the design deals with a linear drift (cancels it, or does not)
    blocks: list[list[str]] = dataclasses.field(default_factory=list)  # BLOCKED: arm labels
    # BLOCKED: each block's difference (setting minus baseline), by delta name: the interval's units
    block_differences_s: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    confidence: float = CONFIDENCE  # of the deltas' intervals (a sequential look's: its own)
    # A sequential run (sequential.py): every look taken, and the rule and where it stopped
    looks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stopping: str = ""
    # A sequential run: the update boundary's metrics' deltas (by metric), and which metric the
    # switch is judged by, in words
    boundary: dict[str, list[Delta]] = dataclasses.field(default_factory=dict)
    judged_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "design": self.design,
            "blocks": self.blocks,
            "block_differences_s": self.block_differences_s,
            "drift": self.drift.to_json(),
            "drift_answer": self.drift_answer,
            "arms": {k: dataclasses.asdict(v) for k, v in self.arms.items()},
            "settings": {k: dataclasses.asdict(v) for k, v in self.settings.items()},
            "noise": [dataclasses.asdict(n) for n in self.noise],
            "noise_floor_s": self.noise_floor_s,
            "min_effect_s": self.min_effect_s,
            "cross_pod": self.cross_pod,
            "confidence": self.confidence,
            "looks": self.looks,
            "stopping": self.stopping,
            "judged_by": self.judged_by,
            "boundary": {
                metric: [{**dataclasses.asdict(d), "name": d.name} for d in deltas]
                for metric, deltas in self.boundary.items()
            },
            "bootstrap": {"resamples": RESAMPLES, "stratified_by": "arm", "statistic": "median"},
            "deltas": [
                {**dataclasses.asdict(d), "name": d.name, "delta_pct": d.percent(d.delta_s)}
                for d in self.deltas
            ],
            "rule": self.rule,
        }


def score(
    runs: Sequence[ArmRun],
    *,
    min_effect_pct: float,
    cross_pod: bool = False,
    seed: int = 0,
    baseline: str | None = None,
) -> Score:
    """Score separate arms: every other setting against the baseline (None: the first to run); by
    blocks when the run order is made of balanced blocks (`score_blocks`)."""
    summary = summarise(runs, min_effect_pct, cross_pod, baseline)
    times, by_setting, arms, settings = (
        summary.times,
        summary.by_setting,
        summary.arms,
        summary.settings,
    )
    min_effect_s, drift = summary.min_effect_s, summary.drift
    baseline, *others = by_setting
    blocks = None if cross_pod else run_orders.blocks_of([run.setting for run in runs])
    if blocks is not None:
        labelled = [[runs[i].label for i in block] for block in blocks]
        return score_blocks(runs, arms, settings, labelled, drift, min_effect_s)
    noise = _noise_floors(arms, by_setting)
    floor = None if cross_pod or not noise else max(n.seconds for n in noise)
    deltas = [
        _bootstrapped_delta(times, arms, by_setting, setting, settings, floor, min_effect_s, rng)
        for setting, rng in zip(
            others, (np.random.default_rng([seed, i]) for i in range(len(others))), strict=True
        )
    ]
    return Score(
        arms,
        settings,
        noise,
        floor,
        min_effect_s,
        cross_pod,
        deltas,
        rule_text(floor, min_effect_s, cross_pod),
        SEPARATE_ARMS,
        drift,
        _drift_answer(runs, cross_pod),
    )


@dataclasses.dataclass(frozen=True)
class Summary:
    """What every design scores from: the scored steps by arm and by setting (baseline first),
    their spreads, the min effect in seconds and the drift of the run."""

    times: dict[str, list[float]]  # scored step seconds by arm label
    by_setting: dict[str, list[str]]  # arm labels by setting, the baseline's first
    arms: dict[str, Spread]
    settings: dict[str, Spread]
    min_effect_s: float
    drift: ab_drift.Drift


def summarise(
    runs: Sequence[ArmRun], min_effect_pct: float, cross_pod: bool, baseline: str | None
) -> Summary:
    """The runs' spreads by arm and setting, the min effect and the drift (see `Summary`)."""
    times = _scored_times(runs)
    by_setting = _labels_by_setting(runs, baseline)
    arms = {label: Spread.of(t) for label, t in times.items()}
    settings = {
        s: Spread.of([x for lb in labels for x in times[lb]]) for s, labels in by_setting.items()
    }
    min_effect_s = min_effect_pct / 100.0 * settings[next(iter(by_setting))].median_s
    drift = ab_drift.measure(
        ab_drift.timed_steps(runs, shared_clock=not cross_pod),
        baseline=next(iter(by_setting)),
        shared_clock=not cross_pod,
        min_effect_s=min_effect_s,
    )
    return Summary(times, by_setting, arms, settings, min_effect_s, drift)


def _bootstrapped_delta(
    times: dict[str, list[float]],
    arms: dict[str, Spread],
    by_setting: dict[str, list[str]],
    setting: str,
    settings: dict[str, Spread],
    floor_s: float | None,
    min_effect_s: float,
    rng: np.random.Generator,
) -> Delta:
    """`setting` against the baseline (by_setting's first) with its bootstrap interval."""
    baseline = next(iter(by_setting))
    low, high = _bootstrap_interval(
        [times[lb] for lb in by_setting[baseline]],
        [times[lb] for lb in by_setting[setting]],
        rng,
    )
    delta = _mean_of_arm_medians(arms, by_setting[setting]) - _mean_of_arm_medians(
        arms, by_setting[baseline]
    )
    return Delta.judged(
        setting, baseline, delta, low, high, settings[baseline].median_s, floor_s, min_effect_s
    )


def score_blocks(
    runs: Sequence[ArmRun],
    arms: dict[str, Spread],
    settings: dict[str, Spread],
    blocks: list[list[str]],
    drift: ab_drift.Drift,
    min_effect_s: float,
) -> Score:
    """Score a run of balanced blocks (arm labels per block, in run order): for every later
    setting, each block's mean of its arm medians minus the baseline's, then the mean over blocks
    with Student's t interval (`t_interval`); the min effect is the bar."""
    setting_of = {run.label: run.setting for run in runs}
    baseline, *others = settings
    deltas, differences = [], {}
    for setting in others:
        units = [
            _block_mean(arms, setting_of, block, setting)
            - _block_mean(arms, setting_of, block, baseline)
            for block in blocks
        ]
        delta, low, high = t_interval(units)
        deltas.append(
            Delta.judged(
                setting, baseline, delta, low, high, settings[baseline].median_s, None, min_effect_s
            )
        )
        differences[deltas[-1].name] = units
    return Score(
        arms,
        settings,
        [],
        None,
        min_effect_s,
        False,
        deltas,
        rule_text(None, min_effect_s, False, BLOCKED),
        BLOCKED,
        drift,
        run_orders.describe([run.setting for run in runs]),
        blocks,
        differences,
    )


def _block_mean(
    arms: dict[str, Spread], setting_of: dict[str, str], block: Sequence[str], setting: str
) -> float:
    return _mean_of_arm_medians(arms, [label for label in block if setting_of[label] == setting])


def t_interval(
    differences: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """The mean of independent differences and its `confidence` interval by Student's t: the right
    width for a handful of units, where a bootstrap over them is far too narrow."""
    x = np.asarray(differences, dtype=np.float64)
    mean = float(np.mean(x))
    standard_error = float(np.std(x, ddof=1)) / math.sqrt(len(x))
    half_width = student_t.t_quantile(0.5 + confidence / 2, len(x) - 1) * standard_error
    return mean, mean - half_width, mean + half_width


def _scored_times(runs: Sequence[ArmRun]) -> dict[str, list[float]]:
    """Scored step seconds by arm label; an arm with none has no median, so it is refused."""
    times = {run.label: [r.step_s for r in run.scored] for run in runs}
    empty = [label for label, t in times.items() if not t]
    if empty:
        raise UserError(f"arm(s) {', '.join(empty)} have no scored steps; run with --steps >= 1")
    return times


def _labels_by_setting(runs: Sequence[ArmRun], baseline: str | None) -> dict[str, list[str]]:
    """Arm labels by setting, baseline first (None: the first to run; a blocks order may start
    with any setting); one setting alone has nothing to compare against."""
    by_setting: dict[str, list[str]] = {} if baseline is None else {baseline: []}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run.label)
    if len(by_setting) < 2:
        raise UserError("an A/B needs at least two different settings")
    return by_setting


def _noise_floors(arms: dict[str, Spread], by_setting: dict[str, list[str]]) -> list[NoiseFloor]:
    """How far apart the arms of each repeated setting landed: what *nothing changed* looks like."""
    return [
        NoiseFloor(s, tuple(labels), _range([arms[lb].median_s for lb in labels]))
        for s, labels in by_setting.items()
        if len(labels) > 1
    ]


def _drift_answer(runs: Sequence[ArmRun], cross_pod: bool) -> str:
    """How the run order deals with a linear drift; separate pods share no clock to measure one."""
    if cross_pod:
        return "separate pods: no shared clock, a drift between them is not measured"
    return run_orders.balance([run.setting for run in runs]).describe()


def _bootstrap_interval(
    baseline: Sequence[Sequence[float]],
    setting: Sequence[Sequence[float]],
    rng: np.random.Generator,
) -> tuple[float, float]:
    """The CONFIDENCE interval of setting minus baseline (means of arm medians), by bootstrap."""
    a = _bootstrap_arm_medians(baseline, rng)
    b = _bootstrap_arm_medians(setting, rng)
    low, high = np.percentile(b - a, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return float(low), float(high)


def verdict(
    delta_s: float,
    ci_low_s: float,
    ci_high_s: float,
    floor_s: float | None,
    min_effect_s: float,
    confidence: float = CONFIDENCE,
    no_effect_interval: tuple[float, float, float] | None = None,
) -> tuple[str, str]:
    """The verdict word and the numbers that decided it (see `rule_text`). `no_effect_interval`
    (low, high, its confidence): the interval NO-EFFECT is judged by where it is not the CI (a
    sequential look's: each side one-sided at the look's level, two one-sided tests)."""
    bar = min_effect_s if floor_s is None else floor_s
    bar_name = "min effect" if floor_s is None else "noise floor"
    ci = f"{confidence_level(confidence)} CI [{milliseconds(ci_low_s, _RULE_MS)}, {milliseconds(ci_high_s, _RULE_MS)}] ms"
    quiet_low, quiet_high = ci_low_s, ci_high_s
    quiet = ci
    if no_effect_interval is not None:
        quiet_low, quiet_high, level = no_effect_interval
        quiet = (
            f"NO-EFFECT interval ({confidence_level(level)}) [{milliseconds(quiet_low, _RULE_MS)},"
            f" {milliseconds(quiet_high, _RULE_MS)}] ms"
        )
    if (ci_low_s > 0 or ci_high_s < 0) and abs(delta_s) > bar:
        word = FASTER if delta_s < 0 else SLOWER
        return (
            word,
            f"{ci} excludes 0 and |delta| {milliseconds(abs(delta_s), _RULE_MS)} ms > {bar_name} {milliseconds(bar, _RULE_MS)} ms",
        )
    if bar <= min_effect_s and -min_effect_s <= quiet_low and quiet_high <= min_effect_s:
        return (
            NO_EFFECT,
            f"{quiet} and {bar_name} {milliseconds(bar, _RULE_MS)} ms lie within min effect +-{milliseconds(min_effect_s, _RULE_MS)} ms",
        )
    not_moved = f"{ci} includes 0" if ci_low_s <= 0 <= ci_high_s else ""
    not_moved = (
        not_moved
        or f"|delta| {milliseconds(abs(delta_s), _RULE_MS)} ms <= {bar_name} {milliseconds(bar, _RULE_MS)} ms"
    )
    undecided = (
        f"{bar_name} {milliseconds(bar, _RULE_MS)} ms > min effect {milliseconds(min_effect_s, _RULE_MS)} ms"
        if bar > min_effect_s
        else f"the {'CI' if no_effect_interval is None else 'NO-EFFECT interval'} reaches past"
        f" min effect +-{milliseconds(min_effect_s, _RULE_MS)} ms"
    )
    return NOISY, f"{not_moved}, and {undecided}"


def rule_text(
    floor_s: float | None,
    min_effect_s: float,
    cross_pod: bool,
    design: str = SEPARATE_ARMS,
    confidence: float = CONFIDENCE,
) -> str:
    """The verdict rule, with this run's numbers, as printed beside the verdict."""
    if floor_s is None:
        why = (
            "cross-pod: no shared noise floor"
            if cross_pod
            else "the interval over blocks carries the noise"
            if design in (BLOCKED, SEQUENTIAL)
            else "no repeated arm: no noise floor"
        )
        bar = f"min effect {milliseconds(min_effect_s, _RULE_MS)} ms (stands in for the noise floor; {why})"
    else:
        bar = f"noise floor {milliseconds(floor_s, _RULE_MS)} ms"
    interval = _INTERVALS.get(design, "bootstrap CI of the delta (mean of arm medians)")
    quiet = (
        "the NO-EFFECT interval (each side one-sided at the look's level: two one-sided tests)"
        if design == SEQUENTIAL
        else "the CI"
    )
    return (
        f"FASTER/SLOWER if the {confidence_level(confidence)} {interval} "
        f"excludes 0 and "
        f"|delta| > {bar}; NO-EFFECT if that bar and {quiet} lie within min effect "
        f"+-{milliseconds(min_effect_s, _RULE_MS)} ms; otherwise NOISY. Any failed exact check: FAIL."
    )


_INTERVALS = {
    INTERLEAVED: "Student's t CI of the delta (mean over pairs of blocks of the paired difference)",
    BLOCKED: "Student's t CI of the delta (mean over blocks of each block's difference of arm "
    "medians)",
    SEQUENTIAL: "CI of the stopping look (every scored step a datum: Huber's robust fit of a "
    "level, the effect and a linear drift, Student's t over the steps' degrees of freedom)",
}


def score_interleaved(
    run: ArmRun, schedule: interleave.Schedule, *, min_effect_pct: float
) -> Score:
    """Score one interleaved run: the delta is the mean over units (aligned pairs of blocks, see
    interleave.py) of each unit's mean paired difference (the other setting's pure step minus the
    baseline's), its interval Student's t over units. A run has few units (four by default), and a
    bootstrap over four values is far too narrow (it said FASTER in 3 of 20 A/A runs, see
    benchmarks/reports/ab-error-rates_cpu_2026-12-01.md); t's interval widens with few units and
    with a stray slow step, and then the verdict is NOISY rather than wrong. There is no repeated
    arm, so the min effect stands in for the noise floor."""
    times = {r.step: r.step_s for r in run.records if not r.warmup}
    missing = [step for pair in schedule.pairs for step in pair if step not in times]
    if missing:
        raise UserError(f"interleaved run lacks scored step(s) {missing[:5]}: rerun it")
    baseline, other = schedule.settings
    views = interleave.paired_steps_by_setting(run, schedule)
    arms = {view.label: Spread.of([r.step_s for r in view.records]) for view in views}
    delta, low, high = t_interval(
        [float(np.mean([times[b] - times[a] for a, b in unit])) for unit in schedule.units]
    )
    min_effect_s = min_effect_pct / 100.0 * arms[baseline].median_s
    step_settings = {(run.label, r.step): schedule.setting_of_step(r.step) for r in run.records}
    drift = ab_drift.measure(
        ab_drift.timed_steps([run], shared_clock=True, setting_of_step=step_settings),
        baseline=baseline,
        shared_clock=True,
        min_effect_s=min_effect_s,
    )
    drift = dataclasses.replace(drift, bias_s={other: drift.bias_s.get(other, 0.0)})
    return Score(
        arms,
        dict(arms),
        [],
        None,
        min_effect_s,
        False,
        [
            Delta.judged(
                other,
                baseline,
                delta,
                float(low),
                float(high),
                arms[baseline].median_s,
                None,
                min_effect_s,
            )
        ],
        rule_text(None, min_effect_s, False, INTERLEAVED),
        INTERLEAVED,
        drift,
        "each pair is two steps apart, AABB and BBAA blocks balanced in pairs: "
        "a linear drift cancels at the scale of a step",
    )


def _mean_of_arm_medians(arms: dict[str, Spread], labels: Sequence[str]) -> float:
    return float(np.mean([arms[label].median_s for label in labels]))


def _bootstrap_arm_medians(
    groups: Sequence[Sequence[float]], rng: np.random.Generator
) -> np.ndarray:
    """RESAMPLES bootstrap values of the mean of arm medians, each arm resampled within itself."""
    medians = []
    for group in groups:
        x = np.asarray(group, dtype=np.float64)
        medians.append(np.median(x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))], axis=1))
    return np.mean(medians, axis=0)


def _range(values: Sequence[float]) -> float:
    return float(max(values) - min(values))
