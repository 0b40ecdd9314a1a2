"""`rl-trainer-bench aot`: compile each engine program ahead of time and add up device memory.

Light at import time: `cli` imports this module to build its parser; the modules that compile,
and JAX with them, are imported when the command runs. libtpu's start-up noise on a CPU host is
kept off the screen (`quiet_stderr`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rl_trainer_bench.bench.state_memory import MIN_HEADROOM
from rl_trainer_bench.config.knobs import AOT, add_knob_flags, knobs_of
from rl_trainer_bench.io import check_output_file, write_text_atomically
from rl_trainer_bench.preflight.aot.arguments import add_target_arguments
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

if TYPE_CHECKING:
    from rl_trainer_bench.preflight.aot.ab_check import ProgramSet


# The driver's knobs `aot` takes as flags: the rows of the knob table that say so.
AOT_KNOBS = knobs_of(AOT)
_NOTES = {
    "ENGINE": "; aot needs an engine whose module lowers its programs from abstract inputs",
    "STAGE_BEFORE_UPDATE": ": count the staged micro-batch beside the dropless replay and update",
    "MICRO_STEPS": "; for the predicted step",
    "ROUTING_PROFILE": "; the replay chance of the predicted step",
    "SEED": "; the micro-batch whose replay chance the estimate reads",
}


def add_arguments(parser) -> None:
    add_target_arguments(parser)
    add_knob_flags(parser, AOT_KNOBS, _NOTES)
    parser.add_argument(
        "--min-headroom",
        type=headroom_percent,
        default=100 * MIN_HEADROOM,
        metavar="PERCENT",
        help=f"the margin: percent of a device's memory the peak must leave free (default"
        f" {100 * MIN_HEADROOM:g}; 0 checks the fit alone)",
    )
    parser.add_argument(
        "--ab-arms",
        metavar="ARMS",
        help="a same-pod A/B's arms, as `render --ab-arms` takes them: compile every arm's"
        " programs (one state for all) and refuse the A/B when one does not fit",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")


def headroom_percent(text: str) -> float:
    """--min-headroom: a percent from 0 to 50, with or without the % sign."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not 0 <= value <= 50:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a percent from 0 to 50, e.g. 5")
    return value


def run(args, program_sets: Sequence[ProgramSet] | None = None) -> int:
    """Exit 0 when the cell fits with the margin free, 1 when it does not (or a program failed),
    2 for bad input; with `program_sets` (--ab-arms' program sets, found by the A/B's own code),
    every set checked and the A/B refused when one does not fit."""
    # JAX from here on: `aot --help`, and `aot` on a python without it, answer before it loads
    from rl_trainer_bench.preflight.aot.ab_check import format_ab_check, run_ab_check
    from rl_trainer_bench.preflight.aot.check import run_check
    from rl_trainer_bench.preflight.aot.report import format_report

    if args.output is not None:
        check_output_file(args.output, "--output")  # before the compiles, which take minutes
    if program_sets is not None:
        with quiet_libtpu():
            check = run_ab_check(args, program_sets, _progress)
        _write(args, check.to_json(), format_ab_check(check))
        return 0 if not check.refused else 1
    with quiet_libtpu():
        report = run_check(
            args.preset,
            args.target,
            trainer_argv=args.trainer_argv,
            engine_flags=args.engine_flags,
            stage_before_update=args.stage_before_update,
            layers=args.layers,
            progress=_progress,
            micro_steps=args.micro_steps,
            routing_profile=args.routing_profile,
            seed=args.seed,
            engine=args.engine,
            min_headroom=args.min_headroom / 100,
        )
    _write(args, report.to_json(), format_report(report))
    return 0 if report.margin_met else 1


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write(args, content: dict, text: str) -> None:
    """The JSON report to --output, and the text (or JSON) to stdout."""
    document = json.dumps(content, indent=1)
    if args.output is not None:
        write_text_atomically(Path(args.output), document + "\n")
    print(document if args.json else text)
