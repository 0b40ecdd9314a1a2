"""Will this cell fit? The cell on its target, its programs compiled, and the report assembled.

A program's own footprint (XLA's argument, output, alias, temp and code bytes) is not the device's
peak: the training state that is not among its arguments stays in memory beside it. The report adds
that state per program and compares the largest sum with the chip's memory.

Time: on a target whose chip is in the table, each program also gets a roofline time from its loop-
counted cost (`program_cost`), and the report a predicted step and MFU (`step_estimate`), all
labelled as this tool's estimate, never as a measurement.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import jax

from rl_trainer_bench.bench.plan import Plan, command_plan
from rl_trainer_bench.bench.state_memory import MIN_HEADROOM
from rl_trainer_bench.config import values
from rl_trainer_bench.config.engine_keys import ENGINE_KEYS
from rl_trainer_bench.config.knobs import StageConfig
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.abstract_inputs import platform_of
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import aot_optional
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload.routing_profile import load_profile
from rl_trainer_bench.preflight import program_cost, step_estimate
from rl_trainer_bench.preflight.aot.compile import ProgramMemory, compile_programs
from rl_trainer_bench.preflight.aot.depth import (
    FULL_DEPTH,
    depths_to_compile,
    extrapolate,
    with_layers,
)
from rl_trainer_bench.preflight.aot.engine_module import aot_engine_module, beside_table
from rl_trainer_bench.preflight.aot.report import AotReport
from rl_trainer_bench.preflight.aot.targets import LOCAL, Target, resolve_target
from rl_trainer_bench.preflight.compiler_flags import compiler_flags
from rl_trainer_bench.units import human_bytes

# MICRO_STEPS left unset: predict the step at the plan's micro-steps (the launcher's, else the
# preset's).
PRESET_MICRO_STEPS = None


def state_bytes(
    config: EngineConfig, mesh, stage_before_update: bool, engine: ModuleType | None = None
) -> dict[str, int]:
    """Per-device bytes of each part of the state that stays on the device (residency.STATE_PARTS)."""
    engine = engine or aot_engine_module(BUILT_IN)
    batch = {
        name: jax.ShapeDtypeStruct(
            s.shape, s.dtype, sharding=sharding.payload_sharding(mesh, s.ndim)
        )
        for name, s in engine.payload_spec(config).items()
    }
    return residency.state_bytes(
        engine.abstract_state(config, mesh),
        batch,
        stage_before_update=stage_before_update,
    )


def unsharded_state(config: EngineConfig, mesh, engine: ModuleType) -> list[tuple[str, int]]:
    """(leaf, bytes per device) of every state leaf that is not split over every device."""
    return sharding.unsharded_leaves(engine.abstract_state(config, mesh), mesh.size)


@dataclasses.dataclass(frozen=True)
class Cell:
    """A preset with its knobs applied (its plan), and the mesh it is compiled for."""

    plan: Plan  # the run's plan, resolved once: its knobs and the engine config they build
    config: EngineConfig  # the plan's, less the trainer keys the engine refuses
    target: Target
    mesh: Any
    note: str = ""  # how the mesh was fitted to the target, when it was
    # The trainer's engine keys the engine refused, {key=value: why}: compiled without them.
    refused_keys: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def preset(self) -> str:
        return self.plan.config.preset.name

    @property
    def unapplied_keys(self) -> list[str]:
        return list(self.plan.unapplied)

    @property
    def mesh_sizes(self) -> dict[str, int]:
        return dict(zip(self.mesh.axis_names, self.mesh.axis_sizes, strict=True))


def resolve_cell(
    preset_name: str,
    target_name: str,
    trainer_argv: str | Sequence[str] = "",
    engine_flags: str = "",
    engine: str | None = BUILT_IN,
    **knobs: Any,
) -> Cell:
    """The cell's plan (`bench/plan.command_plan`: the preset with TRAINER_ARGV and ENGINE_FLAGS
    applied, as a run resolves it; `knobs`: more of its fields, e.g. micro_steps) on the target's
    mesh. `engine` None: the engine the trainer's command chooses, as a run's."""
    cell = preset(preset_name)
    target = resolve_target(target_name, cell.host_devices if target_name == LOCAL else 0)
    fitted, note = _fit_fsdp(cell.engine, len(target.devices), target.name)
    plan = command_plan(
        preset=dataclasses.replace(cell, engine=fitted),
        trainer_argv=values.shell_words("TRAINER_ARGV", trainer_argv)
        if isinstance(trainer_argv, str)
        else tuple(trainer_argv),
        engine_flags=engine_flags,
        engine=engine,
        **knobs,
    )
    mesh_given = not any(
        ENGINE_KEYS[value.key].target.startswith("mesh.") for value in plan.preset_values
    )
    if mesh_given or plan.engine.mesh != fitted.mesh:
        note = ""
    mesh = _mesh(plan.engine, target)
    config, refused = _without_refused_keys(
        plan.engine, aot_engine_module(plan.config.engine), mesh
    )
    return Cell(plan, config, target, mesh, note, refused)


def _without_refused_keys(
    config: EngineConfig, engine: ModuleType, mesh
) -> tuple[EngineConfig, dict[str, str]]:
    """The config without the trainer's keys the engine refuses (`trainer_keys_refused`), and
    those keys with the engine's reason; the report lists them."""
    refuse = aot_optional(engine, "trainer_keys_refused")
    if not callable(refuse) or not config.trainer_maxtext_keys:
        return config, {}
    refused = refuse(config, platform_of(mesh))
    kept = tuple(
        (key, text) for key, text in config.trainer_maxtext_keys if f"{key}={text}" not in refused
    )
    return dataclasses.replace(config, trainer_maxtext_keys=kept), dict(refused)


