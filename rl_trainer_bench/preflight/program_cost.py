"""What one compiled program costs by XLA's count, with its loops counted, and a roofline time.

XLA's cost analysis (`compiled.cost_analysis()`) gives per-device FLOPs and bytes accessed, and on
TPU a time estimate (`optimal_seconds`). It counts each while-loop body once, whatever its trip
count: on `cpu-tiny` compiled for v5e:2x2, `fwd_bwd`'s FLOPs are 1.348e8 at 2 layers and 1.349e8 at
4 (the layers run in a loop), and its `optimal_seconds` is -1 (no estimate) as soon as a loop is
present. The engine's layers, attention chunks and log-prob chunks all run in loops, so the raw
figures undercount the production cell by about its depth.

The correction here reads the compiled HLO: each control-flow computation's matmul FLOPs and
main-memory bytes (operands and result of every instruction; `_ByteCounter`), once as XLA counts
them and once multiplied by how often it runs (trip counts nested; `hlo_counts.trip_count` reads them also
from TPU text, which drops XLA's own record). XLA's figures are scaled by the ratio. The ratio is
taken from the same program so that what XLA counts and this walk does not (elementwise FLOPs, TPU
tile padding of small arrays) cancels, under the assumption that it is spread like the counted part.
On cpu-tiny the corrected FLOPs at 1, 2 and 4 layers lie on one line (the 1-layer program has no
loop, so it is XLA's own figure): see tests/preflight/test_program_cost.py and
benchmarks/reports/aot-time-estimate_tpu_2026-12-01.md.

The time is a roofline: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per device. It is an
estimate, not a bound: it leaves out collectives that compute does not hide and any kernel below
peak, which would make it low, but the walk reads a loop body's operands once per trip, which
counts traffic that stays in on-chip memory and can make it high (2x the public measured fwd_bwd on
the 397B cell). Its compute term alone, FLOPs / peak, is a lower bound. Where XLA gives
`optimal_seconds` too, both are kept so the reader can compare (on cpu-tiny for v5e:2x2 the
roofline is 0.90x XLA's figure for every loop-free program).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

from rl_trainer_bench.preflight.hlo.counts import FlopCounter, execution_counts, unstated_kernel
from rl_trainer_bench.preflight.hlo.parse import Array, HloModule, Instruction, parse_hlo

# Instructions that neither compute nor move bytes of their own; control flow is counted through
# the computations it runs.
_NO_TRAFFIC = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "while",
        "call",
        "conditional",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
    }
)


_SLICES = frozenset({"slice", "dynamic-slice"})
_LAYOUT = frozenset({"bitcast", "copy", "transpose", "reshape", "convert"})  # same elements
_UPDATE_SLICE = "dynamic-update-slice"
_ASYNC_SLICE = "slice-start"  # ((operand), slice, context): the slice lands in its own buffer
_ASYNC_COPY = "copy-start"  # (destination, source, context)


@dataclasses.dataclass(frozen=True)
class LoopCounts:
    """Matmul FLOPs and bytes of a program's control-flow computations: once each, and as run."""

    flops_once: float
    flops_run: float
    bytes_once: float
    bytes_run: float
    # The part of the FLOPs that TPU kernels state for themselves (`pl.CostEstimate`)
    kernel_once: float = 0.0
    kernel_run: float = 0.0
    # TPU kernels that state no FLOPs (`hlo.counts.unstated_kernel`), by name, in program order
    unstated_kernels: tuple[str, ...] = ()

    @property
    def flops_factor(self) -> float:
        return self.flops_run / self.flops_once if self.flops_once else 1.0

    @property
    def unstated_factor(self) -> float:
        """The loop ratio of the FLOPs that no kernel states (XLA's own ops)."""
        once = self.flops_once - self.kernel_once
        return (self.flops_run - self.kernel_run) / once if once > 0 else 1.0

    @property
    def bytes_factor(self) -> float:
        return self.bytes_run / self.bytes_once if self.bytes_once else 1.0


@dataclasses.dataclass(frozen=True)
class InstructionCost:
    """One instruction of a control-flow computation: its matmul FLOPs and bytes per execution,
    and how many times the program runs it."""

    instruction: Instruction
    times: int
    flops: float
    bytes: int
    kernel_flops: float = 0.0  # of `flops`, what TPU kernels state for themselves


