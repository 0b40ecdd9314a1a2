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
report per module (`hlo_text`); an async collective XLA made synchronous (a converted op, or a GPU
pair whose backend config says `is_sync`) counts as exposed; `replica_groups={}` spans every device.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo_counts import (
    FlopCounter,
    control_flow_runs,
    execution_counts,
)
from rl_trainer_bench.preflight.hlo_parse import (
    Computation,
    HloModule,
    Instruction,
    parse_hlo,
)
from rl_trainer_bench.preflight.hlo_text import read_modules
from rl_trainer_bench.units import human_bytes

KINDS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
)
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


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a program, as scheduled."""

    kind: str  # one of KINDS
    name: str  # its start's name (its own when synchronous; START/NAME when a wrapper runs several)
    computation: str
    line: int
    form: str  # "sync" | "async pair" | "async wrapper"
    bytes: int  # per device: the larger of its input and output buffers
    executions: int  # times it runs per program execution (loop trip counts multiplied in)
    group_size: int  # devices per replica group (0: unknown)
    mesh_axes: tuple[str, ...] | None  # the mesh axes its groups span; None when not a mesh slice
    between_instructions: int  # instructions scheduled between start and done
    between_compute: int  # of those, the ones that compute (fusions, matmuls, ...)
    between_flops: float  # matmul FLOPs scheduled between start and done (estimate)
    made_sync: bool  # XLA made it synchronous: an async op it converted, or a GPU pair run in sync
    all_devices: bool = False  # its groups are `{}`: every device, even where the count is unknown
    fusion: str = ""  # the fusion instruction(s) whose computation holds it; "" outside fusions

    @property
    def is_async(self) -> bool:
        return self.form != "sync" and not self.made_sync

    @property
    def overlapped(self) -> bool:
        return self.is_async and self.between_compute > 0


@dataclasses.dataclass(frozen=True)
class KindSummary:
    kind: str
    count: int  # collectives in the program text
    executions: int  # collectives run per program execution
    bytes: int  # bytes moved per device per program execution
    async_bytes: int
    overlapped_bytes: int  # async with compute scheduled between start and done
    exposed_bytes: int  # synchronous, or async with nothing to hide behind
    hiding_flops: float  # matmul FLOPs scheduled beside the async ones, per execution

    @property
    def overlapped_fraction(self) -> float:
        return self.overlapped_bytes / self.bytes if self.bytes else 0.0


@dataclasses.dataclass(frozen=True)
class OverlapReport:
    program: str
    scheduled: bool
    num_partitions: int
    mesh: dict[str, int]
    collectives: list[Collective]
    kinds: list[KindSummary]
    total: KindSummary
    canonical_lines: bool = False  # line numbers are of XLA's canonical printing, not the file
    partitions_recorded: bool = True  # the header records num_partitions or replica_count

    def to_json(self) -> dict:
        def summary(s: KindSummary) -> dict:
            return {**dataclasses.asdict(s), "overlapped_fraction": s.overlapped_fraction}

        return {
            "program": self.program,
            "canonical_lines": self.canonical_lines,
            "scheduled": self.scheduled,
            "num_partitions": self.num_partitions,
            "mesh": self.mesh,
            "collectives": [
                {**dataclasses.asdict(c), "async": c.is_async, "overlapped": c.overlapped}
                for c in self.collectives
            ],
            "kinds": [summary(s) for s in self.kinds],
            "total": summary(self.total),
        }


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
        _summarize(kind, [c for c in collectives if c.kind == kind])
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
        total=_summarize("total", collectives),
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
        windowed = scheduled and (pair or kind is None)
        between = _between(instruction, computation, order) if windowed else []
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
    groups, axes, all_devices = _groups_and_axes(instruction, program.module, program.mesh)
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
        return opcode, False
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
    all-to-all's other operands are its output buffer and offsets: only its input moves."""
    instruction, computation = located.instruction, located.computation
    by_name = computation.by_name()
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


