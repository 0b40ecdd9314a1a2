"""The A/B's design sized by a budget: how many blocks of how long turns, what that costs in steps
and pod time, and the smallest effect it resolves at that cost.

On the CPU a step is milliseconds and the defaults can be generous; on 128 chips a step is ~100 s
and the CPU's 6 blocks of 3-step turns with warm-ups per turn cost hours. So the design is sized
by a budget (`--budget`, AB_BUDGET in a pod): scored steps per setting, or minutes of the pod's
time, with defaults fitted to the platform (`PLATFORMS`). Every arm's programs are compiled and
warmed once, up front, so warm-ups are counted per program set, not per turn. The budget buys
blocks: each block runs every setting for two turns (order.py), so a setting's scored steps are
blocks x 2 x steps per turn, and with steps that are independent draws the narrowest interval
for a budget comes from the most blocks of the shortest turns (the t quantile falls with each
block's degree of freedom, the median of a turn narrows only with the root of its steps).

The price of the design is printed before launch (the render summary, `plan`, the `ab` log): its
blocks and turns, its scored and warm-up steps, its pod time from a named step-time source (a
prior run's log or results.jsonl, `aot`'s estimate in its JSON report, or a figure), and the
smallest effect it resolves at a named step noise (from a prior run, or stated as assumed),
derived from the scoring rule itself (resolution.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import resolution, sequential_forecast
from rl_trainer_bench.ab.arms import base_knobs
from rl_trainer_bench.ab.parser import (
    BUDGET_FORMS,
    DEFAULT_STEPS,
    DESIGN_ARMS,
    STOP_BUDGET,
    STOP_SETTLED,
)
from rl_trainer_bench.ab.score import CONFIDENCE
from rl_trainer_bench.ab.sequential import Looks
from rl_trainer_bench.bench import step_record
from rl_trainer_bench.bench.results_file import read_results
from rl_trainer_bench.bench.step_record import StepRecord
from rl_trainer_bench.config import knobs as config
from rl_trainer_bench.config.engine_choice import MAXTEXT_WARMUP_STEPS
from rl_trainer_bench.errors import ConfigError, UserError
from rl_trainer_bench.io import read_user_text

CPU, ACCELERATOR = "CPU", "accelerator"
FIGURE_FORMS = "a figure, optionally with where it comes from in brackets, or a file"
_FIGURE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|%|B)?\s*(?:\((.*)\))?\s*")
_MINUTES = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(?:min|m)\s*")
# A robust standard deviation from a median absolute value (normal draws): 1 / 0.6745.
_MAD_TO_SD = 1.4826


@dataclasses.dataclass(frozen=True)
class Figure:
    """A number with where it comes from: seconds of a step, the step noise as a fraction, or
    bytes."""

    value: float
    source: str  # in words; a figure nobody measured says ASSUMED

    def text(self, unit: str) -> str:
        """The figure as a knob takes it back (`100.2s (median of ...)`): what a render exports
        to its pod, so the pod names the same source."""
        shown = {"s": f"{self.value:.6g}s", "%": f"{100 * self.value:.6g}%"}.get(unit)
        shown = shown or f"{round(self.value)}B"
        return f"{shown} ({self.source})"


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the design may spend: scored steps per setting, or minutes of the pod's time."""

    scored_steps: int | None = None
    minutes: float | None = None

    def describe(self) -> str:
        if self.minutes is not None:
            return f"{self.minutes:g} minutes of the pod's time"
        return f"{self.scored_steps} scored steps per setting"


@dataclasses.dataclass(frozen=True)
class Platform:
    """The defaults of the machine the arms run on."""

    name: str
    budget: Budget | None  # None: order.DEFAULT_BLOCKS blocks of turn_steps
    turn_steps: int  # scored steps per turn
    min_effect_pct: float
    noise: Figure  # the step noise assumed where no prior run gives one
    stop: str  # STOP_SETTLED or STOP_BUDGET: whether the blocks order stops when settled


