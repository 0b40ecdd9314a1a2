"""Compile each lowered engine program on its own and read its footprint and cost, or its failure.

Each program (`fwd_bwd`, its dropless replay, `update`) is compiled on its own, so a program that
does not fit does not hide the others. A compile that XLA refuses for memory becomes a row with the
amount needed and available, not a traceback. Cost is XLA's analysis with loop bodies counted per
trip (`program_cost`); time is each op's own roofline summed along the schedule, collectives
less what it hides (`op_estimate`), on a chip whose rates the chip table holds.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from rl_trainer_bench.chips.accelerators import chip_for_device_kind
from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.abstract_inputs import platform_of
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import aot_optional
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.engine.kernel_vmem import vmem_overflow_fix
from rl_trainer_bench.engine.temp_block import compile_reading_block
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight import op_estimate, program_cost
from rl_trainer_bench.preflight.aot.engine_module import aot_engine_module, beside_table
from rl_trainer_bench.preflight.hlo.parse import parse_hlo

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")


COST_FIELDS = ("xla_flops", "xla_bytes_accessed", "flops", "bytes_accessed", "bound_flops")


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


@dataclasses.dataclass
class ProgramMemory:
    """One program's compiled footprint and cost on one device, or why it did not compile."""

    name: str
    argument: int = 0
    output: int = 0
    alias: int = 0
    temp: int = 0  # XLA's temp_size_in_bytes
    # On TPU, the HBM temporary block of XLA's buffer assignment, what loading the program
    # allocates for its temporaries and what its peak counts (engine/temp_block.py); None where
    # not read (off TPU, where `temp` is that allocation).
    temp_block: int | None = None
    generated_code: int = 0
    beside: int = 0  # state not among its arguments (see residency.STATE_PARTS)
    # The optimizer state's part of `beside` (0 when it is in host memory).
    optimizer_beside: int = 0
    # XLA's own peak of the buffers live at once, arguments included (`peak_memory_in_bytes`),
    # where the backend gives it. Not the device's peak: the production cell's replay has 55.78 GiB
    # live at most in 83.66 GiB resident, XLA's temporaries being one block sized by how it packs
    # them (benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md).
    live_peak: int | None = None
    # XLA's cost analysis per device, as XLA gives it (each loop body once) ...
    xla_flops: float = 0.0
    xla_bytes_accessed: float = 0.0
    xla_optimal_seconds: float | None = None  # XLA's own time estimate, where it gives one
    # ... and with loop bodies counted per trip (program_cost), and the roofline time from those.
    flops: float = 0.0
    bytes_accessed: float = 0.0
    bound_flops: float = 0.0  # `flops` less TPU kernels' own statements (`program_cost`)
    unstated_kernels: tuple[str, ...] = ()  # TPU kernels whose FLOPs neither counts
    roofline_seconds: float | None = None  # ESTIMATE; None without the chip's peak and bandwidth
    # The op estimate (`op_estimate`): its seconds per execution by term, and the time; ESTIMATES,
    # None without the chip's rates.
    op_terms: dict[str, float] | None = None
    unstated_kernel_ops: tuple[str, ...] = ()  # kernels the op estimate counts by bytes only
    compile_seconds: float = 0.0
    out_of_memory: bool = False
    needed: int | None = None  # from a memory failure's message
    available: int | None = None
    error: str = ""  # first line of a failure

    @property
    def op_seconds(self) -> float | None:
        """The op estimate of one execution (ESTIMATE); None without one."""
        return self.op_terms["seconds"] if self.op_terms else None

    @property
    def counted_temp(self) -> int:
        """The temporaries' bytes the peak counts: the HBM block where it was read."""
        return self.temp if self.temp_block is None else self.temp_block

    @property
    def resident(self) -> int:
        return self.argument + self.output - self.alias + self.counted_temp

    @property
    def peak(self) -> int:
        return self.resident + self.beside

    @property
    def compiled(self) -> bool:
        return not self.error


def measure(
    compiled,
    name: str,
    seconds: float,
    temp_block: int | None = None,
    rates: op_estimate.Rates | None = None,
) -> ProgramMemory:
    """Read XLA's memory and cost analyses of a compiled program (`temp_block`: its HBM
    temporary block where it was read), and with `rates` its op estimate."""
    analysis = compiled.memory_analysis()
    module = parse_hlo(compiled.as_text(), f"compiled {name}")
    cost = program_cost.cost_from(
        program_cost.xla_analysis(compiled), program_cost.loop_counts(module)
    )
    found = op_estimate.estimate(module, rates) if rates is not None else None
    return ProgramMemory(
        name=name,
        argument=int(analysis.argument_size_in_bytes),
        output=int(analysis.output_size_in_bytes),
        alias=int(analysis.alias_size_in_bytes),
        temp=int(analysis.temp_size_in_bytes),
        temp_block=temp_block,
        generated_code=int(analysis.generated_code_size_in_bytes),
        live_peak=_live_peak(analysis),
        xla_flops=cost.xla_flops,
        xla_bytes_accessed=cost.xla_bytes_accessed,
        xla_optimal_seconds=cost.xla_optimal_seconds,
        flops=cost.flops,
        bytes_accessed=cost.bytes_accessed,
        bound_flops=cost.bound_flops,
        unstated_kernels=cost.unstated_kernels,
        op_terms=found.terms() if found else None,
        unstated_kernel_ops=found.unstated_kernels if found else (),
        compile_seconds=seconds,
    )


