"""The plan of a run: every knob validated and the cell it times resolved, before any device work.

`rl-trainer-bench run --plan` (PLAN_ONLY=1) prints it and exits; every run resolves it first, so a
refusal that host work can make is made before the compile; and the renderer resolves it for the
exact environment a pod will get, so a render that succeeds never makes a pod that refuses its
knobs. The mesh is checked against TRAINER_SLICE, the slice the pod is rendered for, never against
the machine the plan happens to run on. Nothing here imports JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from rl_trainer_bench.bench import engine_plan, micro_batch_memory, results_copy
from rl_trainer_bench.bench.boundary_copy import ASSUMED_LINK, BoundaryCopy, boundary_copy
from rl_trainer_bench.bench.runtime import (
    SINGLE_PROCESS,
    Runtime,
    runs_on_host_cpu,
    runtime_for,
)
from rl_trainer_bench.bench.state_memory import MIN_HEADROOM, state_memory
from rl_trainer_bench.chips.accelerators import TpuSlice
from rl_trainer_bench.config import compile_cache, trainer_env, value_sources
from rl_trainer_bench.config.engine_keys import ENGINE_KEYS, CommandLine, engine_config_from
from rl_trainer_bench.config.knobs import (
    LAUNCHER_SOURCE,
    PRESET_SOURCE,
    BenchConfig,
    StageConfig,
    driver_knobs,
)
from rl_trainer_bench.config.presets import TrainerDifference
from rl_trainer_bench.config.trainer_env import (
    ENGINE_EQUIVALENTS,
    ENV_FATES,
    NOT_REPRODUCED,
    OFF_THE_STEP,
    PLUMBING,
    TRAINER_ENV_VARIABLE,
    UNKNOWN,
    EnvFate,
)
from rl_trainer_bench.config.trainer_maxtext import (
    APPLIED,
    FATES,
    FLAG_PREFIX,
    TrainerKey,
    idle_in_maxtext,
    other_meaning,
)
from rl_trainer_bench.config.value_sources import ENGINE_DEFAULT, PRESET, ValueSource
from rl_trainer_bench.engine.config import (
    EngineConfig,
    config_problems,
    replays_possible,
    tpu_kernel_refusal,
    value_at,
)
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.engine.maxtext import tunix_grpo
from rl_trainer_bench.engine.maxtext.tunix_grpo import MAXTEXT as MAXTEXT_OWN_DRIVER
from rl_trainer_bench.errors import ConfigError
from rl_trainer_bench.payload.packing import layout_from_orchestrator_argv
from rl_trainer_bench.payload.replay_forecast import (
    BUILT_IN_BUFFER,
    MAXTEXT_BUFFER,
    predicted_replay,
)
from rl_trainer_bench.payload.routing_profile import load_profile
from rl_trainer_bench.units import human_bytes

PLAN_PREFIX = "plan:"
# How the plan shows a value left to the image's MaxText (`EngineConfig.maxtext_defaults`).
DEFAULT_IN_IMAGE = "(the image's MaxText default)"


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated run: its knobs, the engine config it builds and what was not applied."""

    config: BenchConfig
    engine: EngineConfig
    unapplied: tuple[str, ...]  # engine keys given that the built-in engine does not apply
    layout: str  # how the synthetic micro-batches are packed
    trainer_keys: tuple[TrainerKey, ...] = ()  # the trainer's MaxText keys and their fates
    replay: str = ""  # the routing profile's forecast of replays at the cell's MoE settings
    # The preset's keys that still differ from the trainer's once its keys are applied, with why.
    differences: tuple[TrainerDifference, ...] = ()
    # Which engine, which MaxText, the loss, and why (bench/engine_plan.py).
    engine_facts: tuple[tuple[str, str], ...] = ()
    runtime: Runtime | None = None  # what the process environment asks for; None: not given
    # The engine keys nobody set for this run, with their sources; the trainer's variables' fates.
    preset_values: tuple[ValueSource, ...] = ()
    environment: tuple[EnvFate, ...] | None = None  # None: the environment was not given
    compile_cache: str = ""  # where compiled programs are kept (config/compile_cache.describe)

    @property
    def trainer_slice(self) -> TpuSlice | None:
        return self.config.trainer_slice

    def cell(self) -> str:
        """One line naming the cell: preset, mesh, micro-batch shape and step."""
        mesh, engine = self.engine.mesh, self.engine
        return (
            f"{self.config.preset.name} mesh {mesh.fsdp} x {mesh.context} x {mesh.expert}"
            f" (fsdp x context x expert), micro-batch {engine.micro_batch_rows} rows of"
            f" {engine.seq_len:,} tokens, {self.config.micro_steps} micro-steps per step"
        )

    def lines(self, same_pod_ab: bool = False) -> list[str]:
        """The plan as `run --plan` prints it; for a same-pod A/B's pod (`same_pod_ab`) the step's
        shape alone, since its steps, warm-ups and stages are the A/B's, printed by its lines."""
        config, engine, model = self.config, self.engine, self.engine.model
        mesh = engine.mesh
        target = (
            f"on {self.trainer_slice.describe()}"
            if self.trainer_slice
            else "not checked against a slice (no TRAINER_SLICE)"
        )
        rows = [
            ("cell", self.cell()),
            ("runtime", self.runtime_line()),
            ("preset", f"{config.preset.name} (chosen by {config.preset_source})"),
            (
                "model",
                f"layers={model.num_layers} d_model={model.d_model} heads={model.num_heads}"
                f" kv_heads={model.num_kv_heads} head_dim={model.head_dim}"
                f" experts={model.num_experts} top_k={model.top_k}"
                f" expert_ffn={model.expert_ffn_dim} shared_ffn={model.shared_expert_ffn_dim}"
                f" vocab={model.vocab_size}",
            ),
            (
                "mesh",
                f"{mesh.fsdp} x {mesh.context} x {mesh.expert} = {mesh.size} devices {target}",
            ),
            (
                "micro-batch",
                f"{engine.micro_batch_rows} rows of {engine.seq_len:,} tokens"
                f" ({engine.micro_batch_rows * engine.seq_len:,} tokens), packing: {self.layout}",
            ),
            ("micro-batch bytes", self.boundary_copy().bytes_line()),
            (
                "step boundary",
                f"{self.boundary_copy().prediction_line(ASSUMED_LINK)}; this run:"
                f" {'on' if config.stage.before_update else 'off'}",
            ),
            (
                "step",
                f"micro_steps={config.micro_steps} worker={config.worker}; steps, warm-ups and"
                " stages: the A/B's"
                if same_pod_ab
                else f"micro_steps={config.micro_steps} steps={config.steps}"
                f" warmup_steps={config.warmup_steps} worker={config.worker}"
                f" stage={config.stage.describe()}",
            ),
            ("results", self.results_line()),
            ("compiled programs kept in", self.compile_cache),
            ("moe", self.replay),
            ("device memory", self.device_memory()),
            *(("preset differs from the trainer", d.describe()) for d in self.differences),
            *self.engine_facts,
            ("engine keys not applied", " ".join(self.unapplied) or "-"),
            ("trainer MaxText keys", self.trainer_keys_summary()),
            *(("trainer key", key.describe()) for key in self.trainer_keys),
            *self.accounting_rows(),
        ]
        return [f"{PLAN_PREFIX} {name}: {text}" for name, text in rows] + [
            f"{PLAN_PREFIX} ok: every knob is valid; nothing ran on a device"
        ]

    def accounting_rows(self) -> list[tuple[str, str]]:
        """Where every value the trainer did not set comes from, and the fate of each variable of
        the trainer's environment (plumbing counted, not listed)."""
        return [*self.value_rows(), *self.environment_rows()]

    def value_rows(self) -> list[tuple[str, str]]:
        """Each value the preset supplies that nobody set for this run, with its reason, and the
        engine defaults it keeps, on one line."""
        preset = self.config.preset
        source = f"value from preset {preset.name}"
        values, maxtext_rows = list(self.preset_values), []
        if self.config.engine == MAXTEXT:
            values, maxtext_rows = self._maxtext_value_rows()
        rows = [(source, self._preset_value(v)) for v in values if v.source == PRESET]
        rows += self.micro_steps_rows()
        defaults = [v.describe() for v in values if v.source == ENGINE_DEFAULT]
        return [
            *maxtext_rows,
            *rows,
            ("values from the engine's defaults", " ".join(defaults) or "-"),
        ]

    def _maxtext_value_rows(self) -> tuple[list[ValueSource], list[tuple[str, str]]]:
        """Of the values nobody set, those MaxText's engine gets (returned), and rows for the rest:
        those left to the image's MaxText defaults, as in the trainer's program, and those MaxText
        does not take at all, so the pod does not use them; and the keys ENGINE_FLAGS sets that
        MaxText does not take either."""
        defaulted, not_taken, passed = [], [], []
        refused = self._not_taken_by_maxtext()
        for value in self.preset_values:
            field = ENGINE_KEYS[value.key].target
            why = refused.get(field)
            if field in self.engine.maxtext_defaults:
                defaulted.append(f"{value.key} (the preset's {value.value} not passed)")
            elif why:
                not_taken.append(f"{value.key}={value.value} ({why})")
            else:
                passed.append(value)
        flags = {
            key: (text, ENGINE_KEYS[key].target)
            for key, text in self.config.engine_flags.given.items()
            if key in ENGINE_KEYS
        }
        set_unused = [
            f"{key}={text} ({why})"
            for key, (text, field) in flags.items()
            if (why := refused.get(field))
        ]
        set_replaced = [
            f"{key}={text} (the trainer's {', '.join(trainer)})"
            for key, (text, field) in flags.items()
            if (trainer := maxtext_keys.replaced_by_trainer(self.engine, field))
        ]
        rows = []
        if defaulted:
            rows.append(
                (
                    "left to the image's MaxText defaults, as in the trainer's program (its"
                    " command sets none of them)",
                    ", ".join(defaulted),
                )
            )
        if not_taken:
            rows.append(("not passed to MaxText's engine, so unused", "; ".join(not_taken)))
        if set_unused:
            rows.append(
                (
                    "set by ENGINE_FLAGS, not passed to MaxText's engine, so unused",
                    "; ".join(set_unused),
                )
            )
        if set_replaced:
            rows.append(
                (
                    "set by ENGINE_FLAGS, replaced in MaxText by the trainer's key, applied last"
                    f" (ENGINE_FLAGS {FLAG_PREFIX}.KEY=VALUE sets a key after it)",
                    "; ".join(set_replaced),
                )
            )
        return passed, rows

    def _not_taken_by_maxtext(self) -> dict[str, str]:
        """{field: why} for every engine-config field MaxText's engine does not take here."""
        tunix_loss = self.config.maxtext_driver != tunix_grpo.MAXTEXT
        return {
            field: why
            for field, why in maxtext_keys.not_taken(self.engine).items()
            if not (tunix_loss and field in tunix_grpo.TAKEN_LOSS_FIELDS)
        }

    def micro_steps_rows(self) -> list[tuple[str, str]]:
        """Where micro_steps comes from: the launcher (how), the preset (why the launcher did not
        give it), or MICRO_STEPS, marked where it differs from the launcher's count."""
        config, shape = self.config, self.config.step_shape
        count = config.micro_steps
        preset = config.preset
        if config.micro_steps_source == LAUNCHER_SOURCE and shape is not None:
            instead = (
                ""
                if count == preset.micro_steps
                else f"; preset {preset.name} has {preset.micro_steps}"
            )
            return [
                ("value from the launcher", f"micro_steps={count} ({shape.describe()}{instead})")
            ]
        if config.micro_steps_source == PRESET_SOURCE:
            why = shape.describe() if shape is not None else "the launcher's flags were not read"
            return [(f"value from preset {preset.name}", f"micro_steps={count} ({why})")]
        if shape is not None and shape.micro_steps is not None and shape.micro_steps != count:
            return [
                (
                    "micro-steps differ from the trainer",
                    f"MICRO_STEPS={count}, where {shape.describe()}",
                )
            ]
        return []

    def _preset_value(self, value: ValueSource) -> str:
        """A preset's value and its reason; where the built-in engine runs it under another
        meaning than the MaxText run the reason quotes, that meaning; where MaxText ignores it,
        why."""
        keys = self.engine.trainer_maxtext_keys
        if self.config.engine == MAXTEXT:
            idle = idle_in_maxtext(value.key, value.value, keys)
            return value.describe() + (f"; {idle}" if idle else "")
        meaning = (
            other_meaning(value.key, value.value, keys) if self.config.engine == BUILT_IN else ""
        )
        return value.describe() + (f"; applied with another meaning: {meaning}" if meaning else "")

    def environment_rows(self) -> list[tuple[str, str]]:
        """The trainer's variables: a count by fate, one line for each that may change its
        program, one line per reason for those outside the timed step ([]: no environment)."""
        if self.environment is None:
            return []
        rows = [("trainer environment", self.environment_summary())]
        rows += [("trainer variable", fate.describe()) for fate in self.environment_listed()]
        off_step: dict[str, list[str]] = {}
        for fate in self.environment:
            if fate.fate == OFF_THE_STEP:
                off_step.setdefault(fate.why, []).append(fate.name)
        rows += [
            (f"trainer variables {OFF_THE_STEP} ({why})", " ".join(names))
            for why, names in off_step.items()
        ]
        return rows

    def substitutions(self) -> list[str]:
        """What the pod times in place of the trainer's own program, one line each: the engine,
        the preset's differences, the trainer's keys not applied as they are, the values nobody
        set, and the trainer's variables the bench does not reproduce or know."""
        keys = [
            key
            for key in self.trainer_keys
            if key.fate != APPLIED
            or key.other_meaning
            or (key.engine_key, key.engine_value) != (key.key, key.value)
        ]
        variables = [f for f in self.environment or () if f.fate in (NOT_REPRODUCED, UNKNOWN)]
        facts = dict(self.engine_facts)
        passes = [
            f"{name}: {facts[name]}" for name in ("loss", "chunked log-prob pass") if name in facts
        ]
        flags = " ".join(self.unapplied)
        return [
            f"engine: {self.config.engine} runs in place of the trainer's own engine",
            *passes,
            f"micro-batches: synthetic, built by the bench ({self.layout}; expert routes from the"
            " routing profile), in place of the rollouts'",
            *([f"trainer flags not applied by the bench: {flags}"] if flags else []),
            *(f"preset differs from the trainer: {d.describe()}" for d in self.differences),
            *(f"trainer key {key.describe()}" for key in keys),
            *(f"{name}: {text}" for name, text in self.value_rows()),
            *(f"trainer variable {fate.describe()}" for fate in variables),
        ]

    def fates_of(self, variables: Mapping[str, str]) -> list[EnvFate]:
        """The fates of another process's variables (the orchestrator's) against this engine."""
        names = " ".join(variables)
        return _environment_fates(
            {**variables, TRAINER_ENV_VARIABLE: names}, self.config, self.engine
        )

    def environment_listed(self) -> list[EnvFate]:
        """The trainer's variables that may change its program, one line each: those the bench
        applies, matches, does not reproduce or does not know."""
        return [f for f in self.environment or () if f.fate not in (PLUMBING, OFF_THE_STEP)]

    def environment_summary(self) -> str:
        """`31 variables (4 carries MaxText keys, ...)`, or why none are listed."""
        if not self.environment:
            return f"none named ({TRAINER_ENV_VARIABLE} unset: the renderer names them)"
        fates = [fate.fate for fate in self.environment]
        counts = ", ".join(f"{fates.count(fate)} {fate}" for fate in ENV_FATES if fate in fates)
        return f"{len(fates)} variables ({counts})"

    def results_line(self) -> str:
        """Where the run's files will be, and whether they outlive the pod."""
        return results_copy.describe(self.config.results_dir, self.config.results_uri)

    def boundary_copy(self) -> BoundaryCopy:
        """The copy of one micro-batch at the step boundary, as this plan's pod sends it."""
        return boundary_copy(self.engine, self.runtime, self.trainer_slice)

    def runtime_line(self) -> str:
        """The JAX runtime the run starts (`runtime.runtime_for`), before it starts it."""
        if self.runtime is None:
            return "not resolved (the plan was made without the process environment)"
        return self.runtime.describe()

    def device_memory(self) -> str:
        """The state per device against the slice's device memory, and the command that compiles
        the programs for the rest (`state_memory`): the plan compiles nothing."""
        state = state_memory(self.engine)
        where = "in host memory" if state.optimizer_on_host else "on the device"
        text = (
            f"state on the device {human_bytes(state.on_device)} per device (parameters"
            f" {human_bytes(state.params)}, gradient sum {human_bytes(state.grad_sum)}; optimizer"
            f" state {human_bytes(state.optimizer)} {where})"
        )
        assumed = [
            f"{key}={value_sources.shown(value_at(self.engine, path))}"
            for path, key in (
                ("optimizer.mu_dtype", "mu_dtype"),
                ("optimizer.memory_host_offload", "optimizer_memory_host_offload"),
            )
            if path in self.engine.maxtext_defaults
        ]
        if assumed:
            text += (
                f" [an estimate at the preset's {' '.join(assumed)}; the pod runs the image's"
                " MaxText defaults for them]"
            )
        tpu_slice = self.trainer_slice
        if tpu_slice is None:
            return text + "; no TRAINER_SLICE: not compared with a device's memory"
        chip = tpu_slice.chip
        return (
            f"{text} of {human_bytes(chip.device_memory_bytes)} per {chip.name} device; the programs' temporaries"
            f" are known once compiled: rl-trainer-bench aot --preset {self.config.preset.name}"
            f" --target {tpu_slice.name} with this TRAINER_ARGV and ENGINE_FLAGS (the peak and"
            f" the {100 * MIN_HEADROOM:g}% margin)"
        )

    def trainer_keys_summary(self) -> str:
        """`12 (5 applied, 7 no equivalent)`, or `none` when the trainer's command sets none."""
        if not self.trainer_keys:
            return "none in the trainer's command"
        fates = [key.fate for key in self.trainer_keys]
        counts = ", ".join(f"{fates.count(fate)} {fate}" for fate in FATES if fate in fates)
        return f"{len(self.trainer_keys)} ({counts})"