PLATFORMS = {
    # The CPU's milliseconds steps are cheap and noisy: 6 blocks of --steps turns (3 by default),
    # the earlier defaults, and the spread of the main job's run on the 2-core machine (README: a 99% interval of
    # +-7 ms over 6 blocks of a 150 ms step is about 4% per step). Its runs are seconds, so they
    # take the whole budget: the fixed design's single look has the narrowest last interval.
    CPU: Platform(
        CPU,
        None,
        3,
        2.0,
        Figure(0.04, "ASSUMED: the 2-core development machine's main-job run"),
        STOP_BUDGET,
    ),
    # A 128-chip step is ~100 s, a one-chip v5e step ~2 s: at most 8 scored steps per setting in
    # 4 blocks of 1-step turns; pods of one slice agree within 0.1-0.2% and a same-pod A/B's steps
    # scatter by about 0.15% (0.2% on the v5e chip), so the noise assumed is 0.3%. Its steps are
    # what the A/B costs, so it stops when the verdict is settled (sequential.py): the budget is
    # the most it spends, and 8 rather than 12 leaves the looks up to the sixth step 83% of the
    # error rate, not 66% (sequential.SPENDING): settled sooner where nothing changed.
    ACCELERATOR: Platform(
        ACCELERATOR,
        Budget(scored_steps=8),
        1,
        0.5,
        Figure(0.003, "ASSUMED: twice the ~0.15% of same-pod runs on one slice"),
        STOP_SETTLED,
    ),
}


def platform_of(preset: config.Preset, base: dict[str, str]) -> Platform:
    """The CPU for a host preset (its mesh forced onto CPU devices) unless the knobs name a slice;
    an accelerator otherwise."""
    on_slice = bool(base.get("TRAINER_SLICE", "").strip())
    return PLATFORMS[CPU if preset.host_devices and not on_slice else ACCELERATOR]


def parse_budget(text: str, name: str = "--budget") -> Budget:
    """`12` (scored steps per setting) or `45min` (pod minutes); ConfigError naming the forms."""
    minutes = _MINUTES.fullmatch(text)
    if minutes and float(minutes.group(1)) > 0:
        return Budget(minutes=float(minutes.group(1)))
    if text.strip().isdigit() and 0 < int(text) <= config.MAX_STEPS:
        return Budget(scored_steps=int(text))
    raise ConfigError(f"{name}={text!r}: give {BUDGET_FORMS}")


def parse_step_time(text: str, name: str = "--step-time") -> tuple[Figure, Figure | None]:
    """The step time and, from a prior run, its noise: `100s`, `100.2s (a source)`, or a file (a
    prior run's pod log or results.jsonl, or `aot`'s JSON report)."""
    figure = parse_figure(text, "s")
    if figure is not None:
        return Figure(figure[0], figure[1] or f"given by {name}"), None
    return _from_file(Path(text), name)


def parse_step_noise(text: str, name: str = "--step-noise") -> Figure:
    """The step noise: `0.15%`, `0.15% (a source)`, or a prior run's pod log or results.jsonl."""
    figure = parse_figure(text, "%")
    if figure is not None:
        value, source = figure
        if not 0 < value < 1:
            raise ConfigError(f"{name}={text!r}: give a percent of the step between 0 and 100")
        return Figure(value, source or f"given by {name}")
    _, noise = _from_file(Path(text), name)
    if noise is None:
        raise UserError(f"{name}={text}: it holds fewer than 3 steps; a noise needs 3 or more")
    return noise


def parse_figure(text: str, unit: str) -> tuple[float, str] | None:
    """(value, source or "") of a figure in `unit` (s, B; a % read as a fraction), or None."""
    match = _FIGURE.fullmatch(text)
    if match is None or (match.group(2) or unit) != unit:
        return None
    value = float(match.group(1)) / (100 if unit == "%" else 1)
    if value <= 0:
        raise ConfigError(f"{text!r}: a step's figure must be above 0")
    return value, (match.group(3) or "").strip()


def _from_file(path: Path, name: str) -> tuple[Figure, Figure | None]:
    """The median scored step and its noise from a prior run (its results.jsonl, one JSON record a
    line, or its pod log), or aot's estimate from its report (one JSON object)."""
    text = read_user_text(path, name)
    if path.suffix != ".jsonl" and text.lstrip().startswith("{"):
        return _aot_estimate(text, path, name), None
    try:
        records = read_results(path) if path.suffix == ".jsonl" else step_record.parse(text).records
    except (KeyError, TypeError, ValueError):
        records = []
    scored = [r for r in records if not r.warmup]
    if not scored:
        raise UserError(
            f"{name}={path}: no scored step in it; give a pod log or results.jsonl of a prior run,"
            f" aot's JSON report, or {FIGURE_FORMS}"
        )
    seconds = float(np.median([r.step_s for r in scored]))
    time = Figure(seconds, f"median of {len(scored)} scored steps of {path}")
    return time, _noise(scored, seconds, path)