def _fit_fsdp(config: EngineConfig, devices: int, target: str) -> tuple[EngineConfig, str]:
    """The preset's mesh on a target of another size: keep context and expert, refit fsdp.

    Used only where the user sets no mesh key (`resolve_cell`); the report says so. Otherwise
    make_mesh refuses the mismatch with the keys to set.
    """
    mesh = config.mesh
    inner = mesh.context * mesh.expert
    if mesh.size == devices or devices % inner:
        return config, ""
    fitted = dataclasses.replace(mesh, fsdp=devices // inner)
    note = (
        f"mesh: the preset's fsdp={mesh.fsdp} x context={mesh.context} x expert={mesh.expert} "
        f"needs {mesh.size} devices and {target} has {devices}: fsdp set to {fitted.fsdp} "
        "(set mesh_fsdp, mesh_context, mesh_expert to choose)"
    )
    return dataclasses.replace(config, mesh=fitted), note


def run_check(
    preset_name: str,
    target_name: str,
    trainer_argv: str | Sequence[str] = "",
    engine_flags: str = "",
    stage_before_update: bool = False,
    layers: int = FULL_DEPTH,
    progress: Callable[[str], None] = lambda line: None,
    engine: str | None = BUILT_IN,
    micro_steps: int | None = PRESET_MICRO_STEPS,
    routing_profile: str | None = None,
    seed: int = 0,
    min_headroom: float = MIN_HEADROOM,
) -> AotReport:
    """Compile the preset's programs for the target and build the memory report, with the
    predicted step of `micro_steps` micro-batches where the chip is known (PRESET_MICRO_STEPS:
    the plan's, the launcher's count where TRAINER_ARGV gives it, else the preset's).

    `progress` gets one line per compiled program: a full-size compile takes minutes.
    `min_headroom`: the fraction of a device's memory the peak must leave free for the margin.
    """
    if seed < 0:
        raise UserError(f"--seed / SEED={seed}: expected 0 or more")
    cell = resolve_cell(  # a bad routing profile is refused here, before minutes of compiling
        preset_name,
        target_name,
        trainer_argv,
        engine_flags,
        engine,
        stage=StageConfig(before_update=stage_before_update),
        micro_steps=micro_steps,
        routing_profile=routing_profile,
        seed=seed,
    )
    return check_cell(cell, layers, progress, min_headroom)


def check_cell(
    cell: Cell,
    layers: int = FULL_DEPTH,
    progress: Callable[[str], None] = lambda line: None,
    min_headroom: float = MIN_HEADROOM,
) -> AotReport:
    """`run_check` of a resolved cell: its plan's engine config compiled, its stage counted and
    its micro-steps, routing profile and seed in the predicted step."""

    config = cell.plan.config
    module = aot_engine_module(config.engine)
    full_depth = cell.config.model.num_layers
    depths = depths_to_compile(full_depth, layers, len(cell.config.model.layer_types))
    started = time.perf_counter()
    measured = []
    for depth in depths:
        rows = []
        for name, _, row in compile_programs(with_layers(cell.config, depth), cell.mesh, module):
            progress(f"aot: {name} at {depth} layers {_progress_status(row)}")
            rows.append(row)
        measured.append(rows)
    programs = measured[0] if len(depths) == 1 else extrapolate(measured, depths, full_depth)
    seconds = time.perf_counter() - started
    report = assemble(cell, programs, depths, config.stage.before_update, seconds, module)
    report.host_peak_bytes = host_peak_bytes()
    report.min_headroom = min_headroom
    report.engine = config.engine
    report.compiler_flags = compiler_flags(cell.target.name != LOCAL)
    if report.roofline is None:
        report.step_note = (
            f"no peak FLOP/s and HBM bandwidth in the chip table for {cell.target.device_kind!r}"
        )
    else:
        progress("aot: building micro-batch 0 for the replay chance and the model FLOPs")
        profile = load_profile(config.routing_profile, config.preset.routing_profile)
        facts = step_estimate.micro_batch_facts(cell.config, profile, config.seed)
        report.step = predict_step(report, config.micro_steps, facts)
    return report


def _progress_status(row: ProgramMemory) -> str:
    """How one compile ended, with XLA's bytes as soon as it has them: a full-size compile takes
    minutes per program, and a run stopped before the report still says what it found."""
    seconds = f"in {row.compile_seconds:.1f} s"
    if not row.compiled:
        return f"FAILED ({row.error}) {seconds}"
    return (
        f"compiled {seconds}: argument {human_bytes(row.argument)}, output"
        f" {human_bytes(row.output)} (aliased {human_bytes(row.alias)}), temp"
        f" {human_bytes(row.counted_temp)}, resident {human_bytes(row.resident)} per device"
    )


def host_peak_bytes() -> int:
    """This process's peak resident memory so far (Linux reports it in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def predict_step(
    report: AotReport, micro_steps: int, facts: step_estimate.MicroBatchFacts
) -> step_estimate.StepEstimate:
    """The predicted step from the report's op estimates and the first micro-batch's facts."""
    peak, bandwidth = report.roofline
    return step_estimate.StepEstimate(
        micro_steps=micro_steps,
        program_seconds={p.name: p.op_seconds for p in report.programs},
        program_terms={p.name: p.op_terms for p in report.programs if p.op_terms},
        compute_seconds={
            p.name: p.bound_flops / peak if p.compiled else None for p in report.programs
        },
        # An engine without a replay program (MaxText's) never replays.
        replay_probability=facts.replay_probability
        if any(p.name == step_estimate.REPLAY for p in report.programs)
        else 0.0,
        model_flops_per_micro_batch=facts.model_flops,
        devices=report.devices,
        peak_flops_per_device=peak,
        bytes_per_second_per_device=bandwidth,
        replay_source=facts.source,
    )


def assemble(
    cell: Cell,
    programs: list[ProgramMemory],
    depths: Sequence[int],
    stage_before_update: bool,
    seconds: float,
    engine: ModuleType | None = None,
) -> AotReport:
    """The report from compiled rows: each program gets the state beside it."""
    engine = engine or aot_engine_module(BUILT_IN)
    state = state_bytes(cell.config, cell.mesh, stage_before_update, engine)
    table = beside_table(engine)
    roofline = cell.target.roofline
    for program in programs:
        program.beside = residency.beside(program.name, state, table)
        if "opt_state" in table[program.name]:
            program.optimizer_beside = state["opt_state"]
        if roofline is not None and program.compiled:
            program.roofline_seconds = program_cost.roofline_seconds(
                program.flops, program.bytes_accessed, *roofline
            )
    return AotReport(
        preset=cell.preset,
        target=cell.target.name,
        device_kind=cell.target.device_kind,
        devices=len(cell.target.devices),
        mesh=cell.mesh_sizes,
        memory_bytes=cell.target.memory_bytes,
        memory_source=cell.target.memory_source,
        stage_before_update=stage_before_update,
        state=state,
        programs=programs,
        layers=cell.config.model.num_layers,
        compiled_layers=tuple(depths),
        compile_seconds=seconds,
        unapplied_keys=cell.unapplied_keys,
        note=cell.note,
        roofline=roofline,
        unsharded_state=unsharded_state(cell.config, cell.mesh, engine),
        refused_keys=cell.refused_keys,
    )


def _mesh(config: EngineConfig, target: Target):
    return sharding.make_mesh(config.mesh, list(target.devices))


def compiled_texts(
    preset_name: str,
    target_name: str,
    layers: int = FULL_DEPTH,
    engine: str = BUILT_IN,
    trainer_argv: str | Sequence[str] = "",
    engine_flags: str = "",
) -> Iterator[tuple[str, str | None, dict[str, int], str]]:
    """(program, compiled HLO text, mesh, "") of each program of `engine`, for the overlap summary;
    (program, None, {}, the first line of its error) of one that does not compile.

    A program that does not compile does not stop the others: on the 397B cell at the recipe's
    MaxText keys `fwd_bwd` compiles and `fwd_bwd_accum` does not fit, each after a long compile,
    and the one that compiled is still worth its report.
    """
    cell = resolve_cell(preset_name, target_name, trainer_argv, engine_flags, engine)
    module = aot_engine_module(cell.plan.config.engine)
    model = cell.config.model
    depths_to_compile(model.num_layers, layers, len(model.layer_types))  # refuses a bad --layers
    config = cell.config if layers == FULL_DEPTH else with_layers(cell.config, layers)
    for name, compiled, row in compile_programs(config, cell.mesh, module):
        if compiled is None:
            yield name, None, {}, row.error
        else:
            yield name, compiled.as_text(), program_mesh(compiled), ""


def program_mesh(compiled) -> dict[str, int]:
    """The axes of the mesh a compiled program's arguments are laid out on, major to minor: an
    engine may lay its programs out on a mesh of its own (MaxText's twelve axes, most of them of
    size 1, which no collective spans and which are left out)."""
    for placement in jax.tree.leaves(compiled.input_shardings):
        if isinstance(placement, jax.sharding.NamedSharding):
            shape = dict(placement.mesh.shape)
            return {axis: size for axis, size in shape.items() if size > 1} or shape
    return {}