def resolve(
    config: BenchConfig,
    host_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
    rendering: bool = False,
) -> Plan:
    """Validate what `config` asks for and resolve its cell; ConfigError naming the first problem.

    `host_bytes` is the memory of the host that will build the micro-batch pool, where the plan
    runs on it (None: not checked, as when rendering for another machine's pod). `env` is the
    environment of the process that will run (the pod's, when rendering), from which the plan
    names the runtime it starts. `rendering`: the plan is made for a pod whose image is not this
    host's, so MaxText is not looked for here.

    The one resolver of a run's engine config: every command that builds or compiles an engine
    (the pod, `run`, `ab`'s arms, `aot`, `check-engine`) takes it from the Plan this returns.
    """
    refuse_unrunnable_stages(config.worker, [config.stage])
    if config.resolved_engine is not None:  # resolved where the knobs were read
        engine, unapplied = config.resolved_engine.config, config.resolved_engine.unapplied
    else:  # a config made in code, or one whose inputs were replaced
        engine, unapplied = engine_config_from(
            config.preset, config.trainer_argv, config.engine_flags, engine=config.engine
        )
    engine = dataclasses.replace(engine, maxtext_driver=config.maxtext_driver)
    refuse_engine_config_problems(engine, config.preset.name)
    _refuse_extra_work(config, engine)
    _check_slice(engine, config.trainer_slice)
    micro_batch_memory.refuse_oversized(
        engine, config.distinct_micro_batches, host_bytes, config.trainer_slice
    )
    fates = engine_plan.trainer_key_fates_for(config, engine)
    layout = _layout(engine, config.orch_argv)
    differences = tuple(d for d in config.preset.differs_from_trainer if d.holds(engine))
    replay = _replay(config, engine)
    runtime = None if env is None else runtime_for(env, config.preset.host_devices)
    _refuse_unmeasurable_peak(config, runtime)
    if runtime is not None and runs_on_host_cpu(env, config.preset.host_devices):
        _refuse_tpu_kernels(engine, runtime)
    preset_values = value_sources.unset_values(
        config.preset, engine, config.trainer_argv, config.engine_flags
    )
    return Plan(
        config,
        engine,
        tuple(unapplied),
        layout,
        fates,
        replay,
        differences,
        engine_facts=engine_plan.engine_facts(config, engine, in_pod_image=not rendering),
        runtime=runtime,
        preset_values=tuple(preset_values),
        environment=None if env is None else tuple(_environment_fates(env, config, engine)),
        compile_cache=compile_cache.describe(config.compile_cache, None if rendering else env),
    )


