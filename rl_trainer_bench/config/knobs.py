"""Driver knobs: one table (name, default, parser, help) that every entry point reads.

The driver (`BenchConfig.from_env`), `bench_driver.py`'s environment, the `rl-trainer-bench run`
flags and the renderer's pass-through knobs (`rl_trainer_bench.launch.knobs`) all read `KNOBS`,
so a knob's default, accepted forms and help are written once; adding a knob is adding a row.
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

from rl_trainer_bench.accelerators import TpuSlice, parse_slice
from rl_trainer_bench.config import values
from rl_trainer_bench.config.engine_keys import parse_engine_flags, parse_trainer_argv
from rl_trainer_bench.config.presets import PRESETS, Preset, preset, preset_for_model
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import ConfigError

_ENGINE_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", re.ASCII)
DEFAULT_PRESET = "cpu-tiny"
STAGE_ISSUE_CHOICES = ("auto", "before_last", "after_last")
WORKER_CHOICES = ("separate", "fused")


@dataclasses.dataclass(frozen=True)
class Knob:
    """One driver knob: its environment name, default text, parser and help.

    `default` is the text the knob has when unset; "" means no value (None), for knobs whose
    default follows from others (MICRO_STEPS from the preset), which their help says.
    """

    name: str
    default: str
    parse: Callable[[str, str], Any]  # (knob name, text) -> value, or ConfigError
    help: str

    @property
    def flag(self) -> str:
        """The command-line spelling: `--micro-steps` for MICRO_STEPS."""
        return "--" + self.name.lower().replace("_", "-")

    def read(self, env: Mapping[str, str]) -> Any:
        """The knob's value in `env` (empty or unset: its default; no default: None)."""
        text = env.get(self.name, "").strip() or self.default
        return self.parse(self.name, text) if text else None


def _at_least(minimum: int) -> Callable[[str, str], int]:
    return lambda name, text: values.whole_number(name, text, minimum)


