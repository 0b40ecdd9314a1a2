"""The AOT job's pod: `aot` and `hlo-overlap` for the trainer's slice, in the trainer's own image.

What a program needs in device memory depends on the MaxText and the libtpu that compile it, and
the trainer's are in the trainer's image, not on the host that renders (whose MaxText may refuse
keys the trainer's takes, and compile another program). So the renderer (`launch/aot_job.py`)
renders a JobSet whose one pod runs this module on a CPU node, in the trainer's image, with the
trainer's keys, environment and libtpu flags. It says first which MaxText and libtpu it will
compile with and refuses in one line when the image lacks them, before any of the compiles that
take half an hour; PLAN_ONLY=1 ends there, with every command it would run checked by that
command's own parser. Each command runs in a child process of its own: libtpu allows one per
host, and a child returns its host memory (about 18 GiB for the 397B cell) before the next starts.
A same-pod A/B is compiled as it runs: its arms share one state and each arm's programs run beside
it, so `aot` runs once, as `aot --ab-arms` over the program sets the renderer planned (AOT_AB), and
its report and exit status are the A/B's verdict (the largest program set beside the one state);
`hlo-overlap` runs once per program set, not per setting. The reports go to RESULTS_DIR and are
copied to RESULTS_URI as the job goes and when it ends, whatever ended it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rl_trainer_bench.bench.results_copy import copying
from rl_trainer_bench.code_digest import code_sha256
from rl_trainer_bench.config.knobs import DRIVER_KNOBS, BenchConfig
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.factory import MAXTEXT
from rl_trainer_bench.errors import UserError, exit_process, run_guarded
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.preflight.aot import command as aot_command
from rl_trainer_bench.preflight.hlo import command as hlo_overlap_command

if TYPE_CHECKING:
    from rl_trainer_bench.preflight.aot.ab_check import ProgramSet

PROG = "aot job"
MODULE = "rl_trainer_bench.preflight.aot_job_pod"  # what the job's script and children run
PREFIX = "[AotJob]"
# The same-pod A/B the job compiles, as the renderer planned it (`launch/aot_job.py`): JSON
# {"arms": AB_ARMS, "engine_flags": the pod's ENGINE_FLAGS, "program_sets": [{"settings": [NAME],
# "knobs": {KNOB: text}}]}, the program sets `aot --ab-arms` of those arms over those flags
# compiles (`ab/aot_arms.program_sets`). Unset: the trainer's programs, once.
AB_VARIABLE = "AOT_AB"
TRAINER_RUN = "trainer"  # the run of the trainer's programs, without an A/B
AB_RUN = "ab-arms"  # the A/B's one `aot --ab-arms` (no setting's name has a '-')
SUMMARY_FILE = "aot-job.txt"


@dataclasses.dataclass(frozen=True)
class Command:
    """A command each run compiles with: its parser, its runner and the knobs it takes as flags
    (its own table, so a knob it takes is passed and one it does not is not)."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    knobs: tuple[str, ...]


COMMANDS: Mapping[str, Command] = {
    "aot": Command(aot_command.add_arguments, aot_command.run, aot_command.AOT_KNOBS),
    "hlo-overlap": Command(
        hlo_overlap_command.add_arguments,
        hlo_overlap_command.run,
        hlo_overlap_command.HLO_OVERLAP_KNOBS,
    ),
}


@dataclasses.dataclass(frozen=True)
class Compile:
    """One command of one run: `aot` or `hlo-overlap` with its flags, and where its report goes."""

    run: str
    command: str
    argv: tuple[str, ...]
    report: Path  # the text report (stdout); the JSON one is its --output

    def describe(self) -> str:
        return f"{self.command} {' '.join(_shown(word) for word in self.argv)}"


def _shown(word: str) -> str:
    flag, equals, value = word.partition("=")
    return f"{flag}={json.dumps(value)}" if equals and flag.startswith("--") else word


# ----------------------------------------------------------------------------------------------
# What the image compiles with
# ----------------------------------------------------------------------------------------------


def toolchain_checks(needs_maxtext: bool) -> list[Callable[[], str]]:
    """What this process will compile with, each check giving its version and path or raising a
    UserError naming what the image lacks: jax, MaxText (for MaxText's programs), libtpu. MaxText
    comes before libtpu, so a log names the image's MaxText even where libtpu is missing."""
    return [_jax, *([_maxtext] if needs_maxtext else []), _libtpu]


