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
from rl_trainer_bench.errors import UserError

# Each entry: (command, help, function adding its arguments, "module:function" that runs it).
# The runner takes the parsed namespace and returns the exit code.
_Adder = Callable[[argparse.ArgumentParser], None]
COMMANDS: list[tuple[str, str, _Adder, str]] = []


def _add_ab_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.ab import add_arguments  # light: no numpy scorer, no JAX

    add_arguments(parser)


COMMANDS.append(
    (
        "ab",
        "same-process A/B of bench arms: noise floor, exact checks, verdict (the main job)",
        _add_ab_arguments,
        "rl_trainer_bench.ab:run",
    )
)


def _add_render_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.render_knobs import add_arguments  # light: no YAML, schema or JAX

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


def _add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files holding JobSets")


COMMANDS += [
    (
        "render",
        "Render a launcher's DRY_RUN output into a single-slice bench JobSet.",
        _add_render_arguments,
        "rl_trainer_bench.render:run",
    ),
    (
        "render-diff",
        "Structured diff of two JobSets (default: the launch's trainer against the bench).",
        _add_render_diff_arguments,
        "rl_trainer_bench.render_diff:run",
    ),
    (
        "validate",
        "Check JobSets against the CRD schema, the webhook's name budgets and slice consistency.",
        _add_validate_arguments,
        "rl_trainer_bench.validate:run",
    ),
]


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from rl_trainer_bench.config import add_driver_knob_arguments  # no JAX at parse time

    add_driver_knob_arguments(parser)


COMMANDS.append(
    (
        "run",
        "Run the bench driver: compile, warm up, time STEPS steps, print the step ruler.",
        _add_run_arguments,
        "rl_trainer_bench.driver:run_command",
    )
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    module_name, function_name = args._runner.split(":")
    run = getattr(importlib.import_module(module_name), function_name)
    try:
        return int(run(args) or 0)
    except (UserError, ContractError) as error:
        print(f"rl-trainer-bench {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