def _refuse_extra_work(config: BenchConfig, engine: EngineConfig) -> None:
    """extra_device_work and extra_host_bytes are what the built-in engine's programs and
    micro-batches add; another engine would run without them, and an A/B arm with one would be a
    silent copy of the others."""
    if config.engine == BUILT_IN:
        return
    added = {
        "extra_device_work": (
            engine.extra_device_work,
            "adds matmuls to the built-in engine's fwd_bwd",
        ),
        "extra_host_bytes": (
            engine.extra_host_bytes,
            "adds filler bytes to the built-in engine's micro-batches",
        ),
    }
    for key, (value, what) in added.items():
        if value:
            written = value if isinstance(value, int) else f"{value:g}"  # bytes, or matmuls
            raise ConfigError(
                f"{key}={written} {what}, and this run's engine is {config.engine}: drop the key,"
                " or time the built-in engine (ENGINE=builtin)"
            )


def _refuse_unmeasurable_peak(config: BenchConfig, runtime: Runtime | None) -> None:
    """MEASURE_PEAK=on probes one process's own devices with fillers; under Pathways, or with
    several processes, a probe's load failure would be one process's (or the proxy's) while the
    others wait in its collectives, so the plan (and the render) refuses it there. Tunix's
    TrainerWorker ends at a probe's load failure (found on a v5e chip,
    benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md), so MaxText's
    engine under it is refused too."""
    if config.measure_peak and runtime is not None and runtime.kind != SINGLE_PROCESS:
        raise ConfigError(
            f"MEASURE_PEAK=on measures a single process's devices, and this run starts"
            f" {runtime.describe()}: measure on one TPU VM's chips, or set MEASURE_PEAK=off"
        )
    if (
        config.measure_peak
        and config.engine == MAXTEXT
        and config.maxtext_driver != MAXTEXT_OWN_DRIVER
    ):
        raise ConfigError(
            f"MEASURE_PEAK=on with MAXTEXT_DRIVER={config.maxtext_driver}: Tunix's TrainerWorker"
            " (which auto takes where Tunix imports) holds its state at ERROR after the first"
            " probe that does not fit, and refuses every later call, so the probes cannot go on;"
            f" set MAXTEXT_DRIVER={MAXTEXT_OWN_DRIVER} (MaxText's own calls) or MEASURE_PEAK=off"
        )


