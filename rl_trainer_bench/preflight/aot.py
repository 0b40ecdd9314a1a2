"""Will this cell fit? Compile each engine program ahead of time and add up device memory.

Each program (`fwd_bwd`, its dropless replay, `update`) is compiled on its own from
`jax.ShapeDtypeStruct` inputs, so nothing is allocated and a program that does not fit does not hide
the others. The target is the local devices or a TPU slice compiled from this host through
`jax.experimental.topologies` (the `[tpu-aot]` extra), so a user on a CPU-only machine learns
whether a cell fits a slice before spending one.

A program's own footprint (XLA's argument, output, alias, temp and code bytes) is not the device's
peak: the training state that is not among its arguments stays in memory beside it. The report adds
that state per program and compares the largest sum with the chip's memory. A compile that XLA
refuses for memory becomes a row with the amount needed and available, not a traceback.

Depth: the engine scans over layers, so a shallow compile is fast; `--layers N` compiles at N and
2N layers and extrapolates every compiled figure linearly to the preset's depth, labelled ESTIMATE.

Time: on a target whose chip is in the table, each program also gets XLA's cost analysis with loop
bodies counted per trip and a roofline time (`program_cost`), and the report a predicted step and
MFU (`step_estimate`), all labelled as this tool's estimate, never as a measurement. libtpu's
start-up noise on a CPU host is kept off the screen (`quiet_stderr`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rl_trainer_bench import accelerators
from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.config.knobs import engine_spec
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import ConfigError, UserError
from rl_trainer_bench.preflight import program_cost, step_estimate
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu
from rl_trainer_bench.units import human_bytes

LOCAL = "local"
_MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")
_COST_FIELDS = ("xla_flops", "xla_bytes_accessed", "flops", "bytes_accessed")

_OOM_PATTERNS = (
    # TPU: "Ran out of memory in memory space hbm. Used 120.50G of 95.74G hbm."
    re.compile(
        r"Used\s+(?P<needed>[\d.]+)(?P<nu>[KMGT]?)\s+of\s+(?P<available>[\d.]+)(?P<au>[KMGT]?)\s+hbm",
        re.I,
    ),
    # TPU (libtpu 0.0.42): "the total memory required for HLO temporaries (111.71G) exceeds
    # available HBM (94.75G)"
    re.compile(
        r"required for [\w ]+\((?P<needed>[\d.]+)(?P<nu>[KMGT]?)\)\s+exceeds available \w+ "
        r"\((?P<available>[\d.]+)(?P<au>[KMGT]?)\)",
        re.I,
    ),
    # GPU / generic: "Out of memory while trying to allocate 123456 bytes"
    re.compile(r"allocate\s+(?P<needed>[\d.]+)\s*(?P<nu>[KMGT]?i?B|bytes)", re.I),
)


# ----------------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the programs are compiled for: devices, their kind and each device's memory."""

    name: str  # "local" or a slice such as "tpu7x:4x4x8"
    devices: tuple[Any, ...]
    device_kind: str
    memory_bytes: int | None  # per device
    memory_source: str
    chip: accelerators.Chip | None = None  # for peak FLOP/s and HBM bandwidth; None: unknown
    devices_per_chip: int = 1

    @property
    def roofline(self) -> tuple[float, float] | None:
        """(peak FLOP/s, HBM bytes/s) of one device, or None when the table lacks either."""
        chip = self.chip
        if chip is None or not chip.peak_bf16_flops or not chip.hbm_bytes_per_second:
            return None
        share = self.devices_per_chip
        return chip.peak_bf16_flops / share, chip.hbm_bytes_per_second / share


def resolve_target(name: str, wanted_devices: int = 0) -> Target:
    """The local devices (`local`) or a TPU slice's topology; UserError for an unknown slice."""
    if name == LOCAL:
        return _local_target(wanted_devices)
    try:
        tpu_slice = accelerators.parse_slice(name)
    except ValueError as error:
        raise UserError(f"--target / TRAINER_SLICE: {error}; or 'local'") from None
    return _topology_target(tpu_slice)


