"""Render knobs: one table of names, validated once into `RenderKnobs`.

`render_bench.sh` reads each knob from its environment variable, `render_bench.py` and
`rl-trainer-bench render` from the flag spelled in lower case with dashes; both go through
`RenderKnobs.from_strings`, so a value means the same thing whichever way it arrives, and a bad
one is refused before any input is read. This module imports no YAML, schema or JAX, so building
the command line stays cheap.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping

from rl_trainer_bench.accelerators import TpuSlice, parse_slice
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.pod_script import CODE_DIR_VARIABLE

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENGINE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_STEP_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclasses.dataclass(frozen=True)
class Knob:
    """One render knob: `render_bench.sh` reads ENV, `render_bench.py` and `render` take --flag."""

    env: str
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")

    @property
    def dest(self) -> str:
        return self.env.lower()


KNOBS: tuple[Knob, ...] = (
    Knob("LAUNCH_RENDER", "the launcher's DRY_RUN output (a file, or - for stdin; default -)"),
    Knob("TRAINER_JOBSET", "the trainer JobSet's name, when the input holds several candidates"),
    # Not NAME: a generic variable that shells and CI often set already.
    Knob(
        "BENCH_NAME",
        "the bench JobSet's name (default: the trainer's + '-bench', shortened to fit)",
    ),
    Knob("ENGINE_FLAGS", "key=value engine flags applied after the trainer's (last one wins)"),
    Knob("LIBTPU_FLAGS", "--flag=value words merged into LIBTPU_INIT_ARGS (given ones win)"),
    Knob("TRAINER_ARGV", "the trainer's flags, replacing those of its command (shell words)"),
    Knob(
        "ORCH_ARGV", "the orchestrator's flags (default: from the orchestrator JobSet if present)"
    ),
    Knob("TRAINER_SLICE", "the slice to bench on, e.g. tpu7x:4x4x8 (default: the trainer's)"),
    Knob("PROFILE_STEPS", "steps to profile: N, A-B or a comma list of them"),
    Knob("STEPS", "timed steps (a positive integer)"),
    Knob("MICRO_STEPS", "micro-batches per step (a positive integer)"),
    Knob("MAX_RESTARTS", "the bench JobSet's failurePolicy.maxRestarts (default 0)"),
    Knob("DRIVER_ENV", "K=V shell words passed to the driver's environment, literally"),
    Knob("OUTPUT", "where to write the bench JobSet (default: stdout)"),
)
# Variables the renderer itself sets; DRIVER_ENV may not set them behind a knob's back.
_RESERVED_ENV = frozenset(
    {
        "BENCH_CODE_SHA256",
        "PYTHONPATH",
        CODE_DIR_VARIABLE,
        "TRAINER_ARGV",
        "ORCH_ARGV",
        "ENGINE_FLAGS",
        "PROFILE_STEPS",
        "STEPS",
        "MICRO_STEPS",
        "LIBTPU_INIT_ARGS",
    }
)


@dataclasses.dataclass(frozen=True)
class RenderKnobs:
    """Validated render knobs; `None` means 'keep the trainer's' or 'let the driver default'."""

    launch_render: str = "-"
    trainer_jobset: str | None = None
    name: str | None = None
    engine_flags: tuple[tuple[str, str], ...] = ()
    libtpu_flags: str = ""
    trainer_argv: tuple[str, ...] | None = None
    orch_argv: tuple[str, ...] | None = None
    trainer_slice: TpuSlice | None = None
    profile_steps: str | None = None
    steps: int | None = None
    micro_steps: int | None = None
    max_restarts: int = 0
    driver_env: tuple[tuple[str, str], ...] = ()
    output: str | None = None

    @classmethod
    def from_strings(cls, values: Mapping[str, str | None]) -> RenderKnobs:
        """Knobs from their string forms (flags or environment), keyed by lower-case knob name."""
        unknown = sorted(set(values) - {knob.dest for knob in KNOBS})
        if unknown:
            raise UserError(f"unknown knob {unknown[0]}: known knobs are {_knob_list()}")
        given = {key: value for key, value in values.items() if value not in (None, "")}
        return cls(
            launch_render=given.get("launch_render", "-"),
            trainer_jobset=given.get("trainer_jobset"),
            name=given.get("bench_name"),
            engine_flags=_engine_flags(given.get("engine_flags", "")),
            libtpu_flags=given.get("libtpu_flags", ""),
            trainer_argv=_words_or_none(given, "trainer_argv"),
            orch_argv=_words_or_none(given, "orch_argv"),
            trainer_slice=_slice_or_none(given.get("trainer_slice")),
            profile_steps=_step_list_or_none(given.get("profile_steps")),
            steps=_count_or_none(given, "steps", minimum=1),
            micro_steps=_count_or_none(given, "micro_steps", minimum=1),
            max_restarts=_count_or_none(given, "max_restarts", minimum=0) or 0,
            driver_env=_driver_env(given.get("driver_env", "")),
            output=given.get("output"),
        )


def _knob_list() -> str:
    return ", ".join(knob.env for knob in KNOBS)


def _words(text: str, knob: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UserError(
            f"{knob}={text!r} is not a list of shell words ({error}); fix its quoting"
        ) from None


def _words_or_none(given: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    return tuple(_words(given[key], key.upper())) if key in given else None


def _pairs(text: str, knob: str, key_pattern: re.Pattern, key_kind: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for word in _words(text, knob):
        key, equals, value = word.partition("=")
        if not equals or not key_pattern.match(key):
            raise UserError(f"{knob}: {word!r} is not {key_kind}=VALUE; write each entry as K=V")
        pairs.pop(key, None)  # the last occurrence wins and takes the last place
        pairs[key] = value
    return pairs


def _engine_flags(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(_pairs(text, "ENGINE_FLAGS", _ENGINE_KEY, "key").items())


def _driver_env(text: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(text, "DRIVER_ENV", _ENV_NAME, "an environment variable NAME")
    for key in pairs:
        if key in _RESERVED_ENV:
            raise UserError(
                f"DRIVER_ENV sets {key}, which the renderer sets itself; use its own knob "
                f"({_reserved_hint(key)})"
            )
    return tuple(pairs.items())


def _reserved_hint(key: str) -> str:
    knob = {"LIBTPU_INIT_ARGS": "LIBTPU_FLAGS"}.get(key, key)
    if any(k.env == knob for k in KNOBS):
        return knob
    return "it is fixed by the renderer"


def _slice_or_none(text: str | None) -> TpuSlice | None:
    if text is None:
        return None
    try:
        return parse_slice(text)
    except ValueError as error:
        raise UserError(f"TRAINER_SLICE: {error}") from None


def _step_list_or_none(text: str | None) -> str | None:
    if text is not None and not _STEP_LIST.match(text.replace(" ", "")):
        raise UserError(f"PROFILE_STEPS={text!r}: write step indices as N, A-B or N,A-B,...")
    return None if text is None else text.replace(" ", "")


def _count_or_none(given: Mapping[str, str], key: str, minimum: int) -> int | None:
    if key not in given:
        return None
    text = given[key].strip()
    if not text.isdigit() or int(text) < minimum:
        raise UserError(f"{key.upper()}={given[key]!r} must be an integer >= {minimum}")
    return int(text)


def add_arguments(parser) -> None:
    for knob in KNOBS:
        aliases = ["--name"] if knob.env == "BENCH_NAME" else []
        parser.add_argument(knob.flag, *aliases, dest=knob.dest, metavar=knob.env, help=knob.help)