def _one_of(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    return lambda name, text: values.choice(name, text, choices)


def _preset(name: str, text: str) -> Preset:
    return preset(text)


def _engine_flags(name: str, text: str) -> str:
    """ENGINE_FLAGS stays text (the engine-key grammar, the same in `aot`, `run` and the pod)."""
    parse_engine_flags(text)
    return text


def _text(name: str, text: str) -> str:
    return text


def engine_spec(text: str, knob: str = "ENGINE") -> str:
    """`text` as an engine name (`module:Class`), checked for form only: importing it is the
    engine factory's job, at start-up, so validating knobs stays host work."""
    spec = text.strip() or BUILT_IN
    if not _ENGINE_SPEC.fullmatch(spec):
        raise ConfigError(f"{knob}={text!r} is not module:Class: e.g. {knob}={BUILT_IN}")
    return spec


def _slice(name: str, text: str) -> TpuSlice:
    try:
        return parse_slice(text)
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


def _yes_no(name: str, text: str) -> bool:
    value = {"1": True, "0": False, "on": True, "off": False}.get(text.strip().lower())
    if value is None:
        raise ConfigError(f"{name}={text!r} is not allowed: use 1 or 0")
    return value


KNOBS: tuple[Knob, ...] = (
    Knob(
        "PRESET",
        "",
        _preset,
        f"preset name (default: the preset of the model TRAINER_ARGV names, else {DEFAULT_PRESET})",
    ),
    Knob("STEPS", "5", _at_least(1), "scored steps, an integer >= 1"),
    Knob("WARMUP_STEPS", "1", _at_least(1), "warm-up steps before the scored ones, >= 1"),
    Knob("MICRO_STEPS", "", _at_least(1), "fwd_bwd calls per step, >= 1 (default: the preset's)"),
    Knob(
        "DISTINCT_MICRO_BATCHES",
        "",
        _at_least(1),
        "micro-batches in the pool, >= 1 (default MICRO_STEPS + 1)",
    ),
    Knob("STAGE_BEFORE_UPDATE", "off", values.switch, "on|off"),
    Knob("STAGE_AFTER_UPDATE", "off", values.switch, "on|off (exclusive with STAGE_BEFORE_UPDATE)"),
    Knob(
        "STAGE_ISSUE",
        "auto",
        _one_of(STAGE_ISSUE_CHOICES),
        "auto|before_last|after_last: where in the step the stage's copy is issued",
    ),
    Knob(
        "PROFILE_STEPS",
        "",
        values.step_window,
        f"steps to trace with jax.profiler: {values.STEP_WINDOW_FORMS}, warm-up steps first"
        " (default: none)",
    ),
    Knob("RESULTS_DIR", "bench_results", lambda name, text: Path(text), "folder for results"),
    Knob("ROUTING_PROFILE", "", _text, "routing profile JSON path (default: the shipped one)"),
    Knob("SEED", "0", values.whole_number, "integer seed of the micro-batch pool"),
    Knob(
        "TRAINER_ARGV",
        "",
        values.shell_words,
        "the trainer's command, shell words: NAME=value words before its flags carry its MaxText"
        " keys (MAXTEXT_EXTRA_FLAGS, REMAT_POLICY, NUM_MOE_TOKEN_CHUNKS, ...), its flags engine keys",
    ),
    Knob(
        "ENGINE_FLAGS",
        "",
        _engine_flags,
        "key=value engine keys, separated by spaces or commas (quotes and {...} kept whole)",
    ),
    Knob(
        "ORCH_ARGV",
        "",
        values.shell_words,
        "the orchestrator's argv, shell words (micro-batch rows and lengths)",
    ),
    Knob("WORKER", "separate", _one_of(WORKER_CHOICES), "separate|fused"),
    Knob(
        "ENGINE",
        BUILT_IN,
        lambda name, text: engine_spec(text, name),
        "module:Class of the engine to time, built as Class(engine_config); in a pod its package"
        " must be in the trainer's image",
    ),
    Knob(
        "TRAINER_SLICE",
        "",
        _slice,
        "the TPU slice the run is for, e.g. v5p:4x8x8 (the renderer sets it); the plan checks the"
        " mesh against it, not against the machine it runs on",
    ),
    Knob(
        "PLAN_ONLY",
        "0",
        _yes_no,
        "1: validate everything, print the resolved cell and exit before any device work"
        " (flag: --plan)",
    ),
)
DRIVER_KNOBS: Mapping[str, Knob] = {knob.name: knob for knob in KNOBS}


def add_driver_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per driver knob, named after it (`--micro-steps` for MICRO_STEPS)."""
    for knob in KNOBS:
        default = f" (default {knob.default})" if knob.default else ""
        parser.add_argument(knob.flag, dest=knob.name, metavar="VALUE", help=knob.help + default)
    parser.add_argument(
        "--plan", dest="PLAN_ONLY", action="store_const", const="1", help="the same as PLAN_ONLY=1"
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


def _allowed_distance(knob: str) -> int:
    """Short names are common words (SEED, STEPS): only their exact letters count as a typo."""
    length = len(_squashed(knob))
    return 0 if length < 5 else 1 if length < 10 else 2


def misspelt_knob(name: str, knobs: Iterable[str] = DRIVER_KNOBS) -> str | None:
    """The knob `name` looks like a typo of, or None (a knob itself, or unlike every knob).

    Names are compared upper-cased without underscores (MICROSTEPS, micro_steps), then by edit
    distance: up to 1 for knobs of 5-9 letters, 2 for longer ones, none for shorter ones.
    """
    knobs = list(knobs)
    if name in knobs:
        return None
    squashed = _squashed(name)
    distance, nearest = min((_edit_distance(squashed, _squashed(k)), k) for k in knobs)
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
    after `update()` is dispatched (the order the seeds replaced, kept for A/B). `issue` places the
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
            return platform in ("gpu", "cuda", "rocm")
        return self.issue == "before_last"

    def describe(self) -> str:
        if self.before_update:
            return f"before_update(issue={self.issue})"
        return "after_update" if self.after_update else "off"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The driver's knobs, validated. Steps are numbered from 0; warm-up steps come first."""

    preset: Preset
    steps: int = 5
    warmup_steps: int = 1
    micro_steps: int = 2
    distinct_micro_batches: int = 3
    stage: StageConfig = StageConfig()
    profile_steps: tuple[int, int] | None = None  # inclusive step range
    results_dir: Path = Path("bench_results")
    routing_profile: str | None = None
    seed: int = 0
    trainer_argv: tuple[str, ...] = ()
    engine_flags: str = ""  # key=value engine keys, as written (parse_engine_flags reads them)
    orch_argv: tuple[str, ...] = ()
    worker: str = "separate"
    engine: str = BUILT_IN  # module:Class (engine/factory.py builds it)
    preset_source: str = "PRESET"  # what chose the preset: PRESET, a trainer flag, or the default
    trainer_slice: TpuSlice | None = None
    plan_only: bool = False

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BenchConfig:
        """Validate every knob in `env` (host work only: nothing here touches a device)."""
        refuse_misspelt_knobs(env, "the knobs")
        value = {knob.name: knob.read(env) for knob in KNOBS}
        trainer_argv = value["TRAINER_ARGV"] or ()
        trainer_flags = parse_trainer_argv(trainer_argv)
        chosen, source = _chosen_preset(value["PRESET"], trainer_flags)
        micro_steps = value["MICRO_STEPS"] or chosen.micro_steps
        config = cls(
            preset=chosen,
            steps=value["STEPS"],
            warmup_steps=value["WARMUP_STEPS"],
            micro_steps=micro_steps,
            distinct_micro_batches=value["DISTINCT_MICRO_BATCHES"] or micro_steps + 1,
            stage=StageConfig.from_env(env),
            profile_steps=value["PROFILE_STEPS"],
            results_dir=value["RESULTS_DIR"],
            routing_profile=value["ROUTING_PROFILE"],
            seed=value["SEED"],
            trainer_argv=trainer_argv,
            engine_flags=value["ENGINE_FLAGS"] or "",
            orch_argv=_with_lengths(value["ORCH_ARGV"] or (), trainer_flags),
            worker=value["WORKER"],
            engine=value["ENGINE"],
            preset_source=source,
            trainer_slice=value["TRAINER_SLICE"],
            plan_only=value["PLAN_ONLY"],
        )
        config._check_profile_window()
        return config

    def _check_profile_window(self) -> None:
        if self.profile_steps is not None and self.profile_steps[1] >= self.total_steps:
            raise ConfigError(
                "PROFILE_STEPS='{}:{}' is outside the run: steps are 0..{} (warm-up first)".format(
                    *self.profile_steps, self.total_steps - 1
                )
            )

    def describe(self) -> dict[str, str]:
        """The configuration as the driver logs it at start: knob -> value."""
        profile = "-" if self.profile_steps is None else "{}:{}".format(*self.profile_steps)
        return {
            "PRESET": self.preset.name,
            "STEPS": str(self.steps),
            "WARMUP_STEPS": str(self.warmup_steps),
            "MICRO_STEPS": str(self.micro_steps),
            "DISTINCT_MICRO_BATCHES": str(self.distinct_micro_batches),
            "STAGE": self.stage.describe(),
            "PROFILE_STEPS": profile,
            "RESULTS_DIR": str(self.results_dir),
            "ROUTING_PROFILE": self.routing_profile or "-",
            "SEED": str(self.seed),
            "TRAINER_ARGV": shlex.join(self.trainer_argv) or "-",
            "ENGINE_FLAGS": self.engine_flags or "-",
            "ORCH_ARGV": shlex.join(self.orch_argv) or "-",
            "WORKER": self.worker,
            "ENGINE": self.engine,
        }


def _chosen_preset(given: Preset | None, trainer_flags: Mapping[str, str]) -> tuple[Preset, str]:
    """PRESET when set, else the preset of the model the trainer's flags name, else the default."""
    if given is not None:
        return given, "PRESET"
    mapped = preset_for_model(trainer_flags)
    if mapped is not None:
        return mapped
    return PRESETS[DEFAULT_PRESET], "default"


_LENGTH_FLAGS = ("max_prompt_length", "max_response_length")


def _with_lengths(orch_argv: tuple[str, ...], trainer_flags: Mapping[str, str]) -> tuple[str, ...]:
    """ORCH_ARGV with the sequence lengths it lacks taken from the trainer's flags.

    Both processes are launched with the same lengths; an orchestrator command that leaves them to
    its defaults or a config file should not make the pod refuse what the trainer states.
    """
    if not orch_argv:
        return orch_argv
    given = parse_trainer_argv(orch_argv)
    supplied = [
        f"--{k}={trainer_flags[k]}" for k in _LENGTH_FLAGS if k not in given and k in trainer_flags
    ]
    return (*orch_argv, *supplied)
