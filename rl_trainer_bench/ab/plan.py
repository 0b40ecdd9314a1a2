"""Every arm's plan, resolved before any device work: knobs, stages, engine configs, shared benches.

Each setting is the A/B's base knobs with the arm's over them, resolved once into a plan as a run
resolves its own (`bench/plan.resolve`); its bench is built from that plan's engine config, and a
same-pod A/B prints what each plan's engine config is. Arms that change only run-time knobs share
one compiled Bench; an arm that changes a program gets its own. Every refusal a worker or the
engine config would make is made here, so no arm runs before a later one is refused. Nothing here
writes into the command's arguments: the run's steps, blocks and seed come resolved (`AbRun`), and
the warm-up the arms share is the plan's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab.arms import ArmSpec, base_knobs
from rl_trainer_bench.ab.budget import AbRun
from rl_trainer_bench.bench import plan as bench_plan
from rl_trainer_bench.bench.micro_batch_memory import host_memory_bytes
from rl_trainer_bench.bench.plan import DEFAULT_IN_IMAGE
from rl_trainer_bench.config import knobs as config
from rl_trainer_bench.config import value_sources
from rl_trainer_bench.config.trainer_maxtext import FLAG_PREFIX
from rl_trainer_bench.engine.config import EngineConfig, leaf_fields, value_at
from rl_trainer_bench.engine.factory import MAXTEXT
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.errors import ConfigError, UserError

ENGINE_FLAGS = "ENGINE_FLAGS"


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """Every arm's resolved plan, built before any device work: each setting's knobs resolved
    once (`bench/plan.resolve`), and its bench built from that plan's engine config; with the
    run it was laid out for, so whoever runs the plan runs that run's steps and seed."""

    preset: config.Preset
    arms: list[ArmSpec]
    knobs: dict[str, dict[str, str]]  # by arm label: the knob text its plan was resolved from
    plans: dict[str, bench_plan.Plan]  # by setting: its plan (steps, stage, engine config)
    groups: dict[str, str]  # arm label -> bench name; arms that share programs share a bench
    baseline: str  # the setting --arms names first; the blocks order may run another one first
    warmup_steps: int  # every arm's: --warmup-steps, else the longest its engines need
    run: AbRun  # the steps per turn, blocks and schedule seed the arms were laid out with
    preset_source: str  # what chose the preset: --preset, a trainer flag, or this host's default

    def arms_of(self, bench: str) -> list[ArmSpec]:
        return [arm for arm in self.arms if self.groups[arm.label] == bench]

    @property
    def stages(self) -> dict[str, config.StageConfig]:
        """By arm label: the stage its turns run."""
        return {arm.label: self.plans[arm.setting].config.stage for arm in self.arms}

    @property
    def bench_plans(self) -> dict[str, bench_plan.Plan]:
        """By bench name, in the order the arms first use them: the plan its bench is built from
        (its first arm's; the others differ from it only in STAGE_* knobs, no program)."""
        found: dict[str, bench_plan.Plan] = {}
        for arm in self.arms:
            found.setdefault(self.groups[arm.label], self.plans[arm.setting])
        return found

    @property
    def bench_configs(self) -> dict[str, config.BenchConfig]:
        return {name: plan.config for name, plan in self.bench_plans.items()}

    def engine_config_line(self, setting: str, bench: EngineConfig) -> str:
        """What `setting`'s resolved engine config is, against `bench` (the plan printed above
        the A/B's lines): the same, or each field it changes. The pod resolves every arm again
        and compares these lines with the printed ones, so an arm cannot run another config."""
        plan = self.plans[setting]
        changes = engine_changes(bench, plan.engine)
        if plan.config.engine == MAXTEXT:  # the trainer's own keys come last and win there
            changes = [_replaced_by_trainer(change, plan.engine) for change in changes]
        return "the plan's above" + (f" with {' '.join(changes)}" if changes else "")


def _replaced_by_trainer(change: str, engine: EngineConfig) -> str:
    """`change` (`path=value`), marked where a trainer's own MaxText key replaces it in MaxText."""
    replaced = maxtext_keys.replaced_by_trainer(engine, change.partition("=")[0])
    return f"{change} (MaxText runs the trainer's {', '.join(replaced)})" if replaced else change