def instruction_costs(
    module: HloModule, stored: bool = False, mxu: int | None = None
) -> Iterator[InstructionCost]:
    """Every instruction of every computation reached through control flow, with its cost (a
    loop's body is a computation of its own here, so a `while` counts nothing itself); with
    `stored`, bytes as the arrays lie in their layouts' tiles (`Array.stored_bytes`), and a
    gathered operand by the words its rows lie in; with `mxu`, `flops` as the work a matrix unit
    of that side does (`FlopCounter`)."""
    flop_counter = FlopCounter(module, mxu=mxu)
    unstated_counter = FlopCounter(module, kernels=False, mxu=mxu)
    byte_counter = _ByteCounter(module, stored)
    for name, times in execution_counts(module).items():
        computation = module.computations[name]
        by_name = computation.by_name()
        for instruction in computation.instructions:
            flops = unstated = 0.0
            if instruction.opcode != "while":
                flops = flop_counter.of_instruction(instruction, by_name)
                unstated = unstated_counter.of_instruction(instruction, by_name)
            traffic = byte_counter.of(instruction, by_name)
            yield InstructionCost(instruction, times, flops, traffic, flops - unstated)


def loop_counts(module: HloModule) -> LoopCounts:
    """Walk every computation reached through control flow: its own cost, once and times run."""
    totals = [0.0] * 6
    unstated: dict[str, None] = {}
    for cost in instruction_costs(module):
        values = (cost.flops, cost.bytes, cost.kernel_flops)
        for index, value in enumerate(values):
            totals[2 * index] += value
            totals[2 * index + 1] += value * cost.times
        if (kernel := unstated_kernel(cost.instruction)) is not None:
            unstated[kernel] = None
    once, run, bytes_once, bytes_run, kernel_once, kernel_run = totals
    return LoopCounts(once, run, bytes_once, bytes_run, kernel_once, kernel_run, tuple(unstated))


