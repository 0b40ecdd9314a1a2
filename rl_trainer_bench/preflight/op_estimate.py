"""A compiled program's time from its ops: each op at its own roofline, collectives over the
interconnect less what the schedule hides, summed along the schedule. An ESTIMATE, not a bound.

Why: the program roofline (`program_cost`), max(all FLOPs / peak, all bytes / bandwidth), takes
XLA's whole-program byte count scaled by the loops' trips, which counts traffic that stays on chip
and lets one op's FLOPs hide another op's bytes; on the one-chip v5e cell it drifted from 2.8%
short of the chip to 22.7% over, and got half of the measured program changes' signs wrong
(benchmarks/reports/aot-step-estimate_v5e-tpu7x_2026-12-07.md). A TensorCore runs a program's ops
one after another, so here each op gets its own time and the times add:

- an XLA op (a fusion, a matmul, a copy): max(the work its matmuls give the matrix unit / peak
  FLOP/s, the bytes it reads from and writes to HBM / HBM bandwidth), as
  `program_cost.instruction_costs` counts them (a loop body's ops as often as the loop runs, slices
  counted by what they read, a gathered operand by the words its rows lie in, on-chip buffers not
  at all); a matmul's work is its FLOPs times its bfloat16 passes (a float32 one at HIGH or
  HIGHEST precision takes 3 or 6) with its dimensions padded to the unit's side (`hlo.mxu`);
- a Pallas kernel: max(stated FLOPs / peak, stated bytes / bandwidth) from the `pl.CostEstimate`
  its custom call carries; splash attention's kernels, which state nothing, by the FLOPs of their
  causal blocks (`hlo.splash`) and their operands' and results' bytes; any other kernel that
  states nothing by its bytes alone, and named; splash attention's kernels also get their vector
  work (`hlo.splash`): the ops each score takes between its two matmuls, one vector register of
  32-bit values a cycle, at the clock the peak gives the chip's matrix units (peak / (units x
  side^2 x 2)); a block's softmax needs its q k^T and feeds its p v, so that time adds to the
  kernel's roofline instead of hiding under it (the `kernel_vector` term);
- a collective: the bytes it moves per device over one torus axis's links, (n - 1) / n of its
  buffer for a group of n (twice for an all-reduce), at the device's share of the chip's ICI
  bandwidth for that axis; an asynchronous one less the time of the ops the schedule puts between
  its start and its done (`hlo.overlap`), never below zero; a synchronous one in full.

The rates are the chip table's (`accelerators`), each named with its source. Nothing is fitted to a
measured step; where the estimate misses the chip, `benchmarks/aot/step_estimate_check.py` says
which ops' functions carry the difference.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from rl_trainer_bench.chips.accelerators import Chip
from rl_trainer_bench.preflight.hlo.counts import unstated_kernel
from rl_trainer_bench.preflight.hlo.overlap import analyze, scheduled_between
from rl_trainer_bench.preflight.hlo.parse import HloModule, Instruction
from rl_trainer_bench.preflight.hlo.report import Collective
from rl_trainer_bench.preflight.hlo.splash import splash_flops, splash_vector_ops
from rl_trainer_bench.preflight.program_cost import instruction_costs

BY = (
    "rl-trainer-bench op estimate: each op at max(FLOPs / peak, HBM bytes / bandwidth), Pallas"
    " kernels at their stated cost, collectives over ICI less what the schedule hides, summed"
)
# A kernel's stated HBM traffic, beside its FLOPs, in its custom call's backend config.
_KERNEL_BYTES = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"')
# Bytes moved per byte of buffer, for a group of n devices on a ring (an all-reduce is a
# reduce-scatter then an all-gather); a point-to-point op moves its buffer once.
_RING_PASSES = {"all-reduce": 2.0}
_POINT_TO_POINT = frozenset({"collective-permute", "collective-broadcast", "send", "recv"})


@dataclasses.dataclass(frozen=True)
class Rates:
    """One device's compute and HBM rates, its chip's ICI rate, and where each comes from."""

    peak_flops: float
    hbm_bytes_per_second: float
    # A chip's ICI rate one way over the links of one torus axis; 0: unknown
    ici_bytes_per_second: float
    source: str
    devices_per_chip: int = 1
    torus: tuple[int, ...] = ()  # the slice's chips along each torus axis; (): one axis assumed
    mxu_size: int = 0  # the side of the chip's matrix unit, matmuls padded to it; 0: unknown
    # 32-bit values the vector unit works a second (one register an op a cycle); 0: unknown
    vector_values_per_second: float = 0.0

    @classmethod
    def of_chip(cls, chip: Chip, torus: tuple[int, ...] = ()) -> Rates | None:
        """A device's share of the chip's compute and HBM rates; None without them. A chip's
        links along one axis of a D-dimensional torus are a 1 / D share of its links, each way
        half: a 1 / (2 D) share of the bidirectional figure the spec sheet gives."""
        if not chip.peak_bf16_flops or not chip.hbm_bytes_per_second:
            return None
        axis_share = 1 / (2 * chip.topology_dims) if chip.topology_dims else 0.0
        source = f"{chip.name}: peak {chip.peak_source}; HBM and ICI {chip.ici_source or 'spec'}"
        if chip.mxu_size:
            source += f"; MXU {chip.mxu_size} x {chip.mxu_size}, {chip.mxu_source}"
        vector = 0.0
        if chip.mxu_size and chip.mxu_count and chip.vector_register_values:
            clock = chip.peak_bf16_flops / (chip.mxu_count * chip.mxu_size**2 * 2)
            vector = chip.per_device(clock * chip.vector_register_values)
            source += f"; vector unit {chip.vector_register_values} values a cycle at"
            source += f" {clock / 1e9:.3f} GHz, {chip.vector_source}"
        return cls(
            chip.per_device(chip.peak_bf16_flops),
            chip.per_device(chip.hbm_bytes_per_second),
            chip.ici_bytes_per_second * axis_share,
            source,
            chip.devices_per_chip,
            tuple(torus),
            chip.mxu_size,
            vector,
        )


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One op's estimate: per execution, and how often the program runs it."""

    name: str
    opcode: str
    times: int
    flops: float  # the matrix unit's work: matmul FLOPs times passes, padded (`hlo.mxu`)
    bytes: float
    seconds: float  # per execution
    term: str  # "compute", "memory", "kernel" or "collective"
    vector_seconds: float = 0.0  # of `seconds`, a kernel's vector work beside its roofline

    @property
    def total(self) -> float:
        return self.seconds * self.times


