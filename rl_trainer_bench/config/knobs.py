"""Driver knobs: one table (name, default, parser, formatter, help, surfaces) that every entry point reads.

Each row is one knob everywhere: the driver reads it from its environment (`BenchConfig.from_env`)
and `rl-trainer-bench run` takes it as a flag (`--micro-steps` for MICRO_STEPS); `surfaces` names
the other commands that take it (`render`, which passes it through to the pod's driver; `ab`; `aot`;
`check-engine`; `hlo-overlap`; `payload` and `check`), and `command_defaults` what it is there when
unset, where that differs from the row's default. Those commands' knob flags, the renderer's
pass-through knobs and the names it reserves in the pod's environment are all generated from the
rows (`knobs_of`: `launch/knobs.py`, `ab/parser.py`, `preflight/aot/command.py`,
`preflight/check_engine.py`, `preflight/hlo/command.py`, `payload/command.py`), so a knob's
default, accepted forms and help are written once, and a command takes a knob by one row's word.
`format` is `parse`'s inverse: the one way a typed value becomes text again, used where text must
cross a process boundary (the pod's environment the renderer writes).
`BenchConfig`'s defaults, its `from_env` and its `describe` are derived from the table: adding a
knob is adding a row and the typed `BenchConfig` field it names (docs/run.md, "Adding a knob").
Errors are `ConfigError`s whose one-line message names the knob, the value and what is allowed,
because a pod's log is often the only place a user sees them.

A pod's environment holds far more than knobs (the trainer's, Kubernetes'), so unknown names are
not refused as such; a name that is *close* to a knob (the same letters without underscores, or
within a small edit distance of a knob of 5 or more letters; see `misspelt_knob`) is refused
naming the knob it resembles, because a typo that silently does nothing costs a pod run.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rl_trainer_bench.chips.accelerators import TpuSlice, parse_slice
from rl_trainer_bench.chips.local_chips import LocalTpu
from rl_trainer_bench.config import compile_cache, values
from rl_trainer_bench.config.engine_choice import (
    MAXTEXT_WARMUP_STEPS,
    choose_engine,
    engine_warmup_steps,
)
from rl_trainer_bench.config.engine_keys import (
    CommandLine,
    EngineFlags,
    ResolvedEngine,
    command_line,
    engine_flags_of,
)
from rl_trainer_bench.config.presets import (
    HOST_DEFAULT,
    ONE_CHIP_PRESETS,
    PRESETS,
    Preset,
    default_preset,
    preset,
    preset_for_model,
)
from rl_trainer_bench.config.step_shape import LENGTH_FLAGS, StepShape, launcher_step_shape
from rl_trainer_bench.engine.config import GPU_PLATFORMS
from rl_trainer_bench.engine.factory import BUILT_IN, ENGINE_NAMES
from rl_trainer_bench.engine.maxtext.tunix_grpo import AUTO, MAXTEXT, MAXTEXT_DRIVERS, TUNIX
from rl_trainer_bench.errors import ConfigError

_ENGINE_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", re.ASCII)
# What an unnamed preset is, as the help of PRESET and --preset says it
CHIP_DEFAULT_NOTE = (
    "for `run` and `ab` on a host with one TPU chip its one-chip preset ({}), else {}".format(
        ", ".join(f"{name} on {kind}" for kind, name in ONE_CHIP_PRESETS.items()), HOST_DEFAULT
    )
)
# Where a run's micro_steps came from (`BenchConfig.micro_steps_source`).
MICRO_STEPS_SOURCE = "MICRO_STEPS"
LAUNCHER_SOURCE = "the launcher"
PRESET_SOURCE = "the preset"
STAGE_ISSUE_CHOICES = ("auto", "before_last", "after_last")
WORKER_CHOICES = ("separate", "fused")


def _shown(value: Any) -> str:
    """How the start-of-run config line writes a value: argv as shell words, nothing as '-'."""
    if value is None or value == "" or value == ():
        return "-"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return shlex.join(value)
    return str(value)


# The commands that take a knob besides the driver's environment and `run`, which take every row.
RENDER = "render"  # passed through to the pod's driver
AB = "ab"  # a flag of `ab`, the same for every arm
AOT = "aot"  # a flag of the compile, and of the AOT job's `aot` runs
CHECK_ENGINE = "check-engine"
HLO_OVERLAP = "hlo-overlap"  # a flag of the compile, and of the AOT job's `hlo-overlap` runs
PAYLOAD = "payload"
CHECK = "check"  # the CPU checks of a built micro-batch
SURFACES = (RENDER, AB, AOT, CHECK_ENGINE, HLO_OVERLAP, PAYLOAD, CHECK)


@dataclasses.dataclass(frozen=True)
class Knob:
    """One driver knob: its environment name, default text, parser and formatter, help, the
    commands that take it and its BenchConfig field.

    `default` is the text the knob has when unset; "" means the knob reads as `unset`, for knobs
    whose value follows from others (MICRO_STEPS from the preset), which `unset_help` says.
    `format` writes a value as text that `parse` reads back as the same value.
    `surfaces` names the commands of SURFACES that take the knob; `command_defaults` what the
    knob is in one of them when its flag is not given, where that is not the row's default (the
    command then resolves it: `ab`'s warm-up is the longest any arm's engine needs).
    `field` is the BenchConfig field it sets (default: the name in lower case); the three STAGE_*
    knobs set one field together (`StageConfig.from_env`). `shown` writes the field's value for
    the start-of-run config line (`BenchConfig.describe`); None leaves the knob off that line.
    """

    name: str
    default: str
    parse: Callable[[str, str], Any]  # (knob name, text) -> value, or ConfigError
    help: str
    format: Callable[[Any], str] = str  # value -> text that `parse` reads back as the value
    unset_help: str = ""  # what an unset knob means, where `default` gives no text
    surfaces: frozenset[str] = frozenset()
    command_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    field: str = ""
    unset: Any = None  # the value when neither the environment nor `default` gives text
    shown: Callable[[Any], str] | None = _shown

    @property
    def dest(self) -> str:
        """The BenchConfig field this knob sets."""
        return self.field or self.name.lower()

    @property
    def flag(self) -> str:
        """The command-line spelling: `--micro-steps` for MICRO_STEPS."""
        return "--" + self.name.lower().replace("_", "-")

    def read(self, env: Mapping[str, str]) -> Any:
        """The knob's value in `env` (empty or unset: its default; no default: None)."""
        text = env.get(self.name, "").strip() or self.default
        return self.parse(self.name, text) if text else self.unset

    def default_note(self, command: str = "") -> str:
        """' (default ...)' for the help of `command`'s flag: its own default where the row
        declares one, else the row's; '' where neither is said."""
        if command in self.command_defaults:
            return f" (default: {self.command_defaults[command]})"
        if self.unset_help:
            return f" (default: {self.unset_help})"
        return f" (default {self.default})" if self.default else ""