def _between(
    start: Instruction, computation: Computation, order: Mapping[str, int]
) -> list[Instruction]:
    """The instructions scheduled after `start` and before its done (to the end without one)."""
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


# ----------------------------------------------------------------------------------------------
# Replica groups and mesh axes
# ----------------------------------------------------------------------------------------------


def _groups_and_axes(
    instruction: Instruction, module: HloModule, mesh: Mapping[str, int]
) -> tuple[int, tuple[str, ...] | None, bool]:
    """(group size, mesh axes, spans every device); size 0 and axes None where unknown."""
    devices = math.prod(mesh.values()) if mesh else module.device_count
    if instruction.opcode.startswith("collective-permute"):
        pairs = _pairs(instruction.attribute("source_target_pairs") or "")
        return 2, _axes_of_pairs(pairs, mesh) if mesh and pairs else None, False
    all_devices = re.search(r"replica_groups=\{\}", instruction.attributes) is not None
    if devices is None:
        if all_devices:
            return 0, None, True  # every device, but the header does not say how many
        devices = 0
    groups = replica_groups(instruction.attributes, devices)
    if groups is None:
        return 0, None, all_devices
    size = len(groups[0]) if groups else 0
    return size, _axes_of_groups(groups, mesh) if mesh else None, all_devices


def replica_groups(attributes: str, num_devices: int) -> list[list[int]] | None:
    """The device groups of a collective's `replica_groups` in any of XLA's three spellings.

    `{{0,1},{2,3}}` (explicit), `[2,2]<=[4]` or `[4,2]<=[2,2,2]T(2,1,0)` (iota), and
    `mesh['a'=4,'b'=2] {'a'}` with optional `device_ids=(...)` (mesh axes). `{}` means one group of
    all devices. None when the attribute is absent or not understood.
    """
    match = re.search(r"replica_groups=", attributes)
    if match is None:
        return None
    text = attributes[match.end() :]
    try:  # a damaged spelling (`[2,,4]<=[3]`) is not understood: None, not a traceback
        if text.startswith("mesh["):
            return _mesh_groups(text, num_devices)
        if text.startswith("["):
            iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
            return _iota(iota.group(1), iota.group(2), iota.group(3)).tolist() if iota else None
    except (ValueError, IndexError):
        return None
    if text.startswith("{}"):
        return [list(range(num_devices))]
    explicit = re.match(r"\{((?:\{[\d,\s]*\},?)*)\}", text)
    if explicit is None:
        return None
    return [
        [int(d) for d in group.split(",") if d.strip()]
        for group in re.findall(r"\{([\d,\s]*)\}", explicit.group(1))
    ]


def _iota(shape: str, dims: str, perm: str | None) -> np.ndarray:
    reshape = [int(d) for d in dims.split(",")]
    array = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        array = array.transpose([int(p) for p in perm.split(",")])
    return array.reshape([int(d) for d in shape.split(",")])


_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")
_SELECTED_AXIS = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")