@dataclasses.dataclass(frozen=True)
class ProgramEstimate:
    """A program's estimated time as the sum of its terms (seconds per execution)."""

    compute_seconds: float  # XLA ops whose FLOPs bound them
    memory_seconds: float  # XLA ops whose HBM bytes bound them
    kernel_seconds: float  # Pallas kernels at their stated cost
    kernel_vector_seconds: float  # splash attention's vector work, after its matmuls' roofline
    collective_seconds: float  # every collective's own time
    exposed_collective_seconds: float  # of that, what no op scheduled beside it hides
    unstated_kernels: tuple[str, ...]  # kernels with no cost stated or counted: bytes only
    ops: tuple[OpTime, ...]

    @property
    def seconds(self) -> float:
        return (
            self.compute_seconds
            + self.memory_seconds
            + self.kernel_seconds
            + self.kernel_vector_seconds
            + self.exposed_collective_seconds
        )

    def terms(self) -> dict[str, float]:
        return {
            "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "kernel_seconds": self.kernel_seconds,
            "kernel_vector_seconds": self.kernel_vector_seconds,
            "collective_seconds": self.collective_seconds,
            "exposed_collective_seconds": self.exposed_collective_seconds,
            "seconds": self.seconds,
        }


def estimate(
    module: HloModule, rates: Rates, mesh: Mapping[str, int] | None = None
) -> ProgramEstimate:
    """The program's estimate (per device, per execution) from its compiled HLO."""
    collectives = analyze(module, mesh).collectives
    collective_ops = _collective_instructions(module, collectives)
    by_name = {i.name: i for c in module.computations.values() for i in c.instructions}
    ops: dict[str, OpTime] = {}
    unstated: dict[str, None] = {}
    totals = {"compute": 0.0, "memory": 0.0, "kernel": 0.0, "kernel_vector": 0.0}
    for cost in instruction_costs(module, stored=True, mxu=rates.mxu_size):
        instruction = cost.instruction
        if instruction.name in collective_ops or not (cost.flops or cost.bytes):
            continue
        flops, counted, vector = cost.flops, None, 0.0
        if (kernel := unstated_kernel(instruction)) is not None:
            operands = [by_name.get(o) for o in instruction.operands]
            counted = splash_flops(instruction, operands)
            if counted is None:
                unstated[kernel] = None
            elif rates.vector_values_per_second:
                vector = splash_vector_ops(instruction, operands) / rates.vector_values_per_second
        op = _op_time(instruction, cost.times, counted or flops, cost.bytes, rates, counted)
        if vector:
            op = dataclasses.replace(op, seconds=op.seconds + vector, vector_seconds=vector)
        ops[instruction.name] = op
        totals[op.term] += (op.seconds - vector) * op.times
        totals["kernel_vector"] += vector * op.times
    collective_total, exposed = _collective_times(module, collectives, ops, rates)
    return ProgramEstimate(
        compute_seconds=totals["compute"],
        memory_seconds=totals["memory"],
        kernel_seconds=totals["kernel"],
        kernel_vector_seconds=totals["kernel_vector"],
        collective_seconds=collective_total,
        exposed_collective_seconds=exposed,
        unstated_kernels=tuple(unstated),
        ops=tuple(ops.values()),
    )