# Bounds of the count knobs: far above any run worth timing, far below what exhausts the host's
# memory in step records (an A/B holds every record of every arm) or its patience.
MAX_STEPS = 100_000
MAX_MICRO_STEPS = 4_096
MAX_SEED = 2**64 - 1


def _between(minimum: int, maximum: int) -> Callable[[str, str], int]:
    return lambda name, text: values.whole_number(name, text, minimum, maximum)


def _one_of(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    return lambda name, text: values.choice(name, text, choices)


def _preset(name: str, text: str) -> Preset:
    return preset(text)


def _engine_flags(name: str, text: str) -> EngineFlags:
    """ENGINE_FLAGS stays text (the engine-key grammar, the same in `aot`, `run` and the pod),
    read here, once, into its keys (`EngineFlags`)."""
    return EngineFlags(text)


def _text(name: str, text: str) -> str:
    return text


# Where RESULTS_URI may point: a Cloud Storage folder, or a path (a mounted volume) with no scheme.
GCS_PREFIX = "gs://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _results_uri(name: str, text: str) -> str:
    """A gs:// folder with a bucket, or a path; any other scheme would be copied to a local folder
    of that name and lost with the pod, so it is refused."""
    bucket = text[len(GCS_PREFIX) :].split("/")[0] if text.startswith(GCS_PREFIX) else None
    if (_SCHEME.match(text) and bucket is None) or bucket == "":
        raise ConfigError(
            f"{name}={text!r}: give a gs://BUCKET/folder or a folder on a mounted volume"
        )
    return text


def engine_spec(text: str, knob: str = "ENGINE") -> str:
    """`text` as an engine name (`module:Class`, or a short name of ENGINE_NAMES), checked for
    form only: importing it is the engine factory's job, at start-up, so validating knobs stays
    host work."""
    spec = text.strip() or BUILT_IN
    spec = ENGINE_NAMES.get(spec, spec)
    if not _ENGINE_SPEC.fullmatch(spec):
        raise ConfigError(
            f"{knob}={text!r} is not module:Class nor one of {', '.join(ENGINE_NAMES)}:"
            f" e.g. {knob}={BUILT_IN}"
        )
    return spec


def _slice(name: str, text: str) -> TpuSlice:
    try:
        return parse_slice(text)
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


# What an unset WARMUP_STEPS is: the engine's (`engine_warmup_steps`).
_ENGINE_WARMUP = (
    f"{MAXTEXT_WARMUP_STEPS} for MaxText's, which compiles its metric ops in the step after the"
    " first; else 1"
)

KNOBS: tuple[Knob, ...] = (
    Knob(
        "PRESET",
        "",
        _preset,
        "preset name",
        format=lambda chosen: chosen.name,
        unset_help=f"the preset of the model TRAINER_ARGV names, else {CHIP_DEFAULT_NOTE}",
        shown=lambda chosen: chosen.name,
    ),
    Knob(
        "STEPS",
        "5",
        _between(1, MAX_STEPS),
        f"scored steps, 1..{MAX_STEPS:,}",
        surfaces=frozenset({RENDER, AB}),
        command_defaults={AB: "the order's, as listed"},
    ),
    Knob(
        "WARMUP_STEPS",
        "",
        _between(1, MAX_STEPS),
        f"warm-up steps before the scored ones, 1..{MAX_STEPS:,}",
        unset_help=f"the engine's: {_ENGINE_WARMUP}",
        surfaces=frozenset({AB}),
        command_defaults={AB: f"the most any arm's engine needs: {_ENGINE_WARMUP}"},
    ),
    Knob(
        "MICRO_STEPS",
        "",
        _between(1, MAX_MICRO_STEPS),
        f"fwd_bwd calls per step, 1..{MAX_MICRO_STEPS:,}",
        unset_help="the launcher's, from ORCH_ARGV and TRAINER_ARGV, where they give prompts,"
        " generations and rows per step; else the preset's",
        surfaces=frozenset({RENDER, AOT}),
    ),
    Knob(
        "DISTINCT_MICRO_BATCHES",
        "",
        _between(1, MAX_MICRO_STEPS + 1),
        f"micro-batches in the pool, 1..{MAX_MICRO_STEPS + 1:,}",
        unset_help="MICRO_STEPS + 1",
    ),
    Knob(
        "STAGE_BEFORE_UPDATE",
        "off",
        values.switch,
        "on|off (or 1|0)",
        format=values.format_switch,
        surfaces=frozenset({AOT}),
        field="stage",
        shown=lambda stage: stage.describe(),
    ),
    Knob(
        "STAGE_AFTER_UPDATE",
        "off",
        values.switch,
        "on|off (exclusive with STAGE_BEFORE_UPDATE)",
        format=values.format_switch,
        field="stage",
        shown=None,  # STAGE_BEFORE_UPDATE's row shows the stage
    ),
    Knob(
        "STAGE_ISSUE",
        "auto",
        _one_of(STAGE_ISSUE_CHOICES),
        "auto|before_last|after_last: where in the step the stage's copy is issued",
        field="stage",
        shown=None,
    ),
    Knob(
        "PROFILE_STEPS",
        "",
        values.step_window,
        f"steps to trace with jax.profiler: {values.STEP_WINDOW_FORMS}, warm-up steps first",
        format=values.format_step_window,
        unset_help="none",
        surfaces=frozenset({RENDER}),
        shown=lambda window: "-" if window is None else values.format_step_window(window),
    ),
    Knob(
        "MEASURE_PEAK",
        "off",
        values.switch,
        "on|off (or 1|0): after the scored steps, measure one step's device peak by the largest"
        " filler allocation beside which it still runs (an accelerator's; a few more steps)",
        format=values.format_switch,
        shown=values.format_switch,
    ),
    Knob("RESULTS_DIR", "bench_results", lambda name, text: Path(text), "folder for results"),
    Knob(
        "RESULTS_URI",
        "",
        _results_uri,
        "where RESULTS_DIR is copied as the run goes and when it ends, for results that"
        " outlive the pod: a gs:// folder or a folder on a mounted durable volume",
        unset_help="no copy",
        surfaces=frozenset({RENDER}),
        command_defaults={RENDER: "under the trainer's durable output folder, if it has one"},
    ),
    Knob(
        compile_cache.KNOB,
        "",
        compile_cache.parse,
        "the folder keeping compiled programs between runs, or off",
        unset_help=compile_cache.UNSET_HELP,
        surfaces=frozenset({RENDER, AB}),
        command_defaults={AB: f"{compile_cache.KNOB}'s"},
        unset="",
    ),
    Knob(
        "ROUTING_PROFILE",
        "",
        _text,
        "routing profile JSON path",
        unset_help="the shipped one",
        surfaces=frozenset({AOT, PAYLOAD, CHECK}),
    ),
    Knob(
        "SEED",
        "0",
        _between(0, MAX_SEED),
        "seed of the micro-batch pool, 0..2^64-1",
        surfaces=frozenset({AOT, PAYLOAD, CHECK}),
    ),
    Knob(
        "TRAINER_ARGV",
        "",
        values.shell_words,
        "the trainer's command, shell words: NAME=value words before its flags carry its MaxText"
        " keys (MAXTEXT_EXTRA_FLAGS, REMAT_POLICY, NUM_MOE_TOKEN_CHUNKS, ...), its flags engine keys",
        format=values.shell_join,
        surfaces=frozenset({RENDER, AOT, CHECK_ENGINE, HLO_OVERLAP}),
        command_defaults={RENDER: "the trainer's own, from its container"},
        unset=(),
    ),
    Knob(
        "ENGINE_FLAGS",
        "",
        _engine_flags,
        "key=value engine keys, separated by spaces or commas (quotes and {...} kept whole)",
        surfaces=frozenset({RENDER, AOT, CHECK_ENGINE, HLO_OVERLAP}),
        unset="",
    ),
    Knob(
        "ORCH_ARGV",
        "",
        values.shell_words,
        "the orchestrator's argv, shell words (micro-batch rows and lengths)",
        format=values.shell_join,
        surfaces=frozenset({RENDER}),
        command_defaults={RENDER: "the orchestrator's, from its JobSet if present"},
        unset=(),
    ),
    Knob("WORKER", "separate", _one_of(WORKER_CHOICES), "separate|fused"),
    Knob(
        "ENGINE",
        "",
        lambda name, text: engine_spec(text, name),
        "module:Class of the engine to time, built as Class(engine_config), or builtin|maxtext;"
        " in a pod its package must be in the trainer's image",
        unset_help="MaxText's engine when the trainer runs MaxText, else the built-in one",
        surfaces=frozenset({RENDER, AOT, CHECK_ENGINE, HLO_OVERLAP}),
    ),
    Knob(
        "MAXTEXT_DRIVER",
        AUTO,
        _one_of(MAXTEXT_DRIVERS),
        f"{'|'.join(MAXTEXT_DRIVERS)}: what drives MaxText's engine: {TUNIX} = Tunix's"
        f" TrainerWorker with Tunix's GRPO loss, {MAXTEXT} = the adapter's own calls with"
        f" MaxText's router-replay loss, {AUTO} = {TUNIX} where Tunix's worker and loss import",
        surfaces=frozenset({CHECK_ENGINE}),
    ),
    Knob(
        "TRAINER_SLICE",
        "",
        _slice,
        "the TPU slice the run is for, e.g. v5p:4x8x8; the plan checks the mesh against it, not"
        " against the machine it runs on",
        format=lambda tpu_slice: tpu_slice.name,
        surfaces=frozenset({RENDER}),
        command_defaults={RENDER: "the trainer's"},
        shown=None,
    ),
    Knob(
        "PLAN_ONLY",
        "0",
        values.switch,
        "1: validate everything, print the resolved cell and exit before any device work"
        " (flag: --plan)",
        format=values.format_switch,
        shown=None,
    ),
)
DRIVER_KNOBS: Mapping[str, Knob] = {knob.name: knob for knob in KNOBS}
# The knobs that decide the stage (one BenchConfig field, `stage`), as the table says.
STAGE_KNOBS: tuple[str, ...] = tuple(knob.name for knob in KNOBS if knob.dest == "stage")


def knob_default(name: str) -> Any:
    """The value knob `name` has when it is not set: a BenchConfig field's default."""
    return DRIVER_KNOBS[name].read({})


def knobs_of(surface: str) -> tuple[str, ...]:
    """The knobs whose rows say `surface` (one of SURFACES) takes them, in table order."""
    return tuple(knob.name for knob in KNOBS if surface in knob.surfaces)


def add_driver_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per driver knob, named after it (`--micro-steps` for MICRO_STEPS)."""
    for knob in KNOBS:
        parser.add_argument(
            knob.flag, dest=knob.name, metavar="VALUE", help=knob.help + knob.default_note()
        )
    parser.add_argument(
        "--plan", dest="PLAN_ONLY", action="store_const", const="1", help="the same as PLAN_ONLY=1"
    )


def add_knob_flags(
    parser: argparse.ArgumentParser,
    names: Iterable[str],
    notes: Mapping[str, str] | None = None,
    command: str = "",
) -> None:
    """The flags of a command that takes knobs `names` as flags of its own (`check-engine`, `aot`,
    `ab`, `payload`): each declared by its row, with its spelling (`--engine-flags` for
    ENGINE_FLAGS), help, default and parser, so its value is the row's (a bad one is argparse's
    one line, exit 2). `notes` ends a knob's help with what it means to that command. Where the
    row gives `command` a default of its own, the flag's default is None: the command resolves it."""
    for name in names:
        knob = DRIVER_KNOBS[name]
        default = None if command in knob.command_defaults else knob.read({})
        parser.add_argument(
            knob.flag,
            dest=knob.name.lower(),
            type=_flag_parser(knob, default),
            default=default,
            metavar=knob.name,
            help=knob.help + (notes or {}).get(name, "") + knob.default_note(command),
        )