def _aot_estimate(text: str, path: Path, name: str) -> Figure:
    """aot's predicted step: its report's, or an `aot --ab-arms` report's first program set's
    (the baseline's, whose steps the pod time is reckoned in)."""
    try:
        report = json.loads(text)
        if "program_sets" in report:
            report = report["program_sets"][0]["report"]
        seconds = (report.get("time_estimate") or {}).get("step_seconds")
    except (json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError):
        seconds = None
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise UserError(
            f"{name}={path}: this aot report has no predicted step (aot predicts one on a chip"
            " whose peak is in the chip table); give a prior run's log or a figure"
        )
    return Figure(float(seconds), f"aot's roofline ESTIMATE in {path}, not a measurement")


def _noise(scored: Sequence[StepRecord], median: float, path: Path) -> Figure | None:
    """The step noise of a prior run as a fraction of its median step: the robust spread of the
    differences of consecutive steps of one arm (a drift barely moves a neighbour), over root 2."""
    differences = [
        later.step_s - earlier.step_s
        for earlier, later in itertools.pairwise(scored)
        if later.arm == earlier.arm and later.step == earlier.step + 1
    ]
    if len(differences) < 2:
        return None
    spread = _MAD_TO_SD * float(np.median(np.abs(differences))) / math.sqrt(2)
    return Figure(spread / median, f"spread of consecutive steps of {path}")