def _mesh_groups(text: str, num_devices: int) -> list[list[int]] | None:
    """Groups of the mesh form: devices that differ only along the selected (sub-)axes."""
    head = re.match(r"mesh\[([^\]]*)\]", text)
    if head is None:
        return None
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(head.group(1))]
    rest = text[head.end() :]
    ids = np.arange(math.prod(s for _, s in axes) or num_devices)
    device_ids = re.match(r",\s*device_ids=\((\[[\d,]+\](?:<=\[[\d,]+\])?(?:T\([\d,]+\))?)\)", rest)
    if device_ids:
        iota = re.match(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?", device_ids.group(1))
        ids = _iota(str(ids.size), iota.group(2) or iota.group(1), iota.group(3)).reshape(-1)
        rest = rest[device_ids.end() :]
    selection = re.match(r"\s*\{([^}]*)\}", rest)
    if selection is None:
        return None
    # Split every axis into (major, selected, minor) pieces so sub-axes `'a':(pre)size` work too.
    dims: list[int] = []
    selected: list[int] = []
    chosen = {name: (pre, size) for name, pre, size in _SELECTED_AXIS.findall(selection.group(1))}
    for name, size in axes:
        if name not in chosen:
            dims.append(size)
            continue
        pre, sub = chosen[name]
        pre, sub = (int(pre), int(sub)) if sub else (1, size)
        dims += [pre, sub, size // (pre * sub)]
        selected.append(len(dims) - 2)
    grid = ids.reshape(dims)
    others = [d for d in range(len(dims)) if d not in selected]
    moved = np.transpose(grid, others + selected)
    group_size = math.prod(dims[d] for d in selected)
    return moved.reshape(-1, group_size).tolist()


def mesh_partition(mesh: Mapping[str, int], axes: Sequence[str]) -> frozenset[frozenset[int]]:
    """The device groups that a collective over `axes` of `mesh` uses (devices in mesh order)."""
    names = list(mesh)
    grid = np.arange(math.prod(mesh.values())).reshape([mesh[n] for n in names])
    keep = [names.index(a) for a in axes]
    others = [d for d in range(len(names)) if d not in keep]
    size = math.prod(mesh[a] for a in axes)
    groups = np.transpose(grid, others + keep).reshape(-1, size)
    return frozenset(frozenset(g) for g in groups.tolist())


def _axes_of_groups(groups: list[list[int]], mesh: Mapping[str, int]) -> tuple[str, ...] | None:
    wanted = frozenset(frozenset(g) for g in groups)
    names = [n for n in mesh if mesh[n] > 1]
    for count in range(len(names) + 1):
        for axes in itertools.combinations(names, count):
            if mesh_partition(mesh, axes) == wanted:
                return axes
    return None


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text)]


def _axes_of_pairs(pairs: list[tuple[int, int]], mesh: Mapping[str, int]) -> tuple[str, ...] | None:
    """The mesh axes along which a collective-permute's source and target differ."""
    shape = [mesh[n] for n in mesh]
    total = math.prod(shape)
    if any(a >= total or b >= total for a, b in pairs):
        return None
    differ: set[str] = set()
    for source, target in pairs:
        a, b = np.unravel_index(source, shape), np.unravel_index(target, shape)
        differ |= {name for name, x, y in zip(mesh, a, b, strict=True) if x != y}
    return tuple(n for n in mesh if n in differ)


# ----------------------------------------------------------------------------------------------
# Summary and output
# ----------------------------------------------------------------------------------------------


def _summarize(kind: str, collectives: Sequence[Collective]) -> KindSummary:
    def moved(selected) -> int:
        return sum(c.bytes * c.executions for c in selected)

    return KindSummary(
        kind=kind,
        count=len(collectives),
        executions=sum(c.executions for c in collectives),
        bytes=moved(collectives),
        async_bytes=moved(c for c in collectives if c.is_async),
        overlapped_bytes=moved(c for c in collectives if c.overlapped),
        exposed_bytes=moved(c for c in collectives if not c.overlapped),
        hiding_flops=sum(c.between_flops * c.executions for c in collectives if c.overlapped),
    )