def _flag_parser(knob: Knob, default: Any) -> Callable[[str], Any]:
    """The row's parser as an argparse type; an empty value is the flag's default."""

    def parse(text: str) -> Any:
        try:
            return knob.parse(knob.flag, text) if text.strip() else default
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_preset_flag(parser: argparse.ArgumentParser, what: str, on_chip: bool = False) -> None:
    """`--preset` of the commands that build or compile one cell; unset, the default preset, or
    with `on_chip` (a command that times a cell on this host) None: the host's default
    (`presets.default_preset`), resolved by the command."""
    default = None if on_chip else HOST_DEFAULT
    shown = CHIP_DEFAULT_NOTE if on_chip else HOST_DEFAULT
    parser.add_argument(
        "--preset", default=default, help=f"{what}: one of {', '.join(PRESETS)} (default: {shown})"
    )


def driver_knobs(env: Mapping[str, str], flags: argparse.Namespace) -> dict[str, str]:
    """The driver knobs: the environment's, overridden by any flag given; misspelt names refused."""
    refuse_misspelt_knobs(env, "the environment")
    knobs = {k: env[k] for k in DRIVER_KNOBS if k in env}
    knobs.update({k: v for k, v in vars(flags).items() if k in DRIVER_KNOBS and v is not None})
    return knobs