def _refuse_tpu_kernels(engine: EngineConfig, runtime: Runtime) -> None:
    """A key naming a Pallas TPU kernel, in a run bound to the host's CPU: refused by the plan,
    before the micro-batch pool is built, rather than by the engine once it is."""
    refusal = tpu_kernel_refusal(engine, "the host's CPU")
    if refusal:
        raise ConfigError(f"{refusal} ({runtime.detail or 'JAX_PLATFORMS=cpu'})")


def _environment_fates(
    env: Mapping[str, str], config: BenchConfig, engine: EngineConfig
) -> list[EnvFate]:
    """The trainer's variables' fates, a variable the engine has as a key compared with the value
    the engine runs, one Tunix reads judged by whether Tunix's loss may run in the pod."""
    engine_values = {
        key: value_sources.shown(value_at(engine, ENGINE_KEYS[key].target))
        for key in ENGINE_EQUIVALENTS.values()
    }
    tunix_loss = config.engine == MAXTEXT and config.maxtext_driver != MAXTEXT_OWN_DRIVER
    return trainer_env.environment_fates(env, engine_values, tunix_loss)


def command_plan(**given: Any) -> Plan:
    """The plan of a command that takes its knobs as flags, already typed (`aot`, `check-engine`:
    BenchConfig fields, the preset among them), resolved as a run's is. The command builds or
    compiles the engine itself, which meets the image's MaxText there, so the plan does not look
    for it (`rendering`)."""
    return resolve(BenchConfig.from_env({}, **given), rendering=True)