@dataclasses.dataclass(frozen=True)
class Design:
    """The blocks design the budget buys, and what it costs and resolves."""

    settings: tuple[str, ...]
    blocks: int
    turn_steps: int
    budget: Budget | None  # None: the blocks were given (--blocks) or are the CPU's default
    budget_source: str
    step_time: Figure | None
    noise: Figure
    min_effect_pct: float
    # each program set's warm-up steps, once up front, as its run takes them (arms whose programs
    # differ are compiled and warmed apart; `one_state.warm_ups`: a set whose arms stage warms
    # each stage too); set once the arms are planned (`AbRun.planned_lines`)
    set_warmups: tuple[int, ...] = ()
    looks: Looks | None = None  # stops when settled (sequential.py); None: the whole budget
    expected_effects: tuple[float, ...] = ()  # percent: the effects the plan forecasts

    @property
    def scored_per_setting(self) -> int:
        return 2 * self.blocks * self.turn_steps

    @property
    def warmups(self) -> int:
        return sum(self.set_warmups)

    def _warmup_words(self) -> str:
        if len(set(self.set_warmups)) == 1:
            return f"{self.set_warmups[0]} per program set x {len(self.set_warmups)}"
        return "per program set " + ", ".join(str(n) for n in self.set_warmups)

    @property
    def total_steps(self) -> int:
        return len(self.settings) * self.scored_per_setting + self.warmups

    def smallest_effect_pct(self) -> float:
        noise_pct = 100 * self.noise.value
        return resolution.smallest_effect(
            noise_pct, self.blocks, self.turn_steps, self.min_effect_pct
        )

    def false_claim_rate(self) -> float:
        noise_pct = 100 * self.noise.value
        return resolution.claim_rate(
            0.0, noise_pct, self.blocks, self.turn_steps, self.min_effect_pct
        )

    def lines(self) -> list[str]:
        """The design, its cost and what it resolves, as the render, `plan` and `ab` print them."""
        if self.looks is None:
            return [self._design_line(), self._time_line(), self._resolution_line()]
        rule = f"A/B stops when settled: {self.looks.rule()}"
        if not sequential_forecast.runs_for(self.looks, self.turn_steps):
            return [
                self._design_line(),
                rule,
                f"A/B expected stop: not simulated for {self.looks.max_units} half-blocks of"
                f" {self.turn_steps}-step turns (a forecast's cost grows with the square of the"
                f" budget); at most {self.scored_per_setting} scored steps per setting",
                self._time_line(),
            ]
        return [
            self._design_line(),
            rule,
            self._expected_line(),
            self._expected_time_line(),
            self._sequential_resolution_line(),
        ]

    def _design_line(self) -> str:
        settings = len(self.settings)
        most = "" if self.looks is None else "at most "
        return (
            f"A/B design: {most}{self.blocks} blocks, each setting two turns of {self.turn_steps}"
            f" scored step(s) per block: {most}{self.scored_per_setting} scored steps per setting"
            f" x {settings} settings = {settings * self.scored_per_setting}, and {self.warmups}"
            f" warm-up steps ({self._warmup_words()}, once, up front); {most}{self.total_steps}"
            f" steps in all, by {self.budget_source}"
        )

    @functools.cached_property
    def forecasts(self) -> list[sequential_forecast.Forecast]:
        """The sequential design's simulated runs at no effect and at each expected effect (the
        min effect when none is given)."""
        assert self.looks is not None
        effects = (0.0, *(self.expected_effects or (self.min_effect_pct,)))
        return [
            sequential_forecast.forecast(
                self.looks, effect, 100 * self.noise.value, self.turn_steps, self.min_effect_pct
            )
            for effect in effects
        ]

    def steps_at(self, units: float) -> float:
        """Steps in all (warm-ups included) of a run that stops after `units` half-blocks."""
        return len(self.settings) * units * self.turn_steps + self.warmups

    def _expected_line(self) -> str:
        def at(forecast: sequential_forecast.Forecast) -> str:
            found = (
                f"NO-EFFECT in {_rate(forecast.no_effect)}"
                if forecast.effect == 0
                else f"claimed in {_rate(forecast.claimed)}"
            )
            where = (
                "with no effect" if forecast.effect == 0 else f"at a {forecast.effect:g}% effect"
            )
            return (
                f"{where}, {forecast.mean_units * self.turn_steps:.3g} scored steps per setting on"
                f" average, {forecast.share_units * self.turn_steps} or fewer in"
                f" {sequential_forecast.SHARE:.0%} of runs ({found})"
            )

        return (
            f"A/B expected stop (ESTIMATE:"
            f" {sequential_forecast.runs_for(self.looks, self.turn_steps)} simulated runs of"
            f" independent normal steps at {_noise_text(self.noise)}, each look judged by the"
            " run's own fit and rule): "
            + "; ".join(at(each) for each in self.forecasts)
            + f"; at most {self.scored_per_setting}"
        )

    def _expected_time_line(self) -> str:
        if self.step_time is None:
            return self._time_line()
        step = self.step_time.value

        def at(forecast: sequential_forecast.Forecast) -> str:
            steps = self.steps_at(forecast.mean_units)
            name = "no effect" if forecast.effect == 0 else f"{forecast.effect:g}%"
            return f"{steps:.3g} steps = {steps * step / 60:.1f} min at {name}"

        expected = ", ".join(at(each) for each in self.forecasts)
        return (
            f"A/B pod time: expected {expected}; at most {self.total_steps} steps x {step:.4g} s ="
            f" {self.total_steps * step / 60:.1f} min (ESTIMATE; step time:"
            f" {self.step_time.source}), plus start-up and compiles"
        )

    def _sequential_resolution_line(self) -> str:
        noise = 100 * self.noise.value
        smallest = sequential_forecast.smallest_effect(
            self.looks, noise, self.turn_steps, self.min_effect_pct
        )
        return (
            f"A/B resolves: an effect of {smallest:.3g}% of the step or more is claimed in"
            f" {resolution.RESOLVED:.0%} of simulated runs by the verdict's rule at each look's"
            f" level (min effect {self.min_effect_pct:g}%), at {_noise_text(self.noise)}; with no"
            f" effect an effect is claimed in {_rate(self.forecasts[0].claimed)} of them (the"
            f" spending keeps it at most {1 - CONFIDENCE:.0%} over all looks; simulated, not a"
            " bound: BENCHMARKS.md)"
        )

    def _time_line(self) -> str:
        if self.step_time is None:
            return (
                "A/B pod time: unknown, no step-time source (give `ab --step-time`, `render"
                " --ab-step-time` or AB_STEP_TIME: a prior run's log or results.jsonl, aot's JSON"
                " report, or seconds)"
            )
        seconds = self.total_steps * self.step_time.value
        return (
            f"A/B pod time: {self.total_steps} steps x {self.step_time.value:.4g} s ="
            f" {seconds / 60:.1f} min (ESTIMATE; step time: {self.step_time.source}), plus"
            " start-up and compiles"
        )

    def _resolution_line(self) -> str:
        return (
            f"A/B resolves: an effect of {self.smallest_effect_pct():.3g}% of the step or more is"
            f" claimed in {resolution.RESOLVED:.0%} of runs by the verdict's rule ({CONFIDENCE:.0%}"
            f" t interval over {self.blocks} blocks, min effect {self.min_effect_pct:g}%), at"
            f" {_noise_text(self.noise)}; with no effect an effect is claimed in"
            f" {_rate(self.false_claim_rate())} of runs (independent steps; a drift linear within a"
            " block cancels)"
        )


