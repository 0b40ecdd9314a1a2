"""`rl-trainer-bench <command>`: argument parsing only; each command's work lives in its own module.

Every command module is imported lazily, so `rl-trainer-bench render ...` never imports JAX. A
command's known user errors (bad input, bad knob) surface as one line on stderr and exit code 2,
never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError, run_guarded

# Each entry: (command, help, function adding its arguments, "module:function" that runs it).
# The runner takes the parsed namespace and returns the exit code.
_Adder = Callable[[argparse.ArgumentParser], None]
COMMANDS: list[tuple[str, str, _Adder, str]] = []


# ---- micro-batches and routing profiles (rl_trainer_bench.payload.command) ----


def _add_micro_batch_source(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.config.knobs import add_knob_flags, add_preset_flag  # no JAX

    add_preset_flag(parser, "shapes of the micro-batch")
    add_knob_flags(parser, ("ROUTING_PROFILE", "SEED"))
    parser.add_argument(
        "--index", type=int, default=0, help="micro-batch index (distinct content per index)"
    )
    parser.add_argument(
        "--max-prompt-length", type=int, help="orchestrator argv: packing layout from it"
    )
    parser.add_argument(
        "--max-response-length", type=int, help="orchestrator argv: packing layout from it"
    )
    parser.add_argument("--num-generations", type=int, default=16, help="sequences per GRPO group")
    parser.add_argument("--pad-rows", type=int, default=0, help="rows that are all padding")


def _add_payload_arguments(parser: argparse.ArgumentParser) -> None:
    _add_micro_batch_source(parser)
    parser.add_argument(
        "--out", required=True, metavar="FILE.npz", help="where to write the micro-batch"
    )
    parser.add_argument(
        "--no-routed-experts", action="store_true", help="omit routed_experts (no router replay)"
    )


def _add_profile_routing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dump", metavar="DUMP.npy", help="a run's routed experts, int, -1 on padding"
    )
    parser.add_argument(
        "--layout", default="BTLK", choices=("BTLK", "BLTK"), help="axis order of the dump"
    )
    parser.add_argument("--num-experts", type=int, help="expert count (default: largest id + 1)")
    parser.add_argument("--description", help="how the dump was taken (stored in the profile)")
    parser.add_argument("--out", metavar="FILE", help="write the profile here (default: stdout)")


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    _add_micro_batch_source(parser)
    parser.add_argument(
        "--payload", metavar="FILE.npz", help="check this micro-batch instead of building one"
    )
    parser.add_argument(
        "--skip-numerics", action="store_true", help="only the well-formedness checks (no engine)"
    )


COMMANDS += [
    (
        "payload",
        "Build one calibrated micro-batch, print its routing calibration, write it as .npz.",
        _add_payload_arguments,
        "rl_trainer_bench.payload.command:run_payload",
    ),
    (
        "profile-routing",
        "Turn a dump of a run's routed experts into a routing profile (JSON).",
        _add_profile_routing_arguments,
        "rl_trainer_bench.payload.command:run_profile_routing",
    ),
    (
        "check",
        "CPU checks: micro-batch well-formedness and the engine's numerics knobs.",
        _add_check_arguments,
        "rl_trainer_bench.payload.command:run_check",
    ),
]


def _add_check_engine_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.config.knobs import ENGINE_KNOBS, add_knob_flags, add_preset_flag

    add_preset_flag(parser, "shapes and mesh")
    add_knob_flags(parser, (*ENGINE_KNOBS, "MAXTEXT_DRIVER"))


COMMANDS.append(
    (
        "check-engine",
        "run the engine contract's conformance checks on an engine (default: the built-in one)",
        _add_check_engine_arguments,
        "rl_trainer_bench.preflight.check_engine:run",
    )
)


def _add_render_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.launch.knobs import add_arguments  # light: no YAML, schema or JAX

    add_arguments(parser)


def _add_render_diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", metavar="A", help="launch render or JobSet file (the trainer)")
    parser.add_argument("after", metavar="B", help="JobSet file to compare (the bench)")
    parser.add_argument(
        "--trainer-jobset", metavar="NAME", help="which JobSet of A (default: the trainer)"
    )
    parser.add_argument(
        "--expect-only",
        metavar="KINDS",
        help="comma list of change kinds allowed (names,restarts,command,provenance,slice); "
        "exit 1 when anything else changed",
    )
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")


def render_command(args: argparse.Namespace) -> int:
    """`render`, with the same-pod A/B's own check of AB_ARMS (the launch room cannot import it),
    and its settings for the AOT job (AOT_JOB)."""
    import functools

    from rl_trainer_bench.ab.same_pod import plan_lines, setting_knobs
    from rl_trainer_bench.launch.aot_job import render_aot_job
    from rl_trainer_bench.launch.render import run

    aot_job = functools.partial(render_aot_job, arm_settings=setting_knobs)
    return run(args, check_pod=plan_lines, render_aot_job=aot_job)


def _add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files holding JobSets")


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.launch.pod_plan import add_arguments  # light: no JAX

    add_arguments(parser)


COMMANDS += [
    (
        "render",
        "Render a launcher's DRY_RUN output into a single-slice bench JobSet.",
        _add_render_arguments,
        "rl_trainer_bench.cli:render_command",
    ),
    (
        "render-diff",
        "Structured diff of two JobSets (default: the launch's trainer against the bench).",
        _add_render_diff_arguments,
        "rl_trainer_bench.launch.diff:run",
    ),
    (
        "validate",
        "Check JobSets against the CRD schema, the webhook's name budgets and slice consistency.",
        _add_validate_arguments,
        "rl_trainer_bench.launch.validate:run",
    ),
    (
        "plan",
        "Print the plan a rendered bench JobSet's pod will print, from its own code, with no JAX.",
        _add_plan_arguments,
        "rl_trainer_bench.launch.pod_plan:run",
    ),
]


def _add_aot_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.preflight.aot.command import (
        add_arguments,  # light: JAX is imported when the command runs
    )

    add_arguments(parser)


def _add_hlo_overlap_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.preflight.hlo_overlap_command import add_arguments

    add_arguments(parser)


def _add_config_diff_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.preflight.config_diff import add_arguments

    add_arguments(parser)


COMMANDS += [
    (
        "aot",
        "Compile each engine program ahead of time (local devices or a TPU slice) and check memory.",
        _add_aot_arguments,
        "rl_trainer_bench.preflight.aot.command:run",
    ),
    (
        "hlo-overlap",
        "Summarize the collectives of an HLO text file or a compiled preset and what hides them.",
        _add_hlo_overlap_arguments,
        "rl_trainer_bench.preflight.hlo_overlap_command:run",
    ),
    (
        "config-diff",
        "Diff two engine configs: key=value flags, YAML, trainer argv, or two JobSets.",
        _add_config_diff_arguments,
        "rl_trainer_bench.preflight.config_diff:run",
    ),
]


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.config.knobs import add_driver_knob_arguments  # no JAX at parse time

    add_driver_knob_arguments(parser)


COMMANDS.append(
    (
        "run",
        "Run the bench driver: compile, warm up, time STEPS steps, print the step ruler.",
        _add_run_arguments,
        "rl_trainer_bench.bench.entry:run_command",
    )
)


def _add_ab_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.ab.parser import add_arguments  # light: no numpy scorer, no JAX

    add_arguments(parser)


COMMANDS.append(
    (
        "ab",
        "same-process A/B of bench arms: noise floor, exact checks, verdict (the main job)",
        _add_ab_arguments,
        "rl_trainer_bench.ab.command:run",
    )
)


class _OneLineErrorParser(argparse.ArgumentParser):
    """Argument errors as one line and exit code 2, like every other user error."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="rl-trainer-bench",
        description="Benchmark the trainer program of a GRPO MoE run on one slice.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text, add_arguments, runner in COMMANDS:
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command_parser)
        command_parser.set_defaults(_runner=runner)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command inside the one error boundary (`errors.run_guarded`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[0] if argv and argv[0] in {name for name, *_ in COMMANDS} else None
    prog = "rl-trainer-bench" + (f" {named}" if named else "")

    def command() -> int | None:
        args = build_parser().parse_args(argv)
        module_name, function_name = args._runner.split(":")
        return getattr(importlib.import_module(module_name), function_name)(args)

    return run_guarded(prog, command, (UserError, ContractError))


if __name__ == "__main__":
    sys.exit(main())