def refuse_engine_config_problems(engine: EngineConfig, preset_name: str) -> None:
    """ConfigError naming the first thing that keeps `engine` from being laid out on its mesh
    (`config_problems`): the one check `run`, the pod, `aot` and `check-engine` make, so none of
    them reaches JAX with a micro-batch its mesh cannot split."""
    problems = config_problems(engine)
    if problems:
        raise ConfigError(
            f"engine config {problems[0]} (preset {preset_name} with TRAINER_ARGV and"
            " ENGINE_FLAGS applied): fix the key, or choose another PRESET"
        )


def refuse_unrunnable_stages(worker: str, stages: Iterable[StageConfig]) -> None:
    """ConfigError for WORKER=fused with STAGE_BEFORE_UPDATE=on among `stages`: the fused worker
    applies the optimizer inside the step's last fwd_bwd, so there is no update to stage before.

    From the knobs alone, so it is made before any work. Staging that needs methods an engine
    lacks is refused once the engine is built (`Bench.refuse_unsupported`): the plan imports no
    engine, so a renderer can resolve a pod's plan without the engine's packages.
    """
    if worker == "fused" and any(stage.before_update for stage in stages):
        raise ConfigError(
            "STAGE_BEFORE_UPDATE=on needs an update to stage before, but WORKER=fused applies the"
            " optimizer inside the step's last fwd_bwd: set WORKER=separate or STAGE_BEFORE_UPDATE=off"
        )