# ----------------------------------------------------------------------------------------------
# Misspelt knobs
# ----------------------------------------------------------------------------------------------


def _squashed(name: str) -> str:
    return name.upper().replace("_", "").replace("-", "")


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


_MOST_EDITS = 2  # the most edits a typo may be from its knob (knobs of 10 letters or more)


def _allowed_distance(knob: str) -> int:
    """Short names are common words (SEED, STEPS): only their exact letters count as a typo."""
    length = len(_squashed(knob))
    return 0 if length < 5 else 1 if length < 10 else _MOST_EDITS


def misspelt_knob(name: str, knobs: Iterable[str] = DRIVER_KNOBS) -> str | None:
    """The knob `name` looks like a typo of, or None (a knob itself, or unlike every knob).

    Names are compared upper-cased without underscores (MICROSTEPS, micro_steps), then by edit
    distance: up to 1 for knobs of 5-9 letters, 2 for longer ones, none for shorter ones.
    """
    knobs = list(knobs)
    if name in knobs:
        return None
    squashed = _squashed(name)
    # A length differing by more than the largest allowed distance is more edits away than that:
    # such knobs are never the answer, and a process's environment holds many unlike names.
    near = [k for k in knobs if abs(len(_squashed(k)) - len(squashed)) <= _MOST_EDITS]
    if not near:
        return None
    distance, nearest = min((_edit_distance(squashed, _squashed(k)), k) for k in near)
    return nearest if distance <= _allowed_distance(nearest) else None