def _live_peak(analysis) -> int | None:
    """`peak_memory_in_bytes` where this JAX and backend report it (0 or absent: unknown)."""
    peak = getattr(analysis, "peak_memory_in_bytes", None)
    return int(peak) if peak else None


def failed(name: str, error: BaseException, seconds: float) -> ProgramMemory:
    """A compile failure as a report row; memory failures carry the amounts XLA printed."""
    text = str(error)
    # A kernel's tiles that overflow the core's on-chip memory (TPU "memory space vmem", as
    # MaxText's splash attention backward at the tpu7x recipe's block sizes) are a compile
    # failure of that kernel, not a program too large for the device's memory.
    on_chip = "memory space vmem" in text.lower()
    memory = ("RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()) and not on_chip
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
        error="; ".join(filter(None, (vmem_overflow_fix(text), first_line(error)))),
    )


def _amount(number: str, unit: str) -> int:
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    unit = unit.upper().removesuffix("IB").removesuffix("B").removesuffix("YTES")
    return int(float(number) * scale.get(unit, 1))


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    interesting = [line for line in lines if "memory" in line.lower() or "Used" in line]
    return (interesting or lines or [type(error).__name__])[0][:300]


def compile_plan(
    config: EngineConfig, mesh, engine: ModuleType | None = None
) -> list[tuple[str, Any, dict]]:
    """Lower every engine program: (name, lowered, compiler options) in the engine's order.

    `engine`: the engine's module (aot_engine_module); the built-in engine's when None. Each
    program is compiled with the options its engine compiles it with: the module's
    `compiler_options` where it has them (MaxText's), else, where it has `compile_reservations`
    (the built-in engine), told how much device memory the state beside it holds (`residency`).
    """
    engine = engine or aot_engine_module(BUILT_IN)
    table = beside_table(engine)
    lowered_programs = engine.lower_programs(config, mesh)
    unknown = [name for name in lowered_programs if name not in table]
    if unknown:  # refused before minutes of compiling, not after
        raise UserError(
            f"engine module {engine.__name__}: no BESIDE entry for program(s) "
            f"{', '.join(unknown)}: give the module a BESIDE table (program -> the "
            f"residency.STATE_PARTS in device memory beside it) so its peak can be counted"
        )
    options = program_options(config, mesh, engine)
    return [(name, lowered, options.get(name, {})) for name, lowered in lowered_programs.items()]


def planned_program(config: EngineConfig, mesh, name: str) -> tuple[Any, dict]:
    """One program of `compile_plan`, lowered, and its options; UserError naming the programs
    the engine compiles when `name` is none of them."""
    plan = {each: (lowered, options) for each, lowered, options in compile_plan(config, mesh)}
    if name not in plan:
        raise UserError(f"program {name!r}: the engine compiles {', '.join(plan)}")
    return plan[name]


def program_options(config: EngineConfig, mesh, engine: ModuleType) -> dict[str, dict]:
    """{program: the XLA options its engine compiles it with} (compile_plan)."""
    given = aot_optional(engine, "compiler_options")
    if callable(given):
        return dict(given(config, mesh))
    reserve = aot_optional(engine, "compile_reservations")
    reserved = reserve(config, mesh) if callable(reserve) else {}
    platform = platform_of(mesh)
    return {
        name: residency.compile_options(platform, reserved.get(name, 0))
        for name in beside_table(engine)
    }


def compile_one(
    name: str, lowered, options: dict, platform: str, rates: op_estimate.Rates | None = None
) -> tuple[Any, ProgramMemory]:
    """Compile one lowered program for `platform`: (compiled or None, its report row, with its
    op estimate at `rates` where given)."""
    start = time.perf_counter()
    try:
        compiled, block = compile_reading_block(lowered, options, platform)
    except Exception as error:  # XLA raises XlaRuntimeError/ValueError: keep the others going
        return None, failed(name, error, time.perf_counter() - start)
    return compiled, measure(compiled, name, time.perf_counter() - start, block, rates)


def device_rates(mesh) -> op_estimate.Rates | None:
    """The op estimate's rates for the mesh's devices, with the torus their chips' coordinates
    span (a TPU device carries its chip's `coords`); None for a chip the table lacks."""
    devices = list(mesh.devices.flat)
    chip = chip_for_device_kind(devices[0].device_kind)
    if chip is None:
        return None
    coords = [device.coords for device in devices if hasattr(device, "coords")]
    torus = (
        tuple(max(c[axis] for c in coords) + 1 for axis in range(len(coords[0]))) if coords else ()
    )
    return op_estimate.Rates.of_chip(chip, torus)


def compile_programs(
    config: EngineConfig, mesh, engine: ModuleType | None = None
) -> Iterator[tuple[str, Any, ProgramMemory]]:
    """Lower every engine program, then compile each on its own, one after the other:
    (name, compiled or None, row).

    One at a time because libtpu's code generation already keeps the cores busy: the production
    cell's programs compiled at once on 2 cores were no faster than one after the other, and took
    a third more host memory (benchmarks/reports/aot-compile-time_tpu7x-v5p_2026-12-02.md).
    """
    platform, rates = platform_of(mesh), device_rates(mesh)
    for name, lowered, options in compile_plan(config, mesh, engine):
        compiled, row = compile_one(name, lowered, options, platform, rates)
        yield name, compiled, row