def _noise_text(noise: Figure) -> str:
    return f"{100 * noise.value:.3g}% step noise ({noise.source})"


def _rate(share: float) -> str:
    """A share of runs as a percent, a vanishing one as a bound on the printed digits."""
    if share < 1e-5:
        return "under 0.001%"
    return f"{100 * share:.2g}%" if share < 0.1 else f"{100 * share:.0f}%"


@dataclasses.dataclass(frozen=True)
class AbRun:
    """What an A/B run does, resolved once from the user's flags (which stay as parsed): the
    design its budget buys, the steps, blocks and min effect the flags leave to the run's
    platform and design, and the schedule seed. Every part of the A/B (its arms' plan, the
    same-process run, the cross-pod score, a same-pod pod's printed plan) reads it, so what is
    printed before the run is what the run does."""

    design: Design | None  # None: the budget sizes nothing (interleaved, another order, logs)
    steps: int  # scored steps per turn of an arm (interleaved: pairs of scored steps)
    blocks: int | None  # of the blocks order; None where the order has none and --blocks is unset
    min_effect: float  # percent of the baseline's median step
    schedule_seed: int  # the layout of the blocks' turns, or the interleaved schedule
    preset: config.Preset  # the cell every arm times (`arms.chosen_preset`), chosen once here
    preset_source: str  # what chose it

    @property
    def looks(self) -> Looks | None:
        """The looks of a run that stops when settled; None for a run of its whole budget."""
        return None if self.design is None else self.design.looks

    def planned_lines(self, set_warmups: Sequence[int]) -> list[str]:
        """The design's lines once the arms are planned: `set_warmups`, each program set's warm-up
        steps as the run takes them (`one_state.warm_ups`); a run the budget does not size has
        its steps per arm."""
        if self.design is None:
            return [
                f"A/B design: {self.steps} scored steps per arm, and {sum(set_warmups)} warm-up"
                " steps in all, up front"
            ]
        return dataclasses.replace(self.design, set_warmups=tuple(set_warmups)).lines()