def _local_target(wanted_devices: int) -> Target:
    import jax

    if wanted_devices and jax.config.jax_platforms in (None, "", "cpu"):
        # A preset that runs on host CPU devices needs them before JAX starts its backend.
        with contextlib.suppress(RuntimeError):
            if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
                jax.config.update("jax_num_cpu_devices", wanted_devices)
    devices = tuple(jax.devices())
    device = devices[0]
    stats = _memory_stats(device)
    chip = accelerators.chip_for_device_kind(device.device_kind)
    if stats.get("bytes_limit"):
        # What JAX may allocate (on GPUs the preallocated fraction), not the chip's nameplate.
        memory, source = int(stats["bytes_limit"]), "the runtime's bytes_limit for this device"
    elif chip is not None:
        memory, source = chip.memory_bytes, f"{chip.name} table"
    elif device.platform == "cpu":
        memory = _host_memory() // len(devices)
        source = f"host memory shared by {len(devices)} CPU devices"
    else:
        memory, source = None, f"unknown for {device.device_kind!r}"
    return Target(LOCAL, devices, device.device_kind, memory, source, chip)


def _memory_stats(device) -> dict:
    try:
        return device.memory_stats() or {}
    except (RuntimeError, NotImplementedError):
        return {}


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _topology_target(tpu_slice: accelerators.TpuSlice) -> Target:
    import jax

    if not os.environ.get("JAX_PLATFORMS"):
        # This host has no TPU: keep JAX's own backend on the CPU while libtpu compiles.
        with contextlib.suppress(RuntimeError):
            jax.config.update("jax_platforms", "cpu")
    # A compile-only TPU client cannot load an executable back from JAX's persistent cache: with
    # JAX_COMPILATION_CACHE_DIR set, a second check of the same program printed libtpu's
    # "INVALID_ARGUMENT: PjRtCompiler must be constructed with a Client" and compiled anyway.
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        from jax.experimental import topologies

        topology = topologies.get_topology_desc(tpu_slice.name, "tpu")
    except Exception as error:  # libtpu absent, mismatched or busy: JAX raises several types here
        fix = (
            "another process holds libtpu: wait for it, or set ALLOW_MULTIPLE_LIBTPU_LOAD=1"
            if "lockfile" in str(error)
            else "install the matched pair with pip install 'rl-trainer-bench[tpu-aot]'"
        )
        raise UserError(
            f"--target {tpu_slice.name}: cannot build the TPU topology on this host "
            f"({_first_line(error)}); {fix}"
        ) from None
    devices = tuple(topology.devices)
    if len(devices) != tpu_slice.num_devices:
        raise UserError(
            f"--target {tpu_slice.name}: libtpu's topology has {len(devices)} devices where the"
            f" chip table expects {tpu_slice.describe()}; fix devices_per_chip of"
            f" {tpu_slice.chip.name} in rl_trainer_bench/accelerators.py"
        )
    per_chip = tpu_slice.chip.devices_per_chip  # Ironwood shows each chip as two devices
    memory = tpu_slice.chip.memory_bytes // per_chip
    source = f"{tpu_slice.chip.name} table, {per_chip} device(s) per chip"
    return Target(
        tpu_slice.name, devices, devices[0].device_kind, memory, source, tpu_slice.chip, per_chip
    )


# ----------------------------------------------------------------------------------------------
# State and compiled programs
# ----------------------------------------------------------------------------------------------


# What aot needs from an engine's module to lower its programs from abstract inputs, without
# building the engine (which would allocate its weights): the built-in engine's module has them.
AOT_FUNCTIONS = ("lower_programs", "abstract_state", "payload_spec")