def refuse_misspelt_knobs(
    env: Iterable[str], where: str, knobs: Iterable[str] = DRIVER_KNOBS
) -> None:
    """ConfigError naming the first variable of `env` that looks like a misspelt knob."""
    knobs = list(knobs)
    for name in sorted(env):
        nearest = misspelt_knob(name, knobs)
        if nearest is not None:
            raise ConfigError(
                f"{name} is not a knob: did you mean {nearest}? (set in {where}; rename it)"
            )


# ----------------------------------------------------------------------------------------------
# The validated configuration
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """When the next step's first micro-batch is staged, if at all.

    `before_update` stages it at the boundary, before `update()`; `after_update` stages it right
    after `update()` is dispatched, so one A/B shows what each order hides. `issue` places the
    before-update copy relative to the step's last `fwd_bwd`: on a GPU a copy issued after a
    dispatched computation queues behind it, so `auto` issues it before the last dispatch there
    and after it elsewhere.
    """

    before_update: bool = False
    after_update: bool = False
    issue: str = "auto"

    @property
    def enabled(self) -> bool:
        return self.before_update or self.after_update

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StageConfig:
        before = DRIVER_KNOBS["STAGE_BEFORE_UPDATE"].read(env)
        after = DRIVER_KNOBS["STAGE_AFTER_UPDATE"].read(env)
        if before and after:
            raise ConfigError("STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE are exclusive: set one")
        return cls(before, after, DRIVER_KNOBS["STAGE_ISSUE"].read(env))

    def issue_before_last(self, platform: str) -> bool:
        """Whether the before-update copy goes out before the step's last fwd_bwd on `platform`."""
        if self.issue == "auto":
            return platform in GPU_PLATFORMS
        return self.issue == "before_last"

    def describe(self) -> str:
        if self.before_update:
            return f"before_update(issue={self.issue})"
        return "after_update" if self.after_update else "off"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The driver's knobs, validated. Steps are numbered from 0; warm-up steps come first.

    One field per knob (`Knob.dest`; the STAGE_* knobs share `stage`), its default the knob's.
    MICRO_STEPS unset means the launcher's (`from_env`: `config/step_shape.py`) else the preset's,
    DISTINCT_MICRO_BATCHES unset one more than MICRO_STEPS, WARMUP_STEPS unset the engine's
    (`engine_warmup_steps`).
    """

    preset: Preset
    steps: int = dataclasses.field(default=knob_default("STEPS"))
    warmup_steps: int = dataclasses.field(default=knob_default("WARMUP_STEPS"))
    micro_steps: int = dataclasses.field(default=knob_default("MICRO_STEPS"))
    distinct_micro_batches: int = dataclasses.field(default=knob_default("DISTINCT_MICRO_BATCHES"))
    stage: StageConfig = StageConfig()
    # An inclusive step range, or None.
    profile_steps: tuple[int, int] | None = dataclasses.field(default=knob_default("PROFILE_STEPS"))
    measure_peak: bool = dataclasses.field(default=knob_default("MEASURE_PEAK"))
    results_dir: Path = dataclasses.field(default=knob_default("RESULTS_DIR"))
    results_uri: str | None = dataclasses.field(default=knob_default("RESULTS_URI"))
    # "off", a folder, or "" (unset: config/compile_cache.folder resolves it in the run's process)
    compile_cache: str = dataclasses.field(default=knob_default("COMPILE_CACHE"))
    routing_profile: str | None = dataclasses.field(default=knob_default("ROUTING_PROFILE"))
    seed: int = dataclasses.field(default=knob_default("SEED"))
    trainer_argv: CommandLine = dataclasses.field(default=knob_default("TRAINER_ARGV"))
    # key=value engine keys, as written, and read (EngineFlags: the keys are read from there).
    engine_flags: EngineFlags = dataclasses.field(default=knob_default("ENGINE_FLAGS"))
    orch_argv: CommandLine = dataclasses.field(default=knob_default("ORCH_ARGV"))
    worker: str = dataclasses.field(default=knob_default("WORKER"))
    engine: str = BUILT_IN  # module:Class; from_env resolves an unset ENGINE (engine_choice.py)
    maxtext_driver: str = dataclasses.field(default=knob_default("MAXTEXT_DRIVER"))
    trainer_slice: TpuSlice | None = dataclasses.field(default=knob_default("TRAINER_SLICE"))
    plan_only: bool = dataclasses.field(default=knob_default("PLAN_ONLY"))
    preset_source: str = "PRESET"  # what chose the preset: PRESET, a trainer flag, or the default
    engine_source: str = "ENGINE"  # what chose the engine: ENGINE, or the trainer's command
    # What the launcher says of the step (None: not read), and where micro_steps came from.
    step_shape: StepShape | None = None
    micro_steps_source: str = PRESET_SOURCE
    # The engine config `from_env` resolved from these fields (None: the plan resolves it).
    resolved_engine: ResolvedEngine | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        # The command knobs are read once: given as words or text (a config made in code, or
        # changed by dataclasses.replace), they are read here; from the knobs, they come read.
        object.__setattr__(self, "trainer_argv", command_line(self.trainer_argv))
        object.__setattr__(self, "orch_argv", command_line(self.orch_argv))
        object.__setattr__(self, "engine_flags", engine_flags_of(self.engine_flags))
        resolved = self.resolved_engine
        if resolved is not None and not resolved.resolved_from(
            self.preset, self.engine, self.trainer_argv, self.engine_flags
        ):  # a field it was resolved from was replaced: the plan resolves it again
            object.__setattr__(self, "resolved_engine", None)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", engine_warmup_steps(self.engine))
        if self.micro_steps is None:
            object.__setattr__(self, "micro_steps", self.preset.micro_steps)
        if self.distinct_micro_batches is None:
            object.__setattr__(self, "distinct_micro_batches", self.micro_steps + 1)
        self._check_profile_window()

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, tpu: LocalTpu | None = None, **given: Any
    ) -> BenchConfig:
        """Validate every knob in `env` (host work only: nothing here touches a device), with
        `given` fields (already typed: a command's parsed flags, an A/B's own steps) over the
        knobs', so what follows from them (preset, engine, micro-steps) follows from them alike.
        `tpu`: the usable TPU chips of the host the run is on, where that is this host (a
        command's, not a rendered pod's), for the default preset."""
        refuse_misspelt_knobs(env, "the knobs")
        fields = {knob.dest: knob.read(env) for knob in KNOBS if knob.dest != "stage"}
        stage = given.pop("stage", None) or StageConfig.from_env(env)
        fields.update(given)
        for name, read in (
            ("trainer_argv", command_line),
            ("engine_flags", engine_flags_of),
            ("orch_argv", command_line),
        ):  # the commands' words, and ENGINE_FLAGS where `given` holds text, read once, here
            fields[name] = read(fields[name])
        trainer_flags = fields["trainer_argv"].flags
        fields["preset"], source = chosen_preset(fields["preset"], trainer_flags, tpu)
        fields["orch_argv"] = _with_lengths(fields["orch_argv"], trainer_flags)
        choice = choose_engine(fields["engine"], fields["trainer_argv"], fields["preset"].engine)
        fields["engine"] = choice.spec
        fields["step_shape"], fields["resolved_engine"] = launcher_step_shape(
            fields["preset"],
            fields["trainer_argv"],
            fields["engine_flags"],
            fields["orch_argv"],
            choice.spec,
        )
        fields["micro_steps"], fields["micro_steps_source"] = _micro_steps(
            fields["micro_steps"], fields["step_shape"]
        )
        return cls(
            **fields,
            stage=stage,
            preset_source=source,
            engine_source=choice.source,
        )

    def _check_profile_window(self) -> None:
        if self.profile_steps is not None and self.profile_steps[1] >= self.total_steps:
            raise ConfigError(
                "PROFILE_STEPS='{}:{}' is outside the run: steps are 0..{} (warm-up first)".format(
                    *self.profile_steps, self.total_steps - 1
                )
            )

    def describe(self) -> dict[str, str]:
        """The configuration as the driver logs it at start: knob (STAGE for the three STAGE_*
        knobs) -> value."""
        return {
            knob.dest.upper(): knob.shown(getattr(self, knob.dest))
            for knob in KNOBS
            if knob.shown is not None
        }


def chosen_preset(
    given: Preset | None, trainer_flags: Mapping[str, str], tpu: LocalTpu | None = None
) -> tuple[Preset, str]:
    """PRESET when set, else the preset of the model the trainer's flags name, else the default
    (`presets.default_preset`): a one-chip preset where `tpu` (a command run on this host: its
    usable chips) has one, else the host's."""
    if given is not None:
        return given, "PRESET"
    mapped = preset_for_model(trainer_flags)
    if mapped is not None:
        return mapped
    return default_preset(tpu)