def size(args: argparse.Namespace, schedule_seed: int) -> AbRun:
    """The run `args` asks for, sized from its budget, knobs and platform: the blocks design the
    budget buys with its blocks and turns, or for a run the budget does not size (interleaved,
    another order, scored logs) the steps its design takes by default. `args` is only read."""
    preset, preset_source = ab_arms.chosen_preset(args.preset, args.knob)
    base = base_knobs(args.knob)
    platform = platform_of(preset, base)
    min_effect = platform.min_effect_pct if args.min_effect is None else args.min_effect
    step_time, noise = _sources(args, platform)
    written = ab_arms.parse_arms(args.arms, run_orders.WRITTEN)
    order = args.order or run_orders.default_order([arm.setting for arm in written])
    if args.from_logs or args.design != DESIGN_ARMS or order != run_orders.BLOCKS:
        for flag, given in (("--budget", args.budget), ("--stop", args.stop)):
            if given is not None:
                raise UserError(
                    f"{flag} is for the {run_orders.BLOCKS} order of separate arms; this run is"
                    f" not one: drop {flag} and set --steps"
                )
        steps = DEFAULT_STEPS[args.design] if args.steps is None else args.steps
        return AbRun(None, steps, args.blocks, min_effect, schedule_seed, preset, preset_source)
    settings = tuple(dict.fromkeys(arm.setting for arm in written))
    program_sets = len({arm.program_knobs for arm in written})
    turn = args.steps or platform.turn_steps
    budget, source = _budget(args, platform)
    blocks = args.blocks
    if budget is None:
        blocks = blocks or run_orders.DEFAULT_BLOCKS
    else:
        per_setting = _scored_per_setting(budget, step_time, len(settings), program_sets, args)
        if blocks is None:
            blocks = _blocks(per_setting, turn, source)
        else:  # --budget with --blocks: the turns take what the budget leaves
            turn = max(1, per_setting // (2 * blocks))
    stop = args.stop or platform.stop
    looks = Looks(2 * blocks) if stop == STOP_SETTLED else None
    expected = parse_effects(args.expect_effect) if args.expect_effect else ()
    design = Design(settings, blocks, turn, budget, source, step_time, noise, min_effect)
    design = dataclasses.replace(design, looks=looks, expected_effects=expected)
    return AbRun(design, turn, blocks, min_effect, schedule_seed, preset, preset_source)


def parse_effects(text: str, name: str = "--expect-effect") -> tuple[float, ...]:
    """`1` or `0.5,7.2`: percents of the step, each above 0 and below 100."""
    effects = []
    for word in text.split(","):
        try:
            effect = float(word.strip().removesuffix("%"))
        except ValueError:
            effect = -1.0
        if not 0 < effect < 100:
            raise ConfigError(
                f"{name}={text!r}: give percents of the step above 0 and below 100, comma-separated"
                " (e.g. 1,7.2)"
            )
        effects.append(effect)
    return tuple(effects)


def _sources(args: argparse.Namespace, platform: Platform) -> tuple[Figure | None, Figure]:
    step_time = from_run = None
    if args.step_time is not None:
        step_time, from_run = parse_step_time(args.step_time)
    if args.step_noise is not None:
        return step_time, parse_step_noise(args.step_noise)
    return step_time, from_run or platform.noise


def _budget(args: argparse.Namespace, platform: Platform) -> tuple[Budget | None, str]:
    """The budget and what set it; None when the blocks are given (--blocks) or the platform's
    default is a count of blocks (the CPU's)."""
    if args.budget is not None:
        if args.blocks is not None and args.steps is not None:
            raise UserError(
                "--budget with both --blocks and --steps: the two fix the design already; drop"
                " --budget, or one of them"
            )
        return parse_budget(args.budget), f"--budget {args.budget}"
    if args.blocks is not None:
        return None, "--blocks"
    if platform.budget is None:
        return None, f"the {platform.name}'s default of {run_orders.DEFAULT_BLOCKS} blocks"
    return platform.budget, f"the {platform.name}'s default budget ({platform.budget.describe()})"


def _scored_per_setting(
    budget: Budget, step_time: Figure | None, settings: int, program_sets: int, args
) -> int:
    """Scored steps per setting the budget buys; a minutes budget pays the warm-ups first, at
    the most any engine needs unless --warmup-steps says."""
    if budget.scored_steps is not None:
        return budget.scored_steps
    if step_time is None:
        raise UserError(
            f"--budget {budget.minutes:g}min needs a step time to turn minutes into steps: give"
            " --step-time (a prior run's log or results.jsonl, aot's JSON report, or seconds)"
        )
    warmups = program_sets * (args.warmup_steps or MAXTEXT_WARMUP_STEPS)
    steps = math.floor(budget.minutes * 60 / step_time.value) - warmups
    return max(0, steps // settings)


def _blocks(per_setting: int, turn: int, source: str) -> int:
    blocks = per_setting // (2 * turn)
    if blocks < run_orders.MIN_BLOCKS:
        need = 2 * turn * run_orders.MIN_BLOCKS
        raise UserError(
            f"{source} buys {per_setting} scored steps per setting: {blocks} block(s) of"
            f" {turn}-step turns, and the interval over blocks needs {run_orders.MIN_BLOCKS}"
            f" ({need} scored steps per setting): raise the budget, or shorten --steps"
        )
    return blocks


def resolved_sources(
    step_time: str | None, step_noise: str | None
) -> tuple[str | None, str | None]:
    """AB_STEP_TIME and AB_STEP_NOISE as figures with their sources (`Figure.text`), files read
    here: a render's pod has no copy of the renderer's files, and names the same source."""
    time = from_run = noise = None
    if step_time:
        time, from_run = parse_step_time(step_time, "AB_STEP_TIME")
    if step_noise:
        noise = parse_step_noise(step_noise, "AB_STEP_NOISE")
    noise = noise or from_run
    return (
        None if time is None else time.text("s"),
        None if noise is None else noise.text("%"),
    )
