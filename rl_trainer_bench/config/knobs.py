"""Driver knobs: the environment (DRIVER_ENV in a pod) and flags of the same names, validated once.

No module past this one reads the environment or re-validates. Errors are `ConfigError`s whose
one-line message names the knob, the value and what is allowed, because a pod's log is often the
only place a user sees them.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.config.presets import Preset, preset
from rl_trainer_bench.errors import ConfigError

# Every driver knob, its default, and what it accepts; read from the environment (DRIVER_ENV in a pod)
# and from flags of the same names (`--micro-steps` for MICRO_STEPS). Unset means the default.
DRIVER_KNOBS: Mapping[str, str] = {
    "PRESET": "preset name (default cpu-tiny)",
    "STEPS": "scored steps, >= 1 (default 5)",
    "WARMUP_STEPS": "warm-up steps before the scored ones, >= 1 (default 1)",
    "MICRO_STEPS": "fwd_bwd calls per step, >= 1 (default: the preset's)",
    "DISTINCT_MICRO_BATCHES": "micro-batches in the pool, >= 1 (default MICRO_STEPS + 1)",
    "STAGE_BEFORE_UPDATE": "on|off (default off)",
    "STAGE_AFTER_UPDATE": "on|off (default off; exclusive with STAGE_BEFORE_UPDATE)",
    "STAGE_ISSUE": "auto|before_last|after_last: where in the step the stage's copy is issued",
    "PROFILE_STEPS": "a:b, steps to trace with jax.profiler (default: none)",
    "RESULTS_DIR": "folder for results.jsonl and profile/ (default bench_results)",
    "ROUTING_PROFILE": "routing profile JSON path (default: the shipped one)",
    "SEED": "integer seed of the micro-batch pool (default 0)",
    "TRAINER_ARGV": "the trainer's argv, shell-quoted (engine keys)",
    "ENGINE_FLAGS": "key=value engine keys, space-separated",
    "ORCH_ARGV": "the orchestrator's argv, shell-quoted (micro-batch rows and lengths)",
    "WORKER": "separate|fused (default separate)",
}


def add_driver_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per driver knob, named after it (`--micro-steps` for MICRO_STEPS)."""
    for knob, meaning in DRIVER_KNOBS.items():
        parser.add_argument(
            "--" + knob.lower().replace("_", "-"), dest=knob, metavar="VALUE", help=meaning
        )


def driver_knobs(env: Mapping[str, str], flags: argparse.Namespace) -> dict[str, str]:
    """The driver knobs: the environment's, overridden by any flag given."""
    knobs = {k: env[k] for k in DRIVER_KNOBS if k in env}
    knobs.update({k: v for k, v in vars(flags).items() if k in DRIVER_KNOBS and v is not None})
    return knobs


_SWITCH_VALUES = {"on": True, "off": False}
STAGE_ISSUE_CHOICES = ("auto", "before_last", "after_last")
WORKER_CHOICES = ("separate", "fused")


def _switch(env: Mapping[str, str], knob: str) -> bool:
    value = env.get(knob, "off").strip().lower()
    if value not in _SWITCH_VALUES:
        raise ConfigError(f"{knob}={env[knob]!r} is not allowed: use on or off")
    return _SWITCH_VALUES[value]