def engine_changes(base: EngineConfig, changed: EngineConfig) -> list[str]:
    """`path=value` for each field of `changed` that differs from `base`'s, or that `changed`
    passes to MaxText where `base` leaves it to the image's MaxText default (and the reverse);
    MaxText keys added as `maxtext.KEY=VALUE`."""
    passed = set(base.maxtext_defaults) - set(changed.maxtext_defaults)
    defaulted = set(changed.maxtext_defaults) - set(base.maxtext_defaults)
    words = []
    for path, _, _ in leaf_fields():
        was, now = value_at(base, path), value_at(changed, path)
        if path == "trainer_maxtext_keys" and was != now:
            added = now[len(was) :] if now[: len(was)] == was else now
            words += [f"{FLAG_PREFIX}.{key}={text}" for key, text in added]
        elif path in defaulted:
            words.append(f"{path}={DEFAULT_IN_IMAGE}")
        elif path != "maxtext_defaults" and (was != now or path in passed):
            words.append(f"{path}={value_sources.shown(now)}")
    return words


def plan_arms(
    args: argparse.Namespace, run: AbRun, out: Path, on_this_host: bool = True
) -> ArmPlan:
    """Parse the arms and resolve each setting's plan once, `run`'s steps, the A/B's warm-ups and
    folder over its knobs; raises UserError/ConfigError on bad input, including every arm a
    worker cannot run (so no arm runs before a later one is refused). `on_this_host` False plans
    for another machine (a rendered pod): this host's memory says nothing of the pod's there, so
    the micro-batch pool is not judged against it, nor a runtime this host's environment names."""
    preset, preset_source = run.preset, run.preset_source
    arms = ab_arms.parse_arms(args.arms, args.order, run.blocks, run.schedule_seed)
    base = base_knobs(args.knob)
    knobs = {arm.label: {"PRESET": preset.name, **arm_knobs(base, arm)} for arm in arms}
    firsts = {arm.setting: arm.label for arm in arms if arm.occurrence == 0}
    configs = {
        setting: config.BenchConfig.from_env(
            knobs[label], steps=run.steps, warmup_steps=args.warmup_steps, results_dir=out
        )
        for setting, label in firsts.items()
    }
    # every arm warms up as long as the slowest engine needs, unless --warmup-steps says
    warmup_steps = (
        args.warmup_steps
        if args.warmup_steps is not None
        else max(arm_config.warmup_steps for arm_config in configs.values())
    )
    host_bytes = host_memory_bytes() if on_this_host else None
    plans = {}
    for setting, arm_config in configs.items():
        arm_config = dataclasses.replace(arm_config, warmup_steps=warmup_steps)
        try:
            env = {**os.environ, **knobs[firsts[setting]]} if on_this_host else None
            plans[setting] = _resolve_as_run_does(arm_config, host_bytes, env)
        except ConfigError as error:  # say which arm's plan was refused (its keys, or the pod's)
            raise ConfigError(f"--arms: arm {setting}: {error}") from None
    names: dict[tuple[tuple[str, str], ...], str] = {}
    for arm in arms:
        names.setdefault(arm.program_knobs, f"bench{len(names) + 1}")
    groups = {arm.label: names[arm.program_knobs] for arm in arms}
    baseline = ab_arms.parse_arms(args.arms, run_orders.WRITTEN)[0].setting
    return ArmPlan(preset, arms, knobs, plans, groups, baseline, warmup_steps, run, preset_source)


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


def _resolve_as_run_does(
    bench_config: config.BenchConfig, host_bytes: int | None, env: Mapping[str, str] | None
) -> bench_plan.Plan:
    """The plan `run` makes of one bench (engine config, mesh, micro-batch memory), so an A/B
    refuses what `run` would before any arm; and an engine key of --arms/--knob that the engine
    does not apply is refused, since it would make an arm a silent copy of another (keys of a
    trainer's argv that the engine does not apply are expected, and listed by the run)."""
    resolved = bench_plan.resolve(bench_config, host_bytes, env)
    given = bench_config.engine_flags.given
    unapplied = [key for key in resolved.unapplied if key in given]
    if unapplied:
        raise UserError(
            f"engine key(s) {' '.join(unapplied)} would not be applied to the engine: "
            "fix the key names (see `rl-trainer-bench ab --help`)"
        )
    return resolved