def _op_time(
    instruction: Instruction,
    times: int,
    flops: float,
    traffic: float,
    rates: Rates,
    counted: float | None = None,
) -> OpTime:
    """One op's roofline: a Pallas kernel's from its stated FLOPs and bytes where it states
    bytes, or from the FLOPs `counted` for it (splash attention) and its bytes; any other op's
    from the walk's matrix-unit work and HBM bytes."""
    term = "kernel" if counted is not None else "memory"
    stated = (
        _KERNEL_BYTES.search(instruction.attributes)
        if instruction.opcode == "custom-call"
        else None
    )
    if stated is not None:
        traffic, term = float(stated.group(1)), "kernel"
    compute, memory = flops / rates.peak_flops, traffic / rates.hbm_bytes_per_second
    if term == "memory" and compute > memory:
        term = "compute"
    return OpTime(
        instruction.name, instruction.opcode, times, flops, traffic, max(compute, memory), term
    )


def _collective_instructions(module: HloModule, collectives: list[Collective]) -> set[str]:
    """The names of the instructions that run collectives (starts, their updates and dones, and
    synchronous ones): their time is the collective term's, not an HBM roofline."""
    starts = {c.name.split("/")[0] for c in collectives}
    names = set(starts)
    for computation in module.computations.values():
        for instruction in computation.instructions:
            if (
                instruction.operands[:1]
                and instruction.operands[0] in names
                and (instruction.opcode.endswith("-done") or instruction.opcode.endswith("-update"))
            ):
                names.add(instruction.name)
    return names


def collective_seconds(collective: Collective, rates: Rates) -> float:
    """One execution of a collective over ICI; 0 where the chip's ICI rate is unknown.

    A group of n devices spans n / devices-per-chip chips (a chip's devices taken together, as a
    mesh's minor axis places them): (chips - 1) / chips of each device's buffer crosses ICI per
    pass on a ring (two passes for an all-reduce; a permute moves its buffer once), and the
    chip's devices in the group share its links. A group on one chip moves nothing over ICI (its
    dies' own link is not modelled). The links are those of the torus axes the group spans, the
    fewest whose chips hold it (one axis where the slice's torus is not given).
    """
    if not rates.ici_bytes_per_second:
        return 0.0
    n = max(collective.group_size, 1)
    per_chip = min(rates.devices_per_chip, n)
    chips = -(-n // per_chip)
    if collective.kind in _POINT_TO_POINT:
        moved = float(collective.bytes) if chips > 1 else 0.0
    else:
        passes = _RING_PASSES.get(collective.kind, 1.0)
        moved = passes * (chips - 1) / chips * collective.bytes
    axes, held = 0, 1
    for size in sorted(rates.torus, reverse=True):
        if held >= chips:
            break
        axes, held = axes + 1, held * size
    return moved * per_chip / (rates.ici_bytes_per_second * max(axes, 1))


def _collective_times(
    module: HloModule,
    collectives: list[Collective],
    ops: Mapping[str, OpTime],
    rates: Rates,
) -> tuple[float, float]:
    """(every collective's time, the part no op hides), per program execution. Collectives that
    share a window (an async wrapper running several) run one after another in it."""
    windows: dict[tuple[str, str], list[Collective]] = {}
    for collective in collectives:
        windows.setdefault((collective.computation, collective.name.split("/")[0]), []).append(
            collective
        )
    total = exposed = 0.0
    for (computation, start), members in windows.items():
        executions = members[0].executions
        own = sum(collective_seconds(c, rates) * c.executions for c in members) / executions
        hidden = 0.0
        if all(c.is_async for c in members):
            body = module.computations[computation]
            start_instruction = body.by_name()[start]
            hidden = sum(
                ops[i.name].seconds
                for i in scheduled_between(start_instruction, body)
                if i.name in ops
            )
        total += own * executions
        exposed += max(own - hidden, 0.0) * executions
    return total, exposed