def format_report(report: OverlapReport, details: bool = True) -> str:
    """Human table: one row per collective (when `details`), then one per kind and the total."""
    mesh = " x ".join(f"{n}{s}" for n, s in report.mesh.items()) or "not given"
    partitions = report.num_partitions if report.partitions_recorded else "unrecorded"
    lines = [
        f"program {report.program}: {partitions} partitions, mesh {mesh}, "
        f"{'scheduled' if report.scheduled else 'NOT scheduled (order is not execution order)'}"
    ]
    if details and report.collectives:
        lines.append(
            f"  {'line':>6} {'kind':<19} {'form':<24} {'bytes':>10} {'x':>4} {'group':>5} "
            f"{'axes':<16} {'between':>7} {'compute':>7} {'GFLOP':>9}"
        )
        for c in report.collectives:
            axes = ",".join(c.mesh_axes) if c.mesh_axes is not None else "?"
            marks = [m for m, on in (("made", c.made_sync), ("fused", c.fusion)) if on]
            form = c.form + (f" ({', '.join(marks)})" if marks else "")
            group = c.group_size or ("all" if c.all_devices else "?")
            lines.append(
                f"  {c.line:>6} {c.kind:<19} {form:<24} {human_bytes(c.bytes):>10} {c.executions:>4} "
                f"{group:>5} {axes:<16} {c.between_instructions:>7} "
                f"{c.between_compute:>7} {c.between_flops / 1e9:>9.3f}"
            )
    lines.append(
        f"  {'kind':<19} {'count':>5} {'runs':>5} {'bytes':>10} {'async':>10} "
        f"{'overlapped':>10} {'exposed':>10} {'overlap':>7} {'hiding GFLOP':>12}"
    )
    for s in [*report.kinds, report.total]:
        lines.append(
            f"  {s.kind:<19} {s.count:>5} {s.executions:>5} {human_bytes(s.bytes):>10} "
            f"{human_bytes(s.async_bytes):>10} {human_bytes(s.overlapped_bytes):>10} "
            f"{human_bytes(s.exposed_bytes):>10} {s.overlapped_fraction:>7.0%} {s.hiding_flops / 1e9:>12.3f}"
        )
    if any(c.made_sync for c in report.collectives):
        lines.append(
            "  (made): XLA made an async collective synchronous (converted, or a GPU pair marked "
            "is_sync): nothing hides it"
        )
    if any(c.fusion for c in report.collectives):
        lines.append(
            "  (fused): in the computation of a fusion (--json names it), whose order XLA does not "
            "schedule: nothing the HLO shows hides it"
        )
    if report.canonical_lines:
        lines.append("  lines: of XLA's canonical printing of the module (the file's text was not")
        lines.append("  in a form this reader takes line by line)")
    return "\n".join(lines)


def parse_mesh(text: str) -> dict[str, int]:
    """`fsdp=2,context=2,expert=2` (mesh order, major to minor) into an ordered mapping."""
    mesh: dict[str, int] = {}
    for piece in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = piece.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise UserError(
                f"--mesh: {piece!r} is not NAME=SIZE; write e.g. fsdp=2,context=2,expert=2"
            )
        mesh[name.strip()] = int(size)
    return mesh


# ----------------------------------------------------------------------------------------------
# Command
# ----------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument(
        "file", nargs="?", metavar="FILE.hlo", help="HLO text (compiled.as_text() or an XLA dump)"
    )
    parser.add_argument(
        "--mesh",
        metavar="AXES",
        help="mesh of FILE, major to minor, e.g. fsdp=2,context=2,expert=2: maps groups to axes",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--summary-only", action="store_true", help="leave out the per-collective rows"
    )
    from rl_trainer_bench.preflight.aot.command import add_target_arguments

    add_target_arguments(parser)


def run(args) -> int:
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise UserError(f"FILE.hlo: {args.file!r} does not exist; pass an HLO text file")
        mesh = parse_mesh(args.mesh) if args.mesh else None
        try:
            data = path.read_bytes()
        except OSError as error:
            raise UserError(f"{args.file}: cannot read ({error.strerror})") from None
        reports = analyze_file(data, str(path), mesh, Path(path.name.removesuffix(".gz")).stem)
    else:
        from rl_trainer_bench.preflight.aot.check import compiled_texts
        from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

        with quiet_libtpu():  # libtpu's start-up noise when compiling for a TPU slice
            reports = [
                analyze_text(text, name, mesh, name)
                for name, text, mesh in compiled_texts(args.preset, args.target, args.layers)
            ]
    if args.json:
        text = json.dumps([r.to_json() for r in reports], indent=1)
    else:
        text = "\n\n".join(format_report(r, details=not args.summary_only) for r in reports)
    print_to_a_pipe(text)
    return 0


def print_to_a_pipe(text: str) -> None:
    """Print `text`; a reader that closed the pipe early (`| head`) has all it wanted, not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
