"""What XLA did with the collectives: which are asynchronous, what compute hides them, how many bytes.

A collective costs step time only when nothing runs beside it. After scheduling, each computation's
text order is its execution order, so an asynchronous collective (an `all-gather-start`/`-done` pair,
or an `async-start`/`async-done` wrapper around e.g. a reduce-scatter) can hide behind exactly the
instructions scheduled between its start and its done; a synchronous one hides behind nothing. A
wrapper's computation may hold several collectives (XLA's collective groups, JAX's `call-start`
around a computation) behind a tuple, calls, nested wrappers or loops: each counts once per run,
in the wrapper's window. This
module lists every collective with its bytes (from the shapes), its replica groups mapped back to
the mesh axes, and the instructions and matmul FLOPs between start and done, then sums per kind:
bytes that move, and how much of that has compute beside it. It reads CPU, GPU and TPU HLO text
alike; collectives in a loop body count once per known trip, and those in a fusion's computation
(TPU programs fuse collectives with compute) once per run of the fusion, exposed, since XLA does
not schedule the inside of a fusion. A file of several modules gets one
report per module (`hlo.text`); an async collective XLA made synchronous (a converted op, or a GPU
pair whose backend config says `is_sync`) counts as exposed. The report's rows and their text form
are `hlo.report`, the groups' mesh axes `hlo.replica_groups`, the command
`hlo.command`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo.counts import (
    FlopCounter,
    control_flow_runs,
    execution_counts,
)
from rl_trainer_bench.preflight.hlo.parse import (
    Array,
    Computation,
    HloModule,
    Instruction,
    parse_hlo,
)
from rl_trainer_bench.preflight.hlo.replica_groups import groups_and_axes
from rl_trainer_bench.preflight.hlo.report import (
    Collective,
    OverlapReport,
    summarize,
)
from rl_trainer_bench.preflight.hlo.text import read_modules

KINDS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
    "send",
    "recv",
)
# Point-to-point transfers (a pipeline's stages, XLA's pipelined collective-permutes on GPU): each
# opens an async pair its `-done` closes, though neither carries `-start` in its name.
_POINT_TO_POINT = frozenset({"send", "recv"})
# Instructions that move no data and compute nothing: scheduled between a start and its done they
# hide nothing (nor do other async steps, `*-start`/`*-update`/`*-done`, see `_is_compute`).
_BOOKKEEPING = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "partition-id",
        "replica-id",
        "after-all",
        "opt-barrier",
    }
)


# ----------------------------------------------------------------------------------------------
# Finding collectives
# ----------------------------------------------------------------------------------------------


def analyze(
    module: HloModule, mesh: Mapping[str, int] | None = None, name: str = ""
) -> OverlapReport:
    """Every collective of `module` with its overlap, and the per-kind summary.

    A mesh whose device count differs from the module's (partitions x replicas, when its header
    records them) would map groups to the wrong axes: UserError.
    """
    mesh = dict(mesh or {})
    devices = module.device_count
    if mesh and devices is not None and math.prod(mesh.values()) != devices:
        given = ",".join(f"{n}={v}" for n, v in mesh.items())
        raise UserError(
            f"--mesh {given} has {math.prod(mesh.values())} devices, but module {module.name} was "
            f"compiled for {devices} (num_partitions x replica_count); pass the mesh it was "
            "compiled for"
        )
    executions = execution_counts(module, enters=_is_fusion)
    program = _Program(module, mesh, FlopCounter(module), _fusions_by_computation(module))
    collectives: list[Collective] = []
    for computation in module.computations.values():
        if computation.name not in executions:
            continue  # reducers, and computations an async wrapper runs (reported at its start)
        collectives += _collectives_of(computation, program, executions[computation.name])
    collectives.sort(key=lambda c: c.line)
    kinds = [
        summarize(kind, [c for c in collectives if c.kind == kind])
        for kind in KINDS
        if any(c.kind == kind for c in collectives)
    ]
    return OverlapReport(
        program=name or module.name,
        scheduled=module.is_scheduled,
        num_partitions=module.num_partitions,
        mesh=mesh,
        collectives=collectives,
        kinds=kinds,
        total=summarize("total", collectives),
        partitions_recorded=devices is not None,
    )


def analyze_text(
    text: str, source: str, mesh: Mapping[str, int] | None = None, program: str = ""
) -> OverlapReport:
    """`analyze` of one module's text (see `analyze_file` for a file that may hold several)."""
    return analyze(parse_hlo(text, source), mesh, program)


