"""`rl-trainer-bench aot`: compile each engine program ahead of time and add up device memory.

Light at import time: `cli` imports this module to build its parser; JAX is imported when the
command runs. libtpu's start-up noise on a CPU host is kept off the screen (`quiet_stderr`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rl_trainer_bench import accelerators
from rl_trainer_bench.config.knobs import engine_spec
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import ConfigError, UserError
from rl_trainer_bench.preflight.aot.check import run_check
from rl_trainer_bench.preflight.aot.report import format_report
from rl_trainer_bench.preflight.aot.targets import LOCAL
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu


def add_target_arguments(parser) -> None:
    """Arguments shared with `hlo-overlap`: which cell, compiled for which devices."""
    parser.add_argument("--preset", default="cpu-tiny", help="preset (default: cpu-tiny)")
    parser.add_argument(
        "--target",
        default=LOCAL,
        help=f"'local' (this process's devices) or a TPU slice: {accelerators.known_slice_forms()}",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=0,
        help="compile at N and 2N layers and extrapolate to the preset's depth (0: full depth)",
    )


def add_arguments(parser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--trainer-argv", default="", help="trainer flags (as in TRAINER_ARGV)")
    parser.add_argument("--engine-flags", default="", help="key=value engine flags (ENGINE_FLAGS)")
    parser.add_argument(
        "--engine",
        default=BUILT_IN,
        help=f"module:Class (ENGINE); only engines that lower from abstract inputs (default {BUILT_IN})",
    )
    parser.add_argument(
        "--stage-before-update",
        default="off",
        help="on|off: count the staged micro-batch beside the dropless replay and update",
    )
    parser.add_argument(
        "--micro-steps",
        type=int,
        default=0,
        help="micro-batches per step for the predicted step (0: the preset's MICRO_STEPS)",
    )
    parser.add_argument(
        "--routing-profile",
        default=None,
        help="routing profile JSON for the replay chance (ROUTING_PROFILE; default: the shipped one)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the micro-batch the estimate reads (SEED)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")


def run(args) -> int:
    """Exit 0 when the cell fits, 1 when it does not (or a program failed), 2 for bad input."""
    if args.stage_before_update not in ("on", "off"):
        raise ConfigError(f"STAGE_BEFORE_UPDATE={args.stage_before_update!r}: expected on or off")
    if args.micro_steps < 0:
        raise UserError(f"--micro-steps / MICRO_STEPS={args.micro_steps}: expected 0 or more")
    with quiet_libtpu():
        report = run_check(
            args.preset,
            args.target,
            trainer_argv=args.trainer_argv,
            engine_flags=args.engine_flags,
            stage_before_update=args.stage_before_update == "on",
            layers=args.layers,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            micro_steps=args.micro_steps,
            routing_profile=args.routing_profile,
            seed=args.seed,
            engine=engine_spec(args.engine, "--engine"),
        )
    document = json.dumps(report.to_json(), indent=1)
    if args.output:
        from rl_trainer_bench.io import write_text_atomically

        write_text_atomically(Path(args.output), document + "\n")
    print(document if args.json else format_report(report))
    return 0 if report.fits else 1