def aot_engine_module(spec: str) -> ModuleType:
    """The module of the engine `spec` names, when it can lower its programs from abstract inputs;
    else a UserError saying which of AOT_FUNCTIONS it lacks."""
    from rl_trainer_bench.engine.factory import engine_class

    module = sys.modules[engine_class(spec).__module__]
    missing = [name for name in AOT_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise UserError(
            f"ENGINE={spec}: aot lowers an engine's programs from abstract inputs, which needs"
            f" {', '.join(AOT_FUNCTIONS)} in its module; {module.__name__} lacks"
            f" {', '.join(missing)}: check this engine with `check-engine` and time it with `run`"
        )
    return module


def state_bytes(
    config: EngineConfig, mesh, stage_before_update: bool, engine: ModuleType | None = None
) -> dict[str, int]:
    """Per-device bytes of each part of the state that stays on the device (residency.STATE_PARTS)."""
    import jax

    from rl_trainer_bench.engine import residency, sharding

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


def unsharded_state(config: EngineConfig, mesh) -> list[tuple[str, int]]:
    """(leaf, bytes per device) of every state leaf that is not split over every device."""
    from rl_trainer_bench.engine import programs, sharding

    return sharding.unsharded_leaves(programs.abstract_state(config, mesh), mesh.size)


@dataclasses.dataclass
class ProgramMemory:
    """One program's compiled footprint and cost on one device, or why it did not compile."""

    name: str
    argument: int = 0
    output: int = 0
    alias: int = 0
    temp: int = 0
    generated_code: int = 0
    beside: int = 0  # state not among its arguments (see residency.STATE_PARTS)
    # XLA's cost analysis per device, as XLA gives it (each loop body once) ...
    xla_flops: float = 0.0
    xla_bytes_accessed: float = 0.0
    xla_optimal_seconds: float | None = None  # XLA's own time estimate, where it gives one
    # ... and with loop bodies counted per trip (program_cost), and the roofline time from those.
    flops: float = 0.0
    bytes_accessed: float = 0.0
    roofline_seconds: float | None = None  # ESTIMATE; None without the chip's peak and bandwidth
    compile_seconds: float = 0.0
    out_of_memory: bool = False
    needed: int | None = None  # from a memory failure's message
    available: int | None = None
    error: str = ""  # first line of a failure

    @property
    def resident(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    @property
    def peak(self) -> int:
        return self.resident + self.beside

    @property
    def compiled(self) -> bool:
        return not self.error


def measure(compiled, name: str, seconds: float) -> ProgramMemory:
    """Read XLA's memory and cost analyses of a compiled program."""
    analysis = compiled.memory_analysis()
    cost = program_cost.cost_of(compiled)
    return ProgramMemory(
        name=name,
        argument=int(analysis.argument_size_in_bytes),
        output=int(analysis.output_size_in_bytes),
        alias=int(analysis.alias_size_in_bytes),
        temp=int(analysis.temp_size_in_bytes),
        generated_code=int(analysis.generated_code_size_in_bytes),
        xla_flops=cost.xla_flops,
        xla_bytes_accessed=cost.xla_bytes_accessed,
        xla_optimal_seconds=cost.xla_optimal_seconds,
        flops=cost.flops,
        bytes_accessed=cost.bytes_accessed,
        compile_seconds=seconds,
    )


def failed(name: str, error: BaseException, seconds: float) -> ProgramMemory:
    """A compile failure as a report row; memory failures carry the amounts XLA printed."""
    text = str(error)
    memory = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
    needed = available = None
    for pattern in _OOM_PATTERNS:
        match = pattern.search(text)
        if match:
            needed = _amount(match.group("needed"), match.group("nu"))
            if "available" in match.groupdict() and match.group("available"):
                available = _amount(match.group("available"), match.group("au"))
            break
    return ProgramMemory(
        name=name,
        compile_seconds=seconds,
        out_of_memory=memory,
        needed=needed,
        available=available,
        error=_first_line(error),
    )


def _amount(number: str, unit: str) -> int:
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    unit = unit.upper().removesuffix("IB").removesuffix("B").removesuffix("YTES")
    return int(float(number) * scale.get(unit, 1))


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    interesting = [line for line in lines if "memory" in line.lower() or "Used" in line]
    return (interesting or lines or [type(error).__name__])[0][:300]


def beside_table(engine: ModuleType | None) -> Any:
    """Which state parts sit beside each program: the engine module's BESIDE, else the built-in
    engine's (`residency.BESIDE`)."""
    from rl_trainer_bench.engine import residency

    return getattr(engine, "BESIDE", residency.BESIDE)


def compile_plan(
    config: EngineConfig, mesh, engine: ModuleType | None = None
) -> list[tuple[str, Any, dict]]:
    """Lower every engine program: (name, lowered, compiler options) in the engine's order.

    `engine`: the engine's module (aot_engine_module); the built-in engine's when None. An engine
    whose module has `compile_reservations` (the built-in one) has each program compiled as it
    compiles it, told how much device memory the state beside it holds (`residency`).
    """
    from rl_trainer_bench.engine import programs, residency

    engine = engine or aot_engine_module(BUILT_IN)
    reserve = getattr(engine, "compile_reservations", None)
    reserved = reserve(config, mesh) if callable(reserve) else {}
    platform = programs.platform_of(mesh)
    lowered_programs = engine.lower_programs(config, mesh)
    table = beside_table(engine)
    unknown = [name for name in lowered_programs if name not in table]
    if unknown:  # refused before minutes of compiling, not after
        raise UserError(
            f"engine module {engine.__name__}: no BESIDE entry for program(s) "
            f"{', '.join(unknown)}: give the module a BESIDE table (program -> the "
            f"residency.STATE_PARTS in device memory beside it) so its peak can be counted"
        )
    return [
        (name, lowered, residency.compile_options(platform, reserved.get(name, 0)))
        for name, lowered in lowered_programs.items()
    ]


def compile_one(name: str, lowered, options: dict) -> tuple[Any, ProgramMemory]:
    """Compile one lowered program: (compiled or None, its report row)."""
    start = time.perf_counter()
    try:
        compiled = lowered.compile(compiler_options=options)
    except Exception as error:  # XLA raises XlaRuntimeError/ValueError: keep the others going
        return None, failed(name, error, time.perf_counter() - start)
    return compiled, measure(compiled, name, time.perf_counter() - start)


def compile_programs(
    config: EngineConfig, mesh, engine: ModuleType | None = None
) -> Iterator[tuple[str, Any, ProgramMemory]]:
    """Lower every engine program, then compile each on its own, one after the other:
    (name, compiled or None, row).

    One at a time because libtpu's code generation already keeps the cores busy: the production
    cell's programs compiled at once on 2 cores were no faster than one after the other, and took
    a third more host memory (BENCHMARKS.md, "Where the compile time goes").
    """
    for name, lowered, options in compile_plan(config, mesh, engine):
        compiled, row = compile_one(name, lowered, options)
        yield name, compiled, row


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class AotReport:
    preset: str
    target: str
    device_kind: str
    devices: int
    mesh: dict[str, int]
    memory_bytes: int | None
    memory_source: str
    stage_before_update: bool
    state: dict[str, int]
    programs: list[ProgramMemory]
    layers: int  # the preset's depth
    compiled_layers: tuple[int, ...]  # depths actually compiled (an estimate when != (layers,))
    compile_seconds: float
    unapplied_keys: list[str]
    note: str = ""
    roofline: tuple[float, float] | None = None  # per device: peak FLOP/s, HBM bytes/s
    host_peak_bytes: int = 0  # this process's peak resident memory when the compiles were done
    step: step_estimate.StepEstimate | None = None  # ESTIMATE: predicted step and MFU
    step_note: str = ""  # why there is no predicted step, when there is none
    # State leaves not split over every device, with their bytes per device (`unsharded_state`).
    unsharded_state: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    @property
    def estimate(self) -> bool:
        return self.compiled_layers != (self.layers,)

    @property
    def peak(self) -> int:
        return max((p.peak for p in self.programs if p.compiled), default=0)

    @property
    def headroom(self) -> int | None:
        return None if self.memory_bytes is None else self.memory_bytes - self.peak

    @property
    def fits(self) -> bool | None:
        if any(p.out_of_memory for p in self.programs):
            return False
        if self.headroom is None or any(not p.compiled for p in self.programs):
            return None
        return self.headroom >= 0

    def to_json(self) -> dict:
        return {
            "preset": self.preset,
            "target": self.target,
            "device_kind": self.device_kind,
            "devices": self.devices,
            "mesh": self.mesh,
            "memory_bytes": self.memory_bytes,
            "memory_source": self.memory_source,
            "stage_before_update": self.stage_before_update,
            "state_bytes": self.state,
            "programs": [
                {
                    **dataclasses.asdict(p),
                    "resident": p.resident if p.compiled else None,
                    "peak": p.peak if p.compiled else None,
                    "roofline_seconds_kind": "estimate" if p.roofline_seconds else None,
                }
                for p in self.programs
            ],
            "peak_bytes": self.peak,
            "headroom_bytes": self.headroom,
            "fits": self.fits,
            "layers": self.layers,
            "compiled_layers": list(self.compiled_layers),
            "estimate": self.estimate,
            "compile_seconds": self.compile_seconds,
            "unapplied_keys": self.unapplied_keys,
            "note": self.note,
            "host_peak_bytes": self.host_peak_bytes,
            "time_estimate": self.step.to_json() if self.step else None,
            "time_estimate_note": self.step_note,
            "unsharded_state": [list(leaf) for leaf in self.unsharded_state],
        }


@dataclasses.dataclass(frozen=True)
class Cell:
    """A preset with its knobs applied, and the mesh it is compiled for."""

    preset: str
    config: EngineConfig
    unapplied_keys: list[str]
    target: Target
    mesh: Any
    note: str = ""  # how the mesh was fitted to the target, when it was

    @property
    def mesh_sizes(self) -> dict[str, int]:
        return dict(zip(self.mesh.axis_names, self.mesh.axis_sizes, strict=True))


def resolve_cell(
    preset_name: str, target_name: str, trainer_argv: str = "", engine_flags: str = ""
) -> Cell:
    """The preset's engine config with TRAINER_ARGV and ENGINE_FLAGS applied, on the target's mesh."""
    cell = preset(preset_name)
    config, unapplied = engine_config_from(cell, trainer_argv, engine_flags)
    target = resolve_target(target_name, cell.host_devices if target_name == LOCAL else 0)
    note = ""
    if config.mesh == cell.engine.mesh and config.mesh.size != len(target.devices):
        config, note = _fit_fsdp(config, len(target.devices), target.name)
    return Cell(cell.name, config, unapplied, target, _mesh(config, target), note)


def _fit_fsdp(config: EngineConfig, devices: int, target: str) -> tuple[EngineConfig, str]:
    """The preset's mesh on a target of another size: keep context and expert, refit fsdp.

    Only when the user set no mesh key; the report says so. Otherwise make_mesh refuses the
    mismatch with the keys to set.
    """
    mesh = config.mesh
    inner = mesh.context * mesh.expert
    if devices % inner:
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
    trainer_argv: str = "",
    engine_flags: str = "",
    stage_before_update: bool = False,
    layers: int = 0,
    progress: Callable[[str], None] = lambda line: None,
    engine: str = BUILT_IN,
    micro_steps: int = 0,
    routing_profile: str | None = None,
    seed: int = 0,
) -> AotReport:
    """Compile the preset's programs for the target and build the memory report, with the
    predicted step of `micro_steps` (0: the preset's) micro-batches where the chip is known.

    `progress` gets one line per compiled program: a full-size compile takes minutes.
    """
    module = aot_engine_module(engine)
    from rl_trainer_bench.payload.routing_profile import load_profile

    if seed < 0:
        raise UserError(f"--seed / SEED={seed}: expected 0 or more")
    # a bad file is refused before minutes of compiling
    profile = load_profile(routing_profile, preset(preset_name).routing_profile)
    cell = resolve_cell(preset_name, target_name, trainer_argv, engine_flags)
    full_depth = cell.config.model.num_layers
    depths = _depths(full_depth, layers)
    started = time.perf_counter()
    measured = []
    for depth in depths:
        rows = []
        for name, _, row in compile_programs(_with_layers(cell.config, depth), cell.mesh, module):
            status = "compiled" if row.compiled else f"FAILED ({row.error})"
            progress(f"aot: {name} at {depth} layers {status} in {row.compile_seconds:.1f} s")
            rows.append(row)
        measured.append(rows)
    programs = measured[0] if len(depths) == 1 else _extrapolate(measured, depths, full_depth)
    seconds = time.perf_counter() - started
    report = assemble(cell, programs, depths, stage_before_update, seconds, module)
    report.host_peak_bytes = host_peak_bytes()
    if report.roofline is None:
        report.step_note = (
            f"no peak FLOP/s and HBM bandwidth in the chip table for {cell.target.device_kind!r}"
        )
    else:
        progress("aot: building micro-batch 0 for the replay chance and the model FLOPs")
        facts = step_estimate.micro_batch_facts(cell.config, profile, seed)
        report.step = predict_step(report, micro_steps or preset(cell.preset).micro_steps, facts)
    return report


def host_peak_bytes() -> int:
    """This process's peak resident memory so far (Linux reports it in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def predict_step(
    report: AotReport, micro_steps: int, facts: step_estimate.MicroBatchFacts
) -> step_estimate.StepEstimate:
    """The predicted step from the report's roofline times and the first micro-batch's facts."""
    peak, bandwidth = report.roofline
    return step_estimate.StepEstimate(
        micro_steps=micro_steps,
        program_seconds={p.name: p.roofline_seconds for p in report.programs},
        replay_probability=facts.replay_probability,
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
    from rl_trainer_bench.engine import residency

    state = state_bytes(cell.config, cell.mesh, stage_before_update, engine)
    table = beside_table(engine)
    roofline = cell.target.roofline
    for program in programs:
        program.beside = residency.beside(program.name, state, table)
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
        unsharded_state=unsharded_state(cell.config, cell.mesh),
    )


def _mesh(config: EngineConfig, target: Target):
    from rl_trainer_bench.engine import sharding

    return sharding.make_mesh(config.mesh, list(target.devices))


def _depths(full_depth: int, layers: int) -> list[int]:
    if layers < 0:
        raise UserError(
            f"--layers / AOT_LAYERS={layers}: expected 0 (full depth) or a positive count"
        )
    if layers == 0 or 2 * layers >= full_depth:
        return [full_depth]
    return [layers, 2 * layers]


def _with_layers(config: EngineConfig, layers: int) -> EngineConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, num_layers=layers))


def _extrapolate(
    measured: list[list[ProgramMemory]], depths: list[int], full_depth: int
) -> list[ProgramMemory]:
    """Every compiled figure at `full_depth`, linear through the two depths that were compiled."""
    (low, high), (shallow, deep) = depths, measured
    rows = []
    for a, b in zip(shallow, deep, strict=True):
        if not (a.compiled and b.compiled):
            rows.append(b if not b.compiled else a)
            continue

        def scaled(x: float, y: float) -> float:
            return x + (y - x) * (full_depth - low) / (high - low)

        row = ProgramMemory(name=a.name, compile_seconds=a.compile_seconds + b.compile_seconds)
        for field in _MEMORY_FIELDS:
            setattr(row, field, round(scaled(getattr(a, field), getattr(b, field))))
        for field in _COST_FIELDS:
            setattr(row, field, scaled(getattr(a, field), getattr(b, field)))
        if a.xla_optimal_seconds is not None and b.xla_optimal_seconds is not None:
            row.xla_optimal_seconds = scaled(a.xla_optimal_seconds, b.xla_optimal_seconds)
        rows.append(row)
    return rows


def format_report(report: AotReport) -> str:
    """The human table: one row per program, then the device peak against the chip's memory."""
    lines = _report_heading(report) + _program_table(report) + _memory_verdict(report)
    lines += format_estimate(report)
    host = (
        f"; host peak memory {human_bytes(report.host_peak_bytes)}"
        if report.host_peak_bytes
        else ""
    )
    lines.append(f"compiled in {report.compile_seconds:.1f} s{host}")
    return "\n".join(lines)


def _report_heading(report: AotReport) -> list[str]:
    """Which cell was compiled for which devices, and whether the figures are extrapolated."""
    mesh = " x ".join(f"{n}={s}" for n, s in report.mesh.items())
    lines = [
        f"AOT memory check: preset {report.preset} on {report.target} ({report.devices} x "
        f"{report.device_kind}), mesh {mesh}, STAGE_BEFORE_UPDATE={'on' if report.stage_before_update else 'off'}",
    ]
    if report.note:
        lines.append(report.note)
    if report.estimate:
        low, high = report.compiled_layers
        lines.append(
            f"ESTIMATE: compiled at {low} and {high} of {report.layers} layers; program figures "
            f"extrapolated linearly to {report.layers} (state figures are exact)"
        )
    return lines


def _program_table(report: AotReport) -> list[str]:
    """One row of bytes per program; a program that did not compile says why in its row."""
    header = (
        "program",
        "argument",
        "output",
        "alias",
        "temp",
        "code",
        "resident",
        "beside",
        "peak",
    )
    lines = [f"{header[0]:<18}" + "".join(f"{h:>12}" for h in header[1:])]
    for p in report.programs:
        if not p.compiled:
            lines.append(f"{p.name:<18} {_failure_detail(p)}  ({p.error})")
            continue
        values = (
            p.argument,
            p.output,
            p.alias,
            p.temp,
            p.generated_code,
            p.resident,
            p.beside,
            p.peak,
        )
        lines.append(f"{p.name:<18}" + "".join(f"{human_bytes(v):>12}" for v in values))
    return lines


def _failure_detail(p: ProgramMemory) -> str:
    """How a program failed, with the bytes XLA said it needed where a memory failure names them."""
    detail = "OUT OF MEMORY" if p.out_of_memory else "FAILED"
    if p.needed is not None:
        detail += f": needs {human_bytes(p.needed)}" + (
            f" of {human_bytes(p.available)}" if p.available is not None else ""
        )
    return detail


# How the state line names a part that is not a program's neighbour in device memory.
_STATE_LABELS = {"host_memory": "in host memory (not on the device)"}


def _memory_verdict(report: AotReport) -> list[str]:
    """The state per device and the device peak against the chip's memory, with what to watch."""
    state = ", ".join(
        f"{_STATE_LABELS.get(k, k)} {human_bytes(v)}" for k, v in report.state.items() if v
    )
    lines = [f"state per device: {state}"]
    memory = human_bytes(report.memory_bytes) if report.memory_bytes is not None else "unknown"
    verdict = {True: "FITS", False: "DOES NOT FIT", None: "UNKNOWN"}[report.fits]
    headroom = human_bytes(report.headroom) if report.headroom is not None else "n/a"
    lines.append(
        f"device peak {human_bytes(report.peak)} of {memory} ({report.memory_source}); "
        f"headroom {headroom}: {verdict}"
    )
    if report.unsharded_state:
        leaves = ", ".join(f"{path} {human_bytes(n)}" for path, n in report.unsharded_state)
        lines.append(f"state not split over all {report.devices} devices: {leaves}")
    if report.unapplied_keys:
        lines.append(f"keys the built-in engine does not apply: {', '.join(report.unapplied_keys)}")
    return lines


def format_estimate(report: AotReport) -> list[str]:
    """XLA's cost per program, the roofline times and the predicted step, labelled as estimates."""
    compiled = [p for p in report.programs if p.compiled]
    if not compiled:
        return []
    lines = [
        "cost per device: XLA's cost analysis as XLA counts it (each loop body once), then with "
        "loop bodies counted per trip"
    ]
    header = ("program", "XLA FLOPs", "XLA bytes", "XLA time", "FLOPs", "bytes", "roofline")
    lines.append(f"{header[0]:<18}" + "".join(f"{h:>12}" for h in header[1:]))
    for p in compiled:
        values = (
            f"{p.xla_flops:.4g}",
            human_bytes(round(p.xla_bytes_accessed)),
            step_estimate.seconds_text(p.xla_optimal_seconds),
            f"{p.flops:.4g}",
            human_bytes(round(p.bytes_accessed)),
            step_estimate.seconds_text(p.roofline_seconds),
        )
        lines.append(f"{p.name:<18}" + "".join(f"{v:>12}" for v in values))
    if report.roofline is None:
        lines.append(f"no time estimate: {report.step_note}")
        return lines
    peak, bandwidth = report.roofline
    lines.append(
        f"XLA time: XLA's own estimate (optimal_seconds; '-' where it gives none, as with a loop); "
        f"roofline: {step_estimate.LABEL} by this tool, max(FLOPs / {peak / 1e12:.1f} TFLOP/s, "
        f"bytes / {bandwidth / 1e12:.3f} TB/s) per device, a lower bound (no exposed collectives)"
    )
    checks = [
        f"{p.name} {p.roofline_seconds / p.xla_optimal_seconds:.2f}"
        for p in compiled
        if p.xla_optimal_seconds and p.roofline_seconds
    ]
    if checks:
        lines.append(f"roofline / XLA time where XLA gives one: {', '.join(checks)}")
    step = report.step
    if step is None:
        return lines
    lines.append(f"predicted step, {step_estimate.LABEL}: {step.formula()}")
    lines.append(f"  P(replay) per micro-batch from the {step.replay_source}")
    mfu = step.mfu
    lines.append(
        f"predicted MFU, {step_estimate.LABEL}: "
        + ("n/a" if mfu is None else f"{100 * mfu:.1f}%")
        + f" (model FLOPs {step.model_flops_per_micro_batch:.4g} per micro-batch, real tokens "
        f"only, over {step.devices} devices at {step.peak_flops_per_device / 1e12:.1f} TFLOP/s)"
    )
    return lines


def compiled_texts(
    preset_name: str, target_name: str, layers: int = 0
) -> Iterator[tuple[str, str, dict[str, int]]]:
    """(program, compiled HLO text, mesh) of each engine program, for the overlap summary."""
    cell = resolve_cell(preset_name, target_name)
    config = _with_layers(cell.config, layers) if layers else cell.config
    for name, compiled, row in compile_programs(config, cell.mesh):
        if compiled is None:
            raise UserError(f"program {name} did not compile for {target_name}: {row.error}")
        yield name, compiled.as_text(), cell.mesh_sizes


# ----------------------------------------------------------------------------------------------
# Command
# ----------------------------------------------------------------------------------------------


def add_target_arguments(parser) -> None:
    """Arguments shared with `hlo-overlap`: which cell, compiled for which devices."""
    parser.add_argument("--preset", default="cpu-tiny", help="preset (default: cpu-tiny)")
    parser.add_argument(
        "--target",
        default=LOCAL,
        help=f"'local' (this process's devices) or a TPU slice: {accelerators.known_slice_forms()}",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=0,
        help="compile at N and 2N layers and extrapolate to the preset's depth (0: full depth)",
    )


def add_arguments(parser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--trainer-argv", default="", help="trainer flags (as in TRAINER_ARGV)")
    parser.add_argument("--engine-flags", default="", help="key=value engine flags (ENGINE_FLAGS)")
    parser.add_argument(
        "--engine",
        default=BUILT_IN,
        help=f"module:Class (ENGINE); only engines that lower from abstract inputs (default {BUILT_IN})",
    )
    parser.add_argument(
        "--stage-before-update",
        default="off",
        help="on|off: count the staged micro-batch beside the dropless replay and update",
    )
    parser.add_argument(
        "--micro-steps",
        type=int,
        default=0,
        help="micro-batches per step for the predicted step (0: the preset's MICRO_STEPS)",
    )
    parser.add_argument(
        "--routing-profile",
        default=None,
        help="routing profile JSON for the replay chance (ROUTING_PROFILE; default: the shipped one)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the micro-batch the estimate reads (SEED)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")


def run(args) -> int:
    """Exit 0 when the cell fits, 1 when it does not (or a program failed), 2 for bad input."""
    if args.stage_before_update not in ("on", "off"):
        raise ConfigError(f"STAGE_BEFORE_UPDATE={args.stage_before_update!r}: expected on or off")
    if args.micro_steps < 0:
        raise UserError(f"--micro-steps / MICRO_STEPS={args.micro_steps}: expected 0 or more")
    with quiet_libtpu():
        report = run_check(
            args.preset,
            args.target,
            trainer_argv=args.trainer_argv,
            engine_flags=args.engine_flags,
            stage_before_update=args.stage_before_update == "on",
            layers=args.layers,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            micro_steps=args.micro_steps,
            routing_profile=args.routing_profile,
            seed=args.seed,
            engine=engine_spec(args.engine, "--engine"),
        )
    document = json.dumps(report.to_json(), indent=1)
    if args.output:
        from rl_trainer_bench.io import write_text_atomically

        write_text_atomically(Path(args.output), document + "\n")
    print(document if args.json else format_report(report))
    return 0 if report.fits else 1