def _jax() -> str:
    version = _distribution_version("jax")
    if version is None:
        raise UserError(
            f"jax is not installed in this image (python {sys.executable}): the AOT job compiles"
            " with the trainer's own jax and libtpu; run the job in the trainer's image"
        )
    return f"jax {version} at {_package_path('jax')}"


def _maxtext() -> str:
    if importlib.util.find_spec("maxtext") is None:
        raise UserError(
            f"maxtext is not importable in this image (python {sys.executable}): the trainer"
            " runs MaxText's programs and this job compiles them with the image's MaxText; run"
            " the job in the trainer's image (the renderer takes its client container's image)"
        )
    version = _distribution_version("maxtext") or "(no package metadata)"
    return f"maxtext {version} at {_package_path('maxtext')}"


def _libtpu() -> str:
    """libtpu's version and path: the `libtpu` package JAX loads, or TPU_LIBRARY_PATH's file."""
    library = os.environ.get("TPU_LIBRARY_PATH", "")
    if library:
        if not Path(library).is_file():
            raise UserError(
                f"TPU_LIBRARY_PATH={library}: no such file in this image; point it at libtpu.so"
                " or unset it to use the libtpu package"
            )
        return f"libtpu (version not recorded) at {library} (TPU_LIBRARY_PATH)"
    if importlib.util.find_spec("libtpu") is None:
        raise UserError(
            f"libtpu is not importable in this image (python {sys.executable}): compiling for a"
            " TPU slice from a CPU node needs it (pip install 'jax[tpu]' pairs it with jax); run"
            " the job in the trainer's image, which runs on TPUs and so has it"
        )
    names = importlib.metadata.packages_distributions().get("libtpu", [])
    versions = [v for v in map(_distribution_version, names) if v]
    version = versions[0] if versions else "(no package metadata)"
    return f"libtpu {version} at {_package_path('libtpu')}"


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_path(name: str) -> str:
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else str(spec.origin if spec else "?")


# ----------------------------------------------------------------------------------------------
# The plan: every compile, from the pod's knobs
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RenderedAb:
    """A same-pod A/B as the renderer planned it (AOT_AB): its arms, the ENGINE_FLAGS its program
    sets are composed over, and each program set: (the settings that compile it, its knobs)."""

    arms: str
    engine_flags: str
    program_sets: tuple[tuple[tuple[str, ...], dict[str, str]], ...]


def rendered_ab(env: Mapping[str, str]) -> RenderedAb | None:
    """AB_VARIABLE's A/B, None when unset; UserError when it is not the table the renderer
    writes."""
    text = env.get(AB_VARIABLE, "").strip()
    if not text:
        return None
    try:
        table = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{AB_VARIABLE}: not JSON ({error}); render the job again") from None
    if not isinstance(table, dict):
        table = {}
    sets = table.get("program_sets")
    if not (
        isinstance(table.get("arms"), str)
        and isinstance(table.get("engine_flags"), str)
        and isinstance(sets, list)
        and sets
        and all(_is_program_set(item) for item in sets)
    ):
        raise UserError(
            f"{AB_VARIABLE}: expected a JSON object of arms, engine_flags and program_sets"
            " ([{settings: [NAME], knobs: {KNOB: text}}]); render the job again"
        )
    return RenderedAb(
        table["arms"],
        table["engine_flags"],
        tuple((tuple(item["settings"]), dict(item["knobs"])) for item in sets),
    )


def _is_program_set(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("settings"), list)
        and bool(item["settings"])
        and all(isinstance(name, str) for name in item["settings"])
        and isinstance(item.get("knobs"), dict)
        and all(isinstance(v, str) for v in item["knobs"].values())
    )