def environment_config(env: Mapping[str, str], **given: Any) -> BenchConfig:
    """The knobs of a driver started with exactly `env` and no flags (what a pod runs); `given`:
    fields already read from the same text (`BenchConfig.from_env`), not read again."""
    return BenchConfig.from_env(driver_knobs(env, argparse.Namespace()), **given)


def _check_slice(engine: EngineConfig, tpu_slice: TpuSlice | None) -> None:
    """The mesh spans exactly the slice's JAX devices (chips x devices per chip, from the chip
    table): the engine lays one mesh over every device it is given, so a smaller mesh would leave
    devices idle and time another cell, and a larger one cannot be built."""
    mesh = engine.mesh
    if tpu_slice is not None and mesh.size != tpu_slice.num_devices:
        per_chip = tpu_slice.chip.devices_per_chip
        raise ConfigError(
            f"mesh {mesh.fsdp} x {mesh.context} x {mesh.expert} (fsdp x context x expert) needs"
            f" {mesh.size} devices, but TRAINER_SLICE={tpu_slice.describe()} has"
            f" {tpu_slice.num_devices}: set mesh_fsdp, mesh_context and mesh_expert to multiply to"
            f" {tpu_slice.num_devices} ({tpu_slice.chip.name} shows {per_chip} JAX"
            f" device{'s' if per_chip > 1 else ''} per chip)"
        )