def _choice(env: Mapping[str, str], knob: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(knob, default).strip()
    if value not in choices:
        raise ConfigError(f"{knob}={value!r} is not allowed: use one of {', '.join(choices)}")
    return value


def _integer(env: Mapping[str, str], knob: str, default: int, minimum: int | None) -> int:
    text = env.get(knob, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{knob}={text!r} is not an integer: {DRIVER_KNOBS[knob]}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{knob}={value} is too small: {DRIVER_KNOBS[knob]}")
    return value


def _argv(env: Mapping[str, str], knob: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(env.get(knob, "")))
    except ValueError as error:
        raise ConfigError(f"{knob}={env[knob]!r} does not parse as shell words: {error}") from None


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """When the next step's first micro-batch is staged, if at all.

    `before_update` stages it at the boundary, before `update()`; `after_update` stages it right
    after `update()` is dispatched (the order the seeds replaced, kept for A/B). `issue` places the
    before-update copy relative to the step's last `fwd_bwd`: on a GPU a copy issued after a
    dispatched computation queues behind it (../shared/reference/h200-facts.md), so `auto` issues it
    before the last dispatch there and after it elsewhere.
    """

    before_update: bool = False
    after_update: bool = False
    issue: str = "auto"

    @property
    def enabled(self) -> bool:
        return self.before_update or self.after_update

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StageConfig:
        before = _switch(env, "STAGE_BEFORE_UPDATE")
        after = _switch(env, "STAGE_AFTER_UPDATE")
        if before and after:
            raise ConfigError("STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE are exclusive: set one")
        return cls(before, after, _choice(env, "STAGE_ISSUE", STAGE_ISSUE_CHOICES, "auto"))

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
    engine_flags: tuple[str, ...] = ()
    orch_argv: tuple[str, ...] = ()
    worker: str = "separate"

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BenchConfig:
        """Validate every knob in `env` (host work only: nothing here touches a device)."""
        unknown = sorted(k for k in env if k in _KNOB_TYPOS)
        if unknown:
            raise ConfigError(
                f"{unknown[0]} is not a knob: did you mean {_KNOB_TYPOS[unknown[0]]}?"
            )
        chosen = preset(env.get("PRESET", "cpu-tiny").strip() or "cpu-tiny")
        micro_steps = _integer(env, "MICRO_STEPS", chosen.micro_steps, 1)
        steps = _integer(env, "STEPS", 5, 1)
        warmup = _integer(env, "WARMUP_STEPS", 1, 1)
        return cls(
            preset=chosen,
            steps=steps,
            warmup_steps=warmup,
            micro_steps=micro_steps,
            distinct_micro_batches=_integer(env, "DISTINCT_MICRO_BATCHES", micro_steps + 1, 1),
            stage=StageConfig.from_env(env),
            profile_steps=_profile_steps(env, warmup + steps),
            results_dir=Path(env.get("RESULTS_DIR", "").strip() or "bench_results"),
            routing_profile=env.get("ROUTING_PROFILE", "").strip() or None,
            seed=_integer(env, "SEED", 0, None),
            trainer_argv=_argv(env, "TRAINER_ARGV"),
            engine_flags=_argv(env, "ENGINE_FLAGS"),
            orch_argv=_argv(env, "ORCH_ARGV"),
            worker=_choice(env, "WORKER", WORKER_CHOICES, "separate"),
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
            "ENGINE_FLAGS": shlex.join(self.engine_flags) or "-",
            "ORCH_ARGV": shlex.join(self.orch_argv) or "-",
            "WORKER": self.worker,
        }


# Near-miss spellings users type for knobs; a typo that silently does nothing costs a pod run.
_KNOB_TYPOS: Mapping[str, str] = {
    "STAGE_BEFORE_UPDATES": "STAGE_BEFORE_UPDATE",
    "STAGE_AFTER_UPDATES": "STAGE_AFTER_UPDATE",
    "MICROSTEPS": "MICRO_STEPS",
    "PROFILE_STEP": "PROFILE_STEPS",
    "RESULT_DIR": "RESULTS_DIR",
}


def _profile_steps(env: Mapping[str, str], total_steps: int) -> tuple[int, int] | None:
    text = env.get("PROFILE_STEPS", "").strip()
    if not text:
        return None
    first, sep, last = text.partition(":")
    try:
        window = (int(first), int(last if sep else first))
    except ValueError:
        raise ConfigError(f"PROFILE_STEPS={text!r} is not a:b: e.g. PROFILE_STEPS=2:3") from None
    if not 0 <= window[0] <= window[1] < total_steps:
        raise ConfigError(
            f"PROFILE_STEPS={text!r} is outside the run: steps are 0..{total_steps - 1}"
            " (warm-up first)"
        )
    return window
