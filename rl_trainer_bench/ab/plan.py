"""Every arm's configuration, validated before any device work: knobs, stages, shared benches.

Arms that change only run-time knobs share one compiled Bench; an arm that changes a program gets
its own. Every refusal a worker or the engine config would make is made here, so no arm runs before
a later one is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab.arms import ArmSpec
from rl_trainer_bench.bench import plan as bench_plan
from rl_trainer_bench.bench.micro_batch_memory import host_memory_bytes
from rl_trainer_bench.config import knobs as config
from rl_trainer_bench.config.engine_keys import parse_engine_flags
from rl_trainer_bench.errors import ConfigError, UserError

ENGINE_FLAGS = "ENGINE_FLAGS"


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """Every arm's validated configuration, built before any device work."""

    preset: config.Preset
    arms: list[ArmSpec]
    envs: dict[str, dict[str, str]]  # by arm label: the knobs its Bench and stage come from
    stages: dict[str, config.StageConfig]  # by arm label
    groups: dict[str, str]  # arm label -> bench name; arms that share programs share a bench
    bench_configs: dict[str, config.BenchConfig]  # by bench name
    baseline: str  # the setting --arms names first; the blocks order may run another one first

    def arms_of(self, bench: str) -> list[ArmSpec]:
        return [arm for arm in self.arms if self.groups[arm.label] == bench]


def plan_arms(args: argparse.Namespace, out: Path, on_this_host: bool = True) -> ArmPlan:
    """Parse and validate the arms and their knobs; raises UserError/ConfigError on bad input,
    including every arm a worker cannot run (so no arm runs before a later one is refused).
    `on_this_host` False plans for another machine (a rendered pod): this host's memory says
    nothing of the pod's there, so the micro-batch pool is not judged against it."""
    preset = config.preset(args.preset)
    arms = ab_arms.parse_arms(args.arms, args.order, args.blocks, args.schedule_seed)
    base = base_knobs(args.knob)
    envs = {arm.label: arm_env(preset.name, args, out, base, arm) for arm in arms}
    arm_configs = {label: config.BenchConfig.from_env(env) for label, env in envs.items()}
    if args.warmup_steps is None:  # every arm warms up as long as the slowest engine needs
        args.warmup_steps = max(arm_config.warmup_steps for arm_config in arm_configs.values())
        envs = {arm.label: arm_env(preset.name, args, out, base, arm) for arm in arms}
        arm_configs = {label: config.BenchConfig.from_env(env) for label, env in envs.items()}
    for arm in (arm for arm in arms if arm.occurrence == 0):  # a repeat's knobs are the same
        try:
            _resolve_as_run_does(
                arm_configs[arm.label], host_memory_bytes() if on_this_host else None
            )
        except ConfigError as error:  # say which arm's plan was refused (its keys, or the pod's)
            raise ConfigError(f"--arms: arm {arm.setting}: {error}") from None
    names: dict[tuple[tuple[str, str], ...], str] = {}
    for arm in arms:
        names.setdefault(arm.program_knobs, f"bench{len(names) + 1}")
    groups = {arm.label: names[arm.program_knobs] for arm in arms}
    bench_configs = {groups[label]: arm_config for label, arm_config in arm_configs.items()}
    stages = {label: arm_config.stage for label, arm_config in arm_configs.items()}
    baseline = ab_arms.parse_arms(args.arms, run_orders.WRITTEN)[0].setting
    return ArmPlan(preset, arms, envs, stages, groups, bench_configs, baseline)


def arm_env(
    preset: str, args: argparse.Namespace, out: Path, base: Mapping[str, str], arm: ArmSpec
) -> dict[str, str]:
    """The env-style knobs one arm's Bench is built from: the A/B's own, then `arm_knobs`."""
    return {
        "PRESET": preset,
        "STEPS": str(args.steps),
        "WARMUP_STEPS": "" if args.warmup_steps is None else str(args.warmup_steps),
        "RESULTS_DIR": str(out),
        **arm_knobs(base, arm),
    }


def arm_knobs(base: Mapping[str, str], arm: ArmSpec) -> dict[str, str]:
    """The base knobs with the arm's over them: what an arm runs, in the A/B and in `aot`.

    Engine keys (lower case) join ENGINE_FLAGS as `key=value` words after any the base set, so an
    arm's key overrides the base's.
    """
    env: dict[str, str] = {}
    engine_words = []
    for key, value in base.items():
        if key == key.lower():
            engine_words.append(f"{key}={value}")
        else:
            env[key] = value
    if ENGINE_FLAGS in env:
        engine_words.insert(0, env[ENGINE_FLAGS])
    env.update(arm.driver_knobs)
    if ENGINE_FLAGS in arm.driver_knobs:
        engine_words.append(arm.driver_knobs[ENGINE_FLAGS])
    engine_words += [f"{k}={v}" for k, v in arm.engine_keys.items()]
    if engine_words:
        env[ENGINE_FLAGS] = " ".join(engine_words)
    return env


def _resolve_as_run_does(bench_config: config.BenchConfig, host_bytes: int | None) -> None:
    """The plan `run` makes of one bench (engine config, mesh, micro-batch memory), so an A/B
    refuses what `run` would before any arm; and an engine key of --arms/--knob that the engine
    does not apply is refused, since it would make an arm a silent copy of another (keys of a
    trainer's argv that the engine does not apply are expected, and listed by the run)."""
    resolved = bench_plan.resolve(bench_config, host_bytes)
    given = parse_engine_flags(bench_config.engine_flags)
    unapplied = [key for key in resolved.unapplied if key in given]
    if unapplied:
        raise UserError(
            f"engine key(s) {' '.join(unapplied)} would not be applied to the engine: "
            "fix the key names (see `rl-trainer-bench ab --help`)"
        )


def base_knobs(pairs: Sequence[str]) -> dict[str, str]:
    knobs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--knob {pair!r}: write KEY=VALUE, e.g. --knob MICRO_STEPS=4")
        ab_arms.check_key(key, "--knob")
        knobs[key] = value
    return knobs
