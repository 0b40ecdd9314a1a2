"""The collective-overlap report: one row per collective as scheduled, a summary per kind, and
their text and JSON forms.

A row says what moves (kind, bytes per device, how often, over which mesh axes) and what the
schedule puts beside it (instructions, compute, matmul FLOPs between its start and its done); the
summary per kind sums the bytes that move and how much of them has compute beside it, the figure
that says whether a collective costs step time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_trainer_bench.preflight.compiler_flags import flag_lines
from rl_trainer_bench.units import human_bytes


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a program, as scheduled."""

    kind: str  # one of hlo_overlap.KINDS
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
    # {variable: value or None} of the flags a program compiled here was compiled under (they
    # decide what XLA makes async and what it schedules beside it); empty for a file's module.
    compiler_flags: dict[str, str | None] = dataclasses.field(default_factory=dict)

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
            "compiler_flags": self.compiler_flags,
        }


def summarize(kind: str, collectives: Sequence[Collective]) -> KindSummary:
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
        f"{'scheduled' if report.scheduled else 'NOT scheduled (order is not execution order)'}",
        *(f"  {line}" for line in flag_lines(report.compiler_flags)),
    ]
    if details and report.collectives:
        lines.append(
            f"  {'line':>6} {'kind':<20} {'form':<24} {'bytes':>10} {'x':>4} {'group':>5} "
            f"{'axes':<16} {'between':>7} {'compute':>7} {'GFLOP':>9}"
        )
        for c in report.collectives:
            axes = ",".join(c.mesh_axes) if c.mesh_axes is not None else "?"
            marks = [m for m, on in (("made", c.made_sync), ("fused", c.fusion)) if on]
            form = c.form + (f" ({', '.join(marks)})" if marks else "")
            group = c.group_size or ("all" if c.all_devices else "?")
            lines.append(
                f"  {c.line:>6} {c.kind:<20} {form:<24} {human_bytes(c.bytes):>10} {c.executions:>4} "
                f"{group:>5} {axes:<16} {c.between_instructions:>7} "
                f"{c.between_compute:>7} {c.between_flops / 1e9:>9.3f}"
            )
    lines.append(
        f"  {'kind':<20} {'count':>5} {'runs':>5} {'bytes':>10} {'async':>10} "
        f"{'overlapped':>10} {'exposed':>10} {'overlap':>7} {'hiding GFLOP':>12}"
    )
    for s in [*report.kinds, report.total]:
        lines.append(
            f"  {s.kind:<20} {s.count:>5} {s.executions:>5} {human_bytes(s.bytes):>10} "
            f"{human_bytes(s.async_bytes):>10} {human_bytes(s.overlapped_bytes):>10} "
            f"{human_bytes(s.exposed_bytes):>10} {s.overlapped_fraction:>7.0%} {s.hiding_flops / 1e9:>12.3f}"
        )
    if any(c.made_sync for c in report.collectives):
        lines.append(
            "  (made): XLA made an async collective synchronous (converted, or a GPU pair marked "
            "is_sync): nothing hides it"
        )
    if details and any(c.fusion for c in report.collectives):  # it explains the rows
        lines.append(
            "  (fused): in the computation of a fusion (--json names it), whose order XLA does not "
            "schedule: nothing the HLO shows hides it"
        )
    if report.canonical_lines:
        lines.append("  lines: of XLA's canonical printing of the module (the file's text was not")
        lines.append("  in a form this reader takes line by line)")
    return "\n".join(lines)