def analyze_file(
    data: bytes, source: str, mesh: Mapping[str, int] | None = None, program: str = ""
) -> list[OverlapReport]:
    """One report per module of an HLO file (text or gzipped); every module is read before any
    report is made, so a file whose third module is broken reports nothing."""
    read = read_modules(data, source)
    reports = []
    for part in read:
        name = program if len(read) == 1 else f"{program}:{part.module.name or 'module'}"
        report = analyze(part.module, mesh, name)
        reports.append(dataclasses.replace(report, canonical_lines=part.canonical))
    return reports


@dataclasses.dataclass(frozen=True)
class _Program:
    """What every row of one module's report reads: the module, the mesh, the FLOP counter and
    which fusion instructions run each fused computation."""

    module: HloModule
    mesh: Mapping[str, int]
    flops: FlopCounter
    fusions: Mapping[str, str]


def _is_fusion(instruction: Instruction) -> bool:
    """A fusion of any kind (kLoop, kInput, kOutput, kCustom): its computation runs where the
    fusion is scheduled, and TPU programs fuse collectives with compute there."""
    return instruction.opcode == "fusion"


def _fusions_by_computation(module: HloModule) -> dict[str, str]:
    """Each fused computation's fusion instructions, by name (joined with "," when several)."""
    callers: dict[str, list[str]] = {}
    for computation in module.computations.values():
        for instruction in filter(_is_fusion, computation.instructions):
            for called in instruction.called_computations():
                callers.setdefault(called, []).append(instruction.name)
    return {called: ",".join(names) for called, names in callers.items()}


def _collectives_of(
    computation: Computation, program: _Program, executions: int
) -> list[Collective]:
    """The collectives `computation` runs: its own, and those inside the computations its async
    wrappers run, each with the window between its start and its done. XLA's schedule orders the
    computations that call fusions, not a fusion's own computation (its canonical printing
    reorders one), so there no window is read: a collective in a fusion hides behind nothing the
    HLO shows."""
    scheduled = computation.name not in program.fusions
    by_name = computation.by_name()
    order = {instruction.name: index for index, instruction in enumerate(computation.instructions)}
    found: list[Collective] = []
    for instruction in computation.instructions:
        kind, pair = _own_kind(instruction)
        if kind is None and not _wraps_computations(instruction):
            continue
        # a start no done closes (a collective fusion's kernel) runs as one op: synchronous
        pair = pair and _done_of(instruction, computation) is not None
        windowed = scheduled and (pair or kind is None)
        between = scheduled_between(instruction, computation, order) if windowed else []
        compute = [i for i in between if _is_compute(i)]
        window = _Window(
            start=instruction,
            computation=computation.name,
            between_instructions=len(between),
            between_compute=len(compute),
            between_flops=sum(program.flops.of_instruction(i, by_name) for i in compute),
        )
        if kind is not None:
            located = [_Located(instruction, computation, kind, 1)]
            form = "async pair" if pair else "sync"
        else:
            located = _wrapped_collectives(instruction, program.module)
            form = "async wrapper"
        shared = len(located) > 1
        found += [_collective(window, one, form, program, executions, shared) for one in located]
    return found


@dataclasses.dataclass(frozen=True)
class _Window:
    """An instruction that starts collectives, where it is, and what is scheduled before its done."""

    start: Instruction
    computation: str
    between_instructions: int
    between_compute: int
    between_flops: float


@dataclasses.dataclass(frozen=True)
class _Located:
    """A collective (or a collective's start) in the computation holding it, and how many times it
    runs each time its window's start runs (loops inside an async wrapper multiply)."""

    instruction: Instruction
    computation: Computation
    kind: str
    times: int


def _collective(
    window: _Window,
    located: _Located,
    form: str,
    program: _Program,
    executions: int,
    shared: bool = False,
) -> Collective:
    """The report's row for `located` run in `window`; a window shared by several collectives names
    each as `start/collective`."""
    instruction = located.instruction
    groups, axes, all_devices = groups_and_axes(instruction, program.module, program.mesh)
    name = f"{window.start.name}/{instruction.name}" if shared else window.start.name
    return Collective(
        kind=located.kind,
        name=name,
        computation=window.computation,
        line=window.start.line,
        form=form,
        bytes=_moved_bytes(located),
        executions=executions * located.times,
        group_size=groups,
        mesh_axes=axes,
        between_instructions=window.between_instructions,
        between_compute=window.between_compute,
        between_flops=window.between_flops,
        made_sync=_made_sync(window.start, instruction, form),
        all_devices=all_devices,
        fusion=program.fusions.get(located.computation.name, ""),
    )


def _own_kind(instruction: Instruction) -> tuple[str | None, bool]:
    """(kind, whether it is an async pair's start) of a collective instruction; (None, False) else."""
    opcode = instruction.opcode
    if opcode in KINDS:
        return opcode, opcode in _POINT_TO_POINT
    base = opcode.removesuffix("-start")
    if base != opcode and base in KINDS:
        return base, True
    return None, False