class _ByteCounter:
    """Bytes an instruction reads from and writes to the device's main memory (a TPU's HBM), as
    XLA's cost analysis counts them for slices.

    In a TPU program (its layouts tiled) only arrays in memory space 0 count: XLA places buffers
    in the core's VMEM (`S(1)` in their layout), prefetches into it with `copy-start` and slices
    into it with `slice-start`, and an op reading or writing such a buffer moves no HBM bytes for
    it; on the one-chip v5e cell's fwd_bwd a third of the bytes the walk counted before were of
    that kind. A prefetch moves its source once, an eviction its destination. Elsewhere every
    array counts: a GPU's memory space 1 holds collective buffers in its HBM.

    A (dynamic-)slice reads only its result's bytes of its operand, and a dynamic-update-slice
    writes only its update in place; the same holds for an asynchronous slice (`slice-start`),
    for fusion parameters that are only sliced (also through a fusion nested in the fusion) and
    for a fusion whose root, or an element of whose tuple root, updates a parameter in place
    (also behind a bitcast). Without this, a loop body that slices one layer's weights out of the
    stacked [L, ...] array, or a scan that writes its step's output into the stacked result,
    would count the whole stack per trip.
    """

    def __init__(self, module: HloModule, stored: bool = False) -> None:
        self._module = module
        self._stored = stored
        self._on_chip_spaces = any(
            array.tiled
            for computation in module.computations.values()
            for instruction in computation.instructions
            for array in instruction.arrays
        )

    def _main(self, *arrays: Array) -> int:
        """The bytes of `arrays` in the device's main memory."""
        return sum(self._size(a) for a in arrays if not (self._on_chip_spaces and a.memory_space))

    def _size(self, *arrays: Array) -> int:
        """The bytes of `arrays`, laid out in their tiles where the counter counts so."""
        return sum(a.stored_bytes if self._stored else a.bytes for a in arrays)

    def of(self, instruction: Instruction, by_name: Mapping[str, Instruction]) -> int:
        opcode = instruction.opcode
        if opcode in _NO_TRAFFIC or opcode.endswith("-done"):
            return 0  # an asynchronous op's bytes move at its start; its done hands the buffer on
        operands = [by_name.get(o) for o in instruction.operands]
        sizes = [self._main(*o.arrays) if o is not None else 0 for o in operands]
        written = self._main(*instruction.arrays)
        if opcode in _SLICES and sizes:
            sizes[0] = min(sizes[0], self._size(*instruction.arrays))
        elif opcode == _ASYNC_SLICE and sizes and len(instruction.arrays) > len(operands):
            sliced = instruction.arrays[len(operands)]  # after the tuple of its operands
            sizes[0], written = min(sizes[0], self._size(sliced)), self._main(sliced)
        elif opcode == _UPDATE_SLICE and len(sizes) > 1:
            sizes[0], written = 0, sizes[1] if written else 0
        elif opcode == "fusion":
            sizes, written = self._fusion(instruction, sizes, written)
        elif opcode == _ASYNC_COPY and instruction.arrays:
            written = self._main(instruction.arrays[0])  # (destination, source, context)
        elif opcode.endswith("-start"):
            written = sum(sizes)  # its tuple result aliases its operands; it moves them once
        return written + sum(sizes)

    def _body(self, fusion: Instruction):
        called = fusion.called_computations()
        return self._module.computations.get(called[0]) if called else None

    def _fusion(self, fusion: Instruction, sizes: list[int], written: int) -> tuple[list[int], int]:
        body = self._body(fusion)
        if body is None:
            return sizes, written
        parameters = {int(i.literal): i.name for i in body.instructions if i.opcode == "parameter"}
        sizes = list(sizes)
        for index, name in parameters.items():
            read = self._sliced_read(body, name)
            if index < len(sizes) and read is not None:
                sizes[index] = read if sizes[index] else 0  # an on-chip operand: nothing
        by_name = body.by_name()
        for target, update in self._in_place_updates(body, by_name):
            index = int(target.literal)
            if index < len(sizes) and sizes[index]:  # a buffer in main memory, updated in place
                sizes[index] = 0
                written = max(written + self._size(*update.arrays) - self._size(*target.arrays), 0)
        return sizes, written

    def _sliced_read(self, body, name: str) -> int | None:
        """The bytes of `name` (a parameter of `body`, or a value made from one) that are read,
        when only slices read it, directly, through layout changes (a bitcast, copy, transpose,
        or a fusion of only those, which XLA computes only where the slice reads) or through
        nested fusions; None when some instruction reads all of it."""
        uses = [i for i in body.instructions if name in i.operands]
        if not uses:
            return None
        read = 0
        for use in uses:
            if use.opcode in _SLICES and use.operands[0] == name:
                part = self._size(*use.arrays)
            elif self._stored and use.opcode == "gather" and use.operands[0] == name:
                part = _gathered_words(use, body.by_name().get(name))
            elif use.opcode in _LAYOUT or (use.opcode == "fusion" and self._layout_only(use)):
                part = self._sliced_read(body, use.name)
            elif use.opcode == "fusion" and use.operands.count(name) == 1:
                part = self._nested_read(use, use.operands.index(name))
            else:
                part = None
            if part is None:
                return None
            read += part
        return read

    def _nested_read(self, fusion: Instruction, index: int) -> int | None:
        nested = self._body(fusion)
        inner = (
            None
            if nested is None
            else next(
                (
                    i.name
                    for i in nested.instructions
                    if i.opcode == "parameter" and i.literal == str(index)
                ),
                None,
            )
        )
        return None if inner is None else self._sliced_read(nested, inner)

    def _layout_only(self, fusion: Instruction) -> bool:
        body = self._body(fusion)
        return (
            body is not None
            and len(fusion.operands) == 1
            and all(i.opcode in _LAYOUT or i.opcode == "parameter" for i in body.instructions)
        )

    @staticmethod
    def _in_place_updates(body, by_name: Mapping[str, Instruction]):
        """(parameter, update) of each dynamic-update-slice of a parameter that the root returns
        (itself, as a tuple element, or behind a bitcast)."""
        root = body.instructions[-1] if body.instructions else None
        if root is None:
            return []
        outputs = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
        found = []
        for output in outputs:
            while output is not None and output.opcode == "bitcast" and output.operands:
                output = by_name.get(output.operands[0])
            if output is None or output.opcode != _UPDATE_SLICE or len(output.operands) < 2:
                continue
            target, update = by_name.get(output.operands[0]), by_name.get(output.operands[1])
            # The buffer may reach the update through an op that writes its operand in place.
            while target is not None and target.opcode != "parameter" and _aliases_operand(target):
                target = by_name.get(target.operands[0])
            if target is not None and target.opcode == "parameter" and update is not None:
                found.append((target, update))
        return found