def _replay(config: BenchConfig, engine: EngineConfig) -> str:
    """The MoE settings and what the routing profile forecasts at them: how often a micro-batch
    overflows a buffer and is replayed dropless (each replay is one more forward-backward), in
    the buffer of the engine that runs (MaxText's per shard, the built-in engine's per expert)."""
    moe = engine.moe
    buffer_keys = {
        "moe.ragged_buffer_factor": ("ragged_buffer_factor", f"{moe.ragged_buffer_factor:g}"),
        "moe.token_chunks": ("num_moe_token_chunks", str(moe.token_chunks)),
    }
    left = [key for field, (key, _) in buffer_keys.items() if field in engine.maxtext_defaults]
    settings = (
        " ".join(
            f"{key}={DEFAULT_IN_IMAGE if key in left else value}"
            for key, value in buffer_keys.values()
        )
        + f" retry_when_tokens_dropped={str(moe.retry_when_tokens_dropped).lower()}"
    )
    name = config.routing_profile or config.preset.routing_profile
    where = "" if config.routing_profile else "shipped "
    profile = load_profile(config.routing_profile, config.preset.routing_profile)
    maxtext = config.engine == MAXTEXT
    prediction = predicted_replay(profile, engine, MAXTEXT_BUFFER if maxtext else BUILT_IN_BUFFER)
    if prediction is None and maxtext and replays_possible(engine):
        return (
            f"{settings}: never replays (MaxText's layer keeps every routed pair here: one"
            " expert-parallel shard, or a ring of experts without use_ragged_sort=true)"
        )
    if left:
        return (
            f"{' and '.join(left)}: the image's MaxText defaults (the"
            " trainer's command sets none), so no replay is forecast here: the buffer the pod runs"
            " is that MaxText's"
        )
    if prediction is None:
        return f"{settings}: never replays"
    kind = "synthetic" if profile.synthetic else "measured"
    meaning = _replays_per_step(prediction.probability, config.micro_steps)
    chosen = (
        f" (its skew chosen to match {profile.chosen_to_match}: no evidence for that outcome)"
        if profile.chosen_to_match
        else ""
    )
    return (
        f"{settings}: {prediction.describe()}{meaning}, forecast by the {where}{kind} routing"
        f" profile {name}{chosen}"
    )


def _replays_per_step(probability: float, micro_steps: int) -> str:
    """What a replay chance means for the step, in words: `P(replay)=1.00` alone reads as a
    detail, where it says that every micro-batch runs its forward-backward twice."""
    if probability >= 0.995:  # printed as 1.00
        return (
            f": every micro-batch is expected to replay (each of the {micro_steps} micro-steps"
            " runs fwd_bwd, then fwd_bwd_dropless)"
        )
    if probability >= 0.005:  # printed as 0.01 or more
        return (
            f": about {probability * micro_steps:.1f} of the {micro_steps} micro-steps of a step"
            " are expected to replay"
        )
    return ""


def _layout(engine: EngineConfig, orch_argv: CommandLine) -> str:
    if not orch_argv:
        return "the routing profile's layout"
    layout = layout_from_orchestrator_argv(engine, orch_argv)
    return (
        f"from ORCH_ARGV, up to {int(layout.segments_per_row[-1])} sequences per row,"
        f" groups of {layout.group_size}"
    )