def planned_compiles(env: Mapping[str, str], results_dir: Path) -> tuple[list[Compile], bool]:
    """Every command the job runs, its flags checked by the command's own parser, and whether any
    compiles MaxText's programs; UserError for a knob either would refuse. Without an A/B: `aot`
    and `hlo-overlap` of the pod's knobs. With one (AOT_AB): one `aot --ab-arms`, which compiles
    every program set beside the one state the A/B's arms share and gives the A/B's verdict, then
    `hlo-overlap` once per program set; sets whose flags hlo-overlap reads alike (they differ
    only in knobs it does not take, such as STAGE_BEFORE_UPDATE, which changes what `aot`
    counts but no program) compile once, under their names joined by '+'."""
    config = BenchConfig.from_env(env)
    ab = rendered_ab(env)
    if ab is None:
        return [
            _compile_of(TRAINER_RUN, command, _command_flags(command, config, env), results_dir)
            for command in COMMANDS
        ], config.engine == MAXTEXT
    if ab.engine_flags.strip() != config.engine_flags.strip():
        raise UserError(
            f"{AB_VARIABLE}: its program sets were composed over ENGINE_FLAGS={ab.engine_flags!r},"
            f" and this pod has ENGINE_FLAGS={config.engine_flags!r}: the manifest was edited"
            " after rendering; render it again"
        )
    ab_flags = (*_command_flags("aot", config, env), f"--ab-arms={ab.arms}")
    compiles = [_compile_of(AB_RUN, "aot", ab_flags, results_dir)]
    needs_maxtext = config.engine == MAXTEXT
    flags_by_meaning: dict[str, tuple[str, ...]] = {}
    names: dict[str, list[str]] = {}
    for settings, set_knobs in ab.program_sets:
        knobs = {**env, **set_knobs}
        set_config = BenchConfig.from_env(knobs)
        needs_maxtext |= set_config.engine == MAXTEXT
        flags = _command_flags("hlo-overlap", set_config, knobs)
        meaning = repr(sorted(vars(_parse("hlo-overlap", flags)).items()))
        flags_by_meaning.setdefault(meaning, flags)
        names.setdefault(meaning, []).extend(settings)
    compiles += [
        _compile_of("+".join(names[meaning]), "hlo-overlap", flags, results_dir)
        for meaning, flags in flags_by_meaning.items()
    ]
    return compiles, needs_maxtext


def _compile_of(run: str, command: str, flags: Sequence[str], results_dir: Path) -> Compile:
    """`command` of run `run`, its flags checked by its parser, its reports under `results_dir`."""
    report = results_dir / f"{command}-{run}.txt"
    argv = (*flags, f"--output={report.with_suffix('.json')}")
    _parse(command, argv)
    return Compile(run, command, argv, report)


def _command_flags(command: str, config: BenchConfig, knobs: Mapping[str, str]) -> tuple[str, ...]:
    """`command`'s flags for `knobs`: the cell, the trainer's slice, the knobs it takes."""
    if config.trainer_slice is None:
        raise UserError(
            "TRAINER_SLICE is not set: the AOT job compiles for the trainer's slice; set it"
            " (e.g. TRAINER_SLICE=tpu7x:4x4x8), as the renderer does"
        )
    return (
        f"--preset={config.preset.name}",
        f"--target={config.trainer_slice.name}",
        *(
            f"{DRIVER_KNOBS[knob].flag}={knobs[knob]}"
            for knob in COMMANDS[command].knobs
            if knobs.get(knob, "").strip()
        ),
    )


def ab_program_sets(args: argparse.Namespace, env: Mapping[str, str]) -> list[ProgramSet]:
    """The program sets of `aot --ab-arms` in this job: AOT_AB's, which the renderer found with
    the A/B's own code (this room cannot import it) for exactly these arms over these
    ENGINE_FLAGS; UserError when AOT_AB is missing or was found for others."""
    ab = rendered_ab(env)
    if ab is None:
        raise UserError(
            f"aot --ab-arms in the AOT job compiles the program sets the renderer found"
            f" ({AB_VARIABLE}), and this pod has none: render the job again"
        )
    if ab.arms != args.ab_arms or ab.engine_flags.strip() != (args.engine_flags or "").strip():
        raise UserError(
            f"aot --ab-arms={args.ab_arms!r} --engine-flags={args.engine_flags or ''!r}:"
            f" {AB_VARIABLE}'s program sets were found for --ab-arms={ab.arms!r}"
            f" --engine-flags={ab.engine_flags!r}; render the job again"
        )
    return list(ab.program_sets)


def _parse(command: str, argv: Sequence[str]) -> argparse.Namespace:
    """`argv` read by `command`'s own parser; UserError with its message."""
    parser = argparse.ArgumentParser(prog=f"rl-trainer-bench {command}", exit_on_error=False)
    COMMANDS[command].add_arguments(parser)
    try:
        return parser.parse_args(list(argv))
    except argparse.ArgumentError as error:
        raise UserError(f"{command}: {error}") from None


# ----------------------------------------------------------------------------------------------
# The job
# ----------------------------------------------------------------------------------------------


