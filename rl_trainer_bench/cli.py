"""`rl-trainer-bench <command>`: the command table and the one error boundary; each command's
arguments and work live in its own module.

The table names every command's functions as "module:function" strings, so `--help` lists the
commands without importing any of them, and `rl-trainer-bench COMMAND ...` imports that command's
modules alone: `render` never imports JAX, nor `--help` numpy. A command's known user errors (bad
input, bad knob) surface as one line on stderr and exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, NoReturn

from rl_trainer_bench.errors import UserError, exit_process, run_guarded


class Command(NamedTuple):
    """One row of the table: `arguments` adds the command's arguments to its parser; `run` takes
    the parsed namespace and returns the exit code."""

    name: str
    help: str
    arguments: str  # "module:function"
    run: str  # "module:function"


COMMANDS: list[Command] = [
    Command(
        "payload",
        "Build one calibrated micro-batch, print its routing calibration, write it as .npz.",
        "rl_trainer_bench.payload.command:add_payload_arguments",
        "rl_trainer_bench.payload.command:run_payload",
    ),
    Command(
        "profile-routing",
        "Turn a dump of a run's routed experts into a routing profile (JSON).",
        "rl_trainer_bench.payload.command:add_profile_routing_arguments",
        "rl_trainer_bench.payload.command:run_profile_routing",
    ),
    Command(
        "check",
        "CPU checks: micro-batch well-formedness and the engine's numerics knobs.",
        "rl_trainer_bench.payload.command:add_check_arguments",
        "rl_trainer_bench.payload.command:run_check",
    ),
    Command(
        "check-engine",
        "run the engine contract's conformance checks on an engine (default: the built-in one)",
        "rl_trainer_bench.preflight.check_engine:add_arguments",
        "rl_trainer_bench.preflight.check_engine:run",
    ),
    Command(
        "render",
        "Render a launcher's DRY_RUN output into a single-slice bench JobSet.",
        "rl_trainer_bench.launch.knobs:add_arguments",
        "rl_trainer_bench.ab.render_command:run",
    ),
    Command(
        "render-diff",
        "Structured diff of two JobSets (default: the launch's trainer against the bench).",
        "rl_trainer_bench.launch.diff:add_arguments",
        "rl_trainer_bench.launch.diff:run",
    ),
    Command(
        "validate",
        "Check JobSets against the CRD schema, the webhook's name budgets and slice consistency.",
        "rl_trainer_bench.launch.validate:add_arguments",
        "rl_trainer_bench.launch.validate:run",
    ),
    Command(
        "plan",
        "Print the plan a rendered bench JobSet's pod will print, from its own code, with no JAX.",
        "rl_trainer_bench.launch.pod_plan:add_arguments",
        "rl_trainer_bench.launch.pod_plan:run",
    ),
    Command(
        "aot",
        "Compile each engine program ahead of time (local devices or a TPU slice) and check memory.",
        "rl_trainer_bench.preflight.aot.command:add_arguments",
        "rl_trainer_bench.cli:aot_command",
    ),
    Command(
        "hlo-overlap",
        "Summarize the collectives of an HLO text file or a compiled preset and what hides them.",
        "rl_trainer_bench.preflight.hlo.command:add_arguments",
        "rl_trainer_bench.preflight.hlo.command:run",
    ),
    Command(
        "config-diff",
        "Diff two engine configs: key=value flags, YAML, trainer argv, or two JobSets.",
        "rl_trainer_bench.preflight.config_diff:add_arguments",
        "rl_trainer_bench.preflight.config_diff:run",
    ),
    Command(
        "run",
        "Run the bench driver: compile, warm up, time STEPS steps, print the step ruler.",
        "rl_trainer_bench.config.knobs:add_driver_knob_arguments",
        "rl_trainer_bench.bench.entry:run_command",
    ),
    Command(
        "ab",
        "same-process A/B of bench arms: noise floor, exact checks, verdict (the main job)",
        "rl_trainer_bench.ab.parser:add_arguments",
        "rl_trainer_bench.ab.command:run",
    ),
]


def aot_command(args: argparse.Namespace) -> int:
    """`aot`, with --ab-arms' program sets found by the A/B's own code (the preflight room cannot
    import the A/B's); imported when the command runs, so no other command pays for them."""
    # the table's rule: a command's modules load only when it is the command named
    from rl_trainer_bench.ab.aot_arms import program_sets
    from rl_trainer_bench.preflight.aot.command import run

    sets = None if args.ab_arms is None else program_sets(args.ab_arms, args.engine_flags)
    return run(args, sets)


class _OneLineErrorParser(argparse.ArgumentParser):
    """Argument errors as one line and exit code 2, like every other user error; and a value
    that starts with a dash taken as the value it is (`--libtpu-flags '--xla_x=1'`)."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        if args is not None:
            args = _dash_values_attached(self, list(args))
        return super().parse_known_args(args, namespace)


def _dash_values_attached(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """`--option VALUE` as `--option=VALUE` where the option takes one value and VALUE starts
    with a dash but names none of the parser's options: argparse would read such a VALUE as an
    option and refuse with "expected one argument", though flags for libtpu, a trainer argv or
    an orchestrator's are exactly such values. A VALUE that is (or abbreviates) one of the
    parser's options is left alone, so a forgotten value is still refused."""
    options = [option for action in parser._actions for option in action.option_strings]
    takes_one = {
        option
        for action in parser._actions
        if action.nargs is None and action.option_strings
        for option in action.option_strings
    }
    attached: list[str] = []
    index = 0
    while index < len(words):
        word, following = words[index], words[index + 1 : index + 2]
        if word == "--":
            return [*attached, *words[index:]]
        name = following[0].split("=", 1)[0] if following else ""
        if (
            word in takes_one
            and name.startswith("-")
            and not any(option.startswith(name) for option in options)
        ):
            attached.append(f"{word}={following[0]}")
            index += 2
        else:
            attached.append(word)
            index += 1
    return attached


def function(target: str) -> Callable:
    """The function a "module:function" string of the table names, its module imported."""
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def build_parser(commands: Iterable[str] = ()) -> argparse.ArgumentParser:
    """The parser listing every command with its one-line help, with the arguments of the named
    `commands` only: adding a command's arguments imports its module, so parsing one command
    imports that command alone, and `--help` none."""
    parser = _OneLineErrorParser(
        prog="rl-trainer-bench",
        description="Benchmark the trainer program of a GRPO MoE run on one slice.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = set(commands)
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command_parser.set_defaults(_run=command.run)
        if command.name in named:
            function(command.arguments)(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command inside the one error boundary (`errors.run_guarded`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[0] if argv and argv[0] in {command.name for command in COMMANDS} else None

    def command() -> int | None:
        args = build_parser([named] if named else []).parse_args(argv)
        return function(args._run)(args)

    if named is None:  # `--help`, or no command: argparse answers and exits, no command loads
        return run_guarded("rl-trainer-bench", command)
    # numpy: `--help` has no need of it; a command that builds an engine imports it anyway
    from rl_trainer_bench.engine.contract import ContractError

    return run_guarded(f"rl-trainer-bench {named}", command, (UserError, ContractError))


def program() -> NoReturn:
    """The `rl-trainer-bench` program: `main`'s exit code, the process ended as
    `errors.exit_process` ends it (tests call `main`, which returns)."""
    exit_process(main())


if __name__ == "__main__":
    program()