# A TPU word: arrays of narrower elements pack 32 // bits rows into each (bf16's `(2,1)` tile).
_WORD_BITS = 32


def _gathered_words(gather: Instruction, source: Instruction | None) -> int | None:
    """The bytes a gather reads of its tiled source: each slice it gathers as the words it lies
    in, its minor dimension padded to the tile's lanes and its rows to the rows a word packs (a
    gathered row of bf16 shares each 32-bit word with its neighbour, so it reads both); None
    where the slice sizes or the source's layout are unknown."""
    sizes = [int(d) for d in (gather.attribute("slice_sizes") or "").strip("{}").split(",") if d]
    array = source.arrays[0] if source is not None and source.arrays else None
    if (
        array is None
        or not array.tile
        or not len(sizes) == len(array.dims) == len(array.minor_to_major)
        or not gather.arrays
    ):
        return None
    bits = array.element_bits
    slices = gather.arrays[0].elements // max(math.prod(sizes), 1)
    order = array.minor_to_major
    sizes[order[0]] = -(-sizes[order[0]] // array.tile[-1]) * array.tile[-1]
    if len(order) > 1 and bits < _WORD_BITS:
        rows = _WORD_BITS // bits
        sizes[order[1]] = -(-sizes[order[1]] // rows) * rows
    return slices * math.prod(sizes) * bits // 8


def _aliases_operand(instruction: Instruction) -> bool:
    """A bitcast, or an op whose output is its first operand's buffer (XLA's
    `output_to_operand_aliasing={{}: (0, {})}`): nothing moves."""
    aliasing = instruction.attribute("output_to_operand_aliasing") or ""
    return bool(instruction.operands) and (
        instruction.opcode == "bitcast" or aliasing.replace(" ", "").startswith("{{}:(0,{})")
    )


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """XLA's cost analysis of one program (per device) and the same with loops counted."""

    xla_flops: float
    xla_bytes_accessed: float
    xla_optimal_seconds: float | None  # XLA's own time estimate; None where it gives none
    flops: float  # loop bodies counted per trip
    bytes_accessed: float
    # `flops` less what TPU kernels state for themselves: a kernel's statement may count more
    # than it runs (the grouped matmul states 2 m k n for all m rows it is given, and runs the
    # rows of its groups), so a lower bound counts XLA's own ops only
    bound_flops: float = 0.0
    # TPU kernels whose work neither `flops` nor `bound_flops` counts: they state no FLOPs
    unstated_kernels: tuple[str, ...] = ()


def roofline_seconds(
    flops: float, bytes_accessed: float, peak_flops: float, bytes_per_second: float
) -> float:
    """A program's roofline time on one device of that peak and bandwidth (an estimate)."""
    return max(flops / peak_flops, bytes_accessed / bytes_per_second)


def cost_from(analysis: Mapping[str, float] | None, counts: LoopCounts) -> ProgramCost:
    """The cost from XLA's analysis dictionary and the HLO walk's loop counts."""
    analysis = analysis or {}
    flops = float(analysis.get("flops", 0.0))
    traffic = float(analysis.get("bytes accessed", 0.0))
    optimal = analysis.get("optimal_seconds")
    return ProgramCost(
        xla_flops=flops,
        xla_bytes_accessed=traffic,
        # Negative means none (-1 with a loop present, -4 for a Pallas kernel, on libtpu 0.0.42).
        xla_optimal_seconds=float(optimal) if optimal is not None and optimal > 0 else None,
        flops=flops * counts.flops_factor,
        bytes_accessed=traffic * counts.bytes_factor,
        bound_flops=max(flops - counts.kernel_once, 0.0) * counts.unstated_factor,
        unstated_kernels=counts.unstated_kernels,
    )


def xla_analysis(compiled) -> Mapping[str, float] | None:
    """XLA's cost analysis dictionary of a compiled JAX program (`jax.stages.Compiled`)."""
    analysis = compiled.cost_analysis()
    return analysis[0] if isinstance(analysis, list) else analysis


def cost_of(compiled) -> ProgramCost:
    """The cost of a compiled JAX program (`jax.stages.Compiled`)."""
    return cost_from(
        xla_analysis(compiled), loop_counts(parse_hlo(compiled.as_text(), "compiled program"))
    )
