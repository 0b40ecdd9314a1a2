"""The `ab` command's arguments, one group per thing they decide, in their `--help` order.

Only light modules at import time: `cli` imports this one to build its parser, and a parser must
not pay for numpy or JAX.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.config import values
from rl_trainer_bench.config.knobs import (
    AB,
    DRIVER_KNOBS,
    MAX_SEED,
    add_knob_flags,
    add_preset_flag,
    knobs_of,
)
from rl_trainer_bench.errors import ConfigError

DESIGN_ARMS, DESIGN_INTERLEAVED = "arms", "interleaved"
# Scored steps per arm of an order that is not blocks, or pairs (interleaved); the blocks order's
# turns and blocks come from the budget (budget.py).
DEFAULT_STEPS = {DESIGN_ARMS: 3, DESIGN_INTERLEAVED: 8}
MAX_BLOCKS = 1000
# Whether the blocks order stops at the first look whose verdict is settled (sequential.py), or
# runs its whole budget and judges once.
STOP_SETTLED, STOP_BUDGET = "settled", "budget"
BUDGET_FORMS = "N scored steps per setting (e.g. 12) or M minutes of the pod's time (e.g. 45min)"
# What the knobs `ab` takes as its own flags (`knobs_of(AB)`) mean for an A/B; each row says the
# rest: its help, its grammar and what `ab` does when the flag is not given.
_KNOB_NOTES = {
    "STEPS": f"; per turn of the {run_orders.BLOCKS} order (1 on an accelerator, 3 on the"
    f" CPU), per arm of another order ({DEFAULT_STEPS[DESIGN_ARMS]}); interleaved: pairs of scored"
    f" steps, rounded up to even ({DEFAULT_STEPS[DESIGN_INTERLEAVED]})",
    "WARMUP_STEPS": "; per bench, once before the first scored turn, never scored",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `ab` command's arguments, one group per thing they decide, in their `--help` order."""
    _add_design_arguments(parser)
    _add_length_arguments(parser)
    _add_knob_arguments(parser)
    _add_prediction_arguments(parser)
    _add_output_arguments(parser)


def _add_design_arguments(parser: argparse.ArgumentParser) -> None:
    """What is compared and how the runs are laid out: preset, arms, order, design, schedule."""
    add_preset_flag(
        parser, "the cell every arm times (else the model a --knob TRAINER_ARGV names)", True
    )
    parser.add_argument(
        "--arms",
        default=ab_arms.DEFAULT_ARMS,
        help="settings to compare, baseline first: built-in off, on, after, or NAME:KEY=V[,KEY=V] "
        "to define one (UPPER_CASE: driver knob, lower_case: engine key); each runs at least twice in the "
        "--order; repeat names to spell out the order yourself "
        f"(default: {ab_arms.DEFAULT_ARMS})",
    )
    parser.add_argument(
        "--order",
        choices=list(run_orders.ORDERS),
        help="run order of the arms: "
        + "; ".join(f"{name}: {what}" for name, what in run_orders.ORDERS.items())
        + f" (default: {run_orders.BLOCKS}, or {run_orders.WRITTEN} when --arms repeats a name)",
    )
    parser.add_argument(
        "--blocks",
        type=_block_count,
        help=f"blocks of the {run_orders.BLOCKS} order; more blocks narrow the interval on a noisy "
        "host, each costs every setting two turns (default: what --budget buys)",
    )
    parser.add_argument(
        "--design",
        choices=[DESIGN_ARMS, DESIGN_INTERLEAVED],
        default=DESIGN_ARMS,
        help=f"{DESIGN_ARMS}: each setting runs as its own arms (--order), which proves the arms "
        f"train the same; {DESIGN_INTERLEAVED}: one run switches between two settings that differ "
        "only in STAGE_* knobs at its step boundaries, on a seeded balanced schedule, scored as "
        f"paired differences of neighbouring steps (default: {DESIGN_ARMS})",
    )
    parser.add_argument(
        "--schedule-seed",
        type=_seed,
        help="seed of the run's random layout: which way each pair of blocks turns (--order "
        f"{run_orders.BLOCKS}), or the interleaved schedule; pass a run's recorded seed back to "
        "repeat its layout (default: drawn afresh for every run, recorded in ab.json)",
    )