def run(env: Mapping[str, str], log: Callable[[str], None]) -> int:
    """The job: the toolchain, the plan, then every compile (PLAN_ONLY=1: the first two only).
    Exit status: the worst of the commands' (0 fits and reported, 1 a program does not fit or
    did not compile, 2 bad input)."""
    config = BenchConfig.from_env(env)
    digest = code_sha256(engine=config.engine, aot_job=True)
    rendered = env.get("BENCH_CODE_SHA256", "")
    if rendered and rendered != digest:
        raise UserError(
            f"the job's code has sha256 {digest}, not the {rendered} it was rendered with: the"
            " manifest was edited after rendering; render it again"
        )
    log(f"{PREFIX} code sha256={digest}")
    compiles, needs_maxtext = planned_compiles(env, config.results_dir)
    lines = []
    for check in toolchain_checks(needs_maxtext):
        lines.append(check())
        log(f"{PREFIX} compiles with {lines[-1]}")
    flags = env.get("LIBTPU_INIT_ARGS", "")
    log(
        f"{PREFIX} libtpu flags: LIBTPU_INIT_ARGS={flags}"
        if flags
        else f"{PREFIX} libtpu flags: none (libtpu's defaults)"
    )
    for item in compiles:
        log(f"{PREFIX} run {item.run}: {item.describe()}")
    log(f"{PREFIX} results: {_results_line(config)}")
    if config.plan_only:
        log(f"{PREFIX} plan only: nothing compiled")
        return 0
    config.results_dir.mkdir(parents=True, exist_ok=True)
    codes: dict[Compile, int] = {}
    # Each report is copied as its command ends, and all of them when the job ends, whatever
    # ended it: what it wrote outlives the pod.
    with copying(config.results_dir, config.results_uri, log):
        try:
            for item in compiles:
                log(f"{PREFIX} run {item.run}: {item.command} starts")
                codes[item] = _compile(item, env, log)
                log(f"{PREFIX} run {item.run}: {item.command} exit {codes[item]}")
        finally:
            summary = [
                *lines,
                *(f"run {c.run}: {c.describe()}: exit {code}" for c, code in codes.items()),
            ]
            write_text_atomically(config.results_dir / SUMMARY_FILE, "\n".join(summary) + "\n")
    return max(codes.values(), default=0)


def _results_line(config: BenchConfig) -> str:
    if not config.results_uri:
        return (
            f"{config.results_dir} on the pod's disk, lost with the pod: set RESULTS_URI to a"
            " gs:// folder or a mounted volume; the reports are in the log too"
        )
    return (
        f"{config.results_dir}, copied as the job goes and when it ends to"
        f" {config.results_uri}/<UTC time>/"
    )


def _compile(item: Compile, env: Mapping[str, str], log: Callable[[str], None]) -> int:
    """One command in a child process with the job's environment (AOT_AB among it); its report
    (stdout) into the log and `item.report`."""
    child = subprocess.Popen(
        [sys.executable, "-m", MODULE, item.command, *item.argv],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(env),
    )
    lines = []
    try:
        for line in child.stdout:
            lines.append(line)
            log(line.rstrip("\n"))
        return child.wait()
    except BaseException:  # SIGTERM or Ctrl-C: the child's compile goes with the job
        child.terminate()
        child.wait()
        raise
    finally:
        write_text_atomically(item.report, "".join(lines))


def _run_command(command: str, words: Sequence[str], env: Mapping[str, str]) -> int:
    """One of COMMANDS, a child of the job; `aot --ab-arms` with the program sets AOT_AB holds."""
    args = _parse(command, words)
    if command == "aot" and args.ab_arms is not None:
        return aot_command.run(args, ab_program_sets(args, env))
    return COMMANDS[command].run(args)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The pod's entry, knobs from the environment; `COMMAND ARGS` runs one of COMMANDS (the
    job's child processes)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if env is None else env
    if argv and argv[0] in COMMANDS:
        command, words = argv[0], argv[1:]
        return run_guarded(
            f"rl-trainer-bench {command}",
            lambda: _run_command(command, words, env),
            (UserError, ContractError),
        )

    def body() -> int:
        if argv:
            raise UserError(
                f"the AOT job takes its knobs from the environment, or one of"
                f" {', '.join(COMMANDS)}: {argv[0]!r}"
            )
        return run(env, lambda line: print(line, flush=True))

    return run_guarded(PROG, body, (UserError, ContractError))


if __name__ == "__main__":
    exit_process(main())