def _wraps_computations(instruction: Instruction) -> bool:
    """An async wrapper around computations: `async-start` (`calls=`), or its sugared spelling
    `<op>-start` around a called computation (`call-start`, `to_apply=`), as JAX's async
    collectives lower."""
    opcode = instruction.opcode
    return (opcode == "async-start" or opcode.endswith("-start")) and bool(
        instruction.called_computations()
    )


def _wrapped_collectives(start: Instruction, module: HloModule) -> list[_Located]:
    """Every collective in the computations an async wrapper runs, descending into calls,
    conditionals, fusions, nested wrappers and loops (a loop's body runs its trip count times)."""

    def enters(instruction: Instruction) -> bool:
        nested = _own_kind(instruction)[0] is None and _wraps_computations(instruction)
        return nested or _is_fusion(instruction)

    return [
        _Located(instruction, computation, kind, times)
        for computation, times in control_flow_runs(module, start.called_computations(), enters)
        for instruction in computation.instructions
        for kind in [_own_kind(instruction)[0]]
        if kind is not None
    ]


def _moved_bytes(located: _Located) -> int:
    """Per device: the larger of what the collective reads and what it writes. A ragged
    all-to-all's other operands are its output buffer and offsets: only its input moves. An
    in-place collective-permute (`slice_sizes`: input, output buffer, start indices) moves its
    slices alone."""
    instruction, computation = located.instruction, located.computation
    by_name = computation.by_name()
    slices = instruction.attribute("slice_sizes")
    if slices is not None and instruction.operands and instruction.operands[0] in by_name:
        return _slice_bytes(slices, by_name[instruction.operands[0]])
    sent = instruction.operands[:1] if located.kind == "ragged-all-to-all" else instruction.operands
    operand_bytes = sum(by_name[o].bytes for o in sent if o in by_name)
    if _own_kind(instruction)[1]:
        done = _done_of(instruction, computation)
        if done is not None:
            result_bytes = done.bytes
        else:
            result_bytes = instruction.arrays[-1].bytes if instruction.arrays else 0
    else:
        result_bytes = instruction.bytes
    return max(operand_bytes, result_bytes)


def _slice_bytes(slice_sizes: str, source: Instruction) -> int:
    """The bytes of an in-place collective-permute's slices, `{{128,32},{64,32}}`, one for each
    array of its input (a tuple input sends one slice of each), in that array's element type."""
    slices = [
        tuple(int(d) for d in dims.split(",") if d.strip())
        for dims in re.findall(r"\{([\d,\s]*)\}", slice_sizes)
    ]
    return sum(
        Array(array.dtype, dims).bytes for dims, array in zip(slices, source.arrays, strict=False)
    )


def scheduled_between(
    start: Instruction, computation: Computation, order: Mapping[str, int] | None = None
) -> list[Instruction]:
    """The instructions scheduled after `start` and before its done (to the end without one): what
    can run while its collectives move (`order`: the computation's instruction indices)."""
    if order is None:
        order = {
            instruction.name: index for index, instruction in enumerate(computation.instructions)
        }
    done = _done_of(start, computation)
    end = order[done.name] if done is not None else len(computation.instructions)
    return computation.instructions[order[start.name] + 1 : end]


_IS_SYNC = re.compile(r'is_sync\\?"\s*:\s*true')


def _made_sync(start: Instruction, collective: Instruction, form: str) -> bool:
    """XLA converted an async collective to a synchronous op (CPU, TPU: `async_collective_name`),
    or runs an async pair or wrapper synchronously (GPU: `collective_backend_config` `is_sync:
    true`, on the start or on the wrapped collective)."""
    if form == "sync":
        return "async_collective_name=" in start.attributes
    configs = [i.attribute("backend_config") or "" for i in (start, collective)]
    return any(_IS_SYNC.search(config) for config in configs)


def _done_of(start: Instruction, computation: Computation) -> Instruction | None:
    """The `-done` that closes `start`, following `-update` steps in between."""
    current = start.name
    for instruction in computation.instructions:
        if instruction.operands[:1] == (current,) and (
            instruction.opcode.endswith("-update") or instruction.opcode.endswith("-done")
        ):
            if instruction.opcode.endswith("-done"):
                return instruction
            current = instruction.name
    return None


def _is_compute(instruction: Instruction) -> bool:
    opcode = instruction.opcode
    if opcode in _BOOKKEEPING or opcode in KINDS:
        return False
    return not (opcode.endswith("-start") or opcode.endswith("-done") or opcode.endswith("-update"))