def _add_length_arguments(parser: argparse.ArgumentParser) -> None:
    """How many steps each arm runs, scored and warm-up: what the run costs in time."""
    parser.add_argument(
        "--budget",
        help=f"what the {run_orders.BLOCKS} order may spend: {BUDGET_FORMS}; it buys the blocks"
        " (default: 8 scored steps per setting on an accelerator; on the CPU 6 blocks)",
    )
    parser.add_argument(
        "--step-time",
        metavar="SOURCE",
        help="the step time the pod time is reckoned from: seconds (100s, or '100s (where from)'),"
        " a prior run's pod log or results.jsonl, or aot's JSON report (--output)",
    )
    parser.add_argument(
        "--step-noise",
        metavar="SOURCE",
        help="the step noise the smallest resolvable effect is reckoned at: a percent of the step"
        " (0.15%%), or a prior run's pod log or results.jsonl (default: --step-time's prior run,"
        " else the platform's, stated as assumed)",
    )
    parser.add_argument(
        "--stop",
        choices=[STOP_SETTLED, STOP_BUDGET],
        help=f"{STOP_SETTLED}: the {run_orders.BLOCKS} order looks after every half-block and stops"
        " at the first whose verdict is settled, its error rate spent over the looks; "
        f"{STOP_BUDGET}: it runs the whole budget and judges once (default: {STOP_SETTLED} on an"
        f" accelerator, {STOP_BUDGET} on the CPU)",
    )
    parser.add_argument(
        "--expect-effect",
        metavar="PCT[,PCT]",
        help="effects, percent of the step, at which the plan forecasts a run that stops when"
        " settled: its expected steps and pod time (default: the min effect)",
    )
    add_knob_flags(parser, knobs_of(AB), _KNOB_NOTES, command=AB)


def _add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """Settings every arm shares: driver knobs, engine keys and the engine itself."""
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="KEY=V",
        help="a driver knob or engine key for every arm (repeatable), e.g. MICRO_STEPS=4",
    )
    parser.add_argument(
        "--engine",
        dest="knob",
        action="append",
        type=lambda spec: f"ENGINE={spec}",
        metavar="module:Class",
        help=f"{DRIVER_KNOBS['ENGINE'].help}: the engine every arm times (--knob ENGINE=...; default"
        f" {DRIVER_KNOBS['ENGINE'].default}); an arm may set its own ENGINE",
    )


def _add_prediction_arguments(parser: argparse.ArgumentParser) -> None:
    """What the verdict is judged against: pre-registered predictions and the smallest effect."""
    parser.add_argument(
        "--predict",
        action="append",
        default=[],
        metavar="SETTING-BASELINE=V[LOW,HIGH]",
        help="pre-registered delta and band, percent of BASELINE's median unless V ends in ms "
        "or s, e.g. on-off=-7.4[-8.5,-5.5] (repeatable, or ';'-separated)",
    )
    parser.add_argument(
        "--predict-file", type=Path, help="predictions written before the run, one per line"
    )
    parser.add_argument(
        "--min-effect",
        type=float,
        metavar="PCT",
        help="smallest change worth finding, percent of the baseline's median step; NO-EFFECT "
        "means smaller than this (default: 0.5 on an accelerator, 2 on the CPU)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the report goes, or which logs are scored instead of running arms."""
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for ab.json, ab.png and logs (default: a fresh ab-YYYYmmdd-HHMMSS/ here)",
    )
    parser.add_argument(
        "--from-logs",
        nargs="+",
        metavar="[NAME=]LOG",
        help="score bench logs from separate pods instead of running arms (cross-pod: no shared "
        "noise floor); the first log is the baseline",
    )


def _whole_number(name: str, minimum: int, maximum: int, shown_maximum: str):
    """An argparse type: a whole number in minimum..maximum, or argparse's own one-line error."""

    def parse(text: str) -> int:
        try:
            return values.whole_number(name, text, minimum, maximum)
        except ConfigError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a whole number from {minimum} to {shown_maximum}"
            ) from None

    return parse


_seed = _whole_number("seed", 0, MAX_SEED, "2^64-1")
_block_count = _whole_number("blocks", run_orders.MIN_BLOCKS, MAX_BLOCKS, f"{MAX_BLOCKS:,}")