def _micro_steps(given: int | None, shape: StepShape) -> tuple[int | None, str]:
    """MICRO_STEPS where set, else the launcher's count, else None (the preset's, in
    `__post_init__`), with its source."""
    if given is not None:
        return given, MICRO_STEPS_SOURCE
    if shape.micro_steps is None:
        return None, PRESET_SOURCE
    if shape.micro_steps > MAX_MICRO_STEPS:
        raise ConfigError(
            f"the launcher's step is {shape.micro_steps:,} micro-steps ({shape.how}), more than"
            f" the bench runs ({MAX_MICRO_STEPS:,}): set MICRO_STEPS"
        )
    return shape.micro_steps, LAUNCHER_SOURCE


def _with_lengths(orch_argv: CommandLine, trainer_flags: Mapping[str, str]) -> CommandLine:
    """ORCH_ARGV with the sequence lengths it lacks taken from the trainer's flags.

    Both processes are launched with the same lengths; an orchestrator command that leaves them to
    its defaults or a config file should not make the pod refuse what the trainer states.
    """
    if not orch_argv:
        return orch_argv
    given = orch_argv.flags
    supplied = {k: trainer_flags[k] for k in LENGTH_FLAGS if k not in given and k in trainer_flags}
    return orch_argv.with_flags(supplied)
