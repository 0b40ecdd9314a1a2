"""The AOT report: per program its bytes, the device peak against the chip's memory, the estimates.

Figures extrapolated from shallow compiles and every time figure are labelled as estimates, never
as measurements.
"""

from __future__ import annotations

import dataclasses
import math

from rl_trainer_bench.bench.state_memory import MIN_HEADROOM
from rl_trainer_bench.preflight import step_estimate
from rl_trainer_bench.preflight.aot.compile import ProgramMemory
from rl_trainer_bench.preflight.compiler_flags import flag_lines
from rl_trainer_bench.units import human_bytes


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
    min_headroom: float = MIN_HEADROOM  # the margin, as a fraction of `memory_bytes`
    engine: str = ""  # the module whose programs were compiled
    # The trainer's engine keys the engine refused, {key=value: why}: compiled without them.
    refused_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    # {variable: value or None} of the flags the compiler read when it started (compiler_flags).
    compiler_flags: dict[str, str | None] = dataclasses.field(default_factory=dict)

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

    @property
    def margin_bytes(self) -> int | None:
        """The headroom the margin asks for, in bytes."""
        return (
            None if self.memory_bytes is None else math.ceil(self.min_headroom * self.memory_bytes)
        )

    @property
    def margin_met(self) -> bool | None:
        """Fits with at least the margin free; None where the fit itself is unknown."""
        if self.fits is None:
            return None
        return bool(self.fits) and self.headroom >= self.margin_bytes

    @property
    def offload_peak(self) -> int | None:
        """ESTIMATE: the device peak with the optimizer state in host memory between updates, from
        these compiles: each program's peak less the optimizer state beside it. XLA may plan other
        temporaries once told that memory is free, so this is not a compile's figure. None when the
        state is not in device memory or a program did not compile."""
        if not self.state.get("opt_state") or any(not p.compiled for p in self.programs):
            return None
        return max(p.peak - p.optimizer_beside for p in self.programs)

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
            "min_headroom": self.min_headroom,
            "margin_bytes": self.margin_bytes,
            "margin_met": self.margin_met,
            "offload_peak_bytes_estimate": self.offload_peak,
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
            "engine": self.engine,
            "refused_keys": self.refused_keys,
            "compiler_flags": self.compiler_flags,
        }


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
        f"engine: {report.engine}",
        *flag_lines(report.compiler_flags),
    ]
    if report.note:
        lines.append(report.note)
    if report.refused_keys:
        refused = "; ".join(f"{key} ({why})" for key, why in report.refused_keys.items())
        lines.append(
            f"NOT TAKEN: {len(report.refused_keys)} of the trainer's keys the engine refuses,"
            f" compiled without them: {refused}"
        )
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
            p.counted_temp,
            p.generated_code,
            p.resident,
            p.beside,
            p.peak,
        )
        lines.append(f"{p.name:<18}" + "".join(f"{human_bytes(v):>12}" for v in values))
    lines += _temp_note(report)
    live = [f"{p.name} {human_bytes(p.live_peak)}" for p in report.programs if p.live_peak]
    if live:
        lines.append(
            "XLA's own peak of live buffers, arguments included (peak_memory_in_bytes): "
            + ", ".join(live)
            + "; for reference: the device holds the resident bytes, XLA's temporaries being"
            " one block sized by how it packs them"
        )
    return lines


def _temp_note(report: AotReport) -> list[str]:
    """On TPU, the line that says `temp` is XLA's buffer assignment's HBM block, with XLA's
    `temp_size_in_bytes` of each program where it is larger by more than a MiB, and the
    programs whose block could not be read (no dump: a compile served from JAX's cache)."""
    compiled = [p for p in report.programs if p.compiled]
    if not report.device_kind.startswith("TPU") or not compiled:
        return []
    read = [p for p in compiled if p.temp_block is not None]
    larger = [f"{p.name} {human_bytes(p.temp)}" for p in read if p.temp - p.temp_block > 2**20]
    note = (
        "temp: the HBM temporary block of XLA's buffer assignment, what loading the program"
        " allocates (engine/temp_block.py)"
    )
    if larger:
        note += "; XLA's temp_size_in_bytes, larger in loops and not counted: " + ", ".join(larger)
    unread = [p.name for p in compiled if p.temp_block is None]
    if unread:
        note += (
            f"; no buffer assignment for {', '.join(unread)} (XLA wrote no dump: a compile from"
            " JAX's persistent cache?), temp_size_in_bytes counted there"
        )
    return [note]


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
    headroom = "n/a"
    if report.headroom is not None:
        headroom = (
            f"{human_bytes(report.headroom)} ({_percent(report.headroom, report.memory_bytes)})"
        )
    lines.append(
        f"device peak {human_bytes(report.peak)} of {memory} ({report.memory_source}); "
        f"headroom {headroom}: {verdict}"
    )
    lines += _margin(report)
    if report.unsharded_state:
        lines.append(_unsharded_line(report))
    if report.unapplied_keys:
        lines.append(f"keys the engine does not apply: {', '.join(report.unapplied_keys)}")
    return lines


# Unsplit state leaves named in the text report (all of them are in the JSON).
_UNSHARDED_SHOWN = 8


def _unsharded_line(report: AotReport) -> str:
    """The largest state leaves not split over every device; the rest counted (MaxText's norm
    scales and gates are hundreds of small ones)."""
    leaves = sorted(report.unsharded_state, key=lambda leaf: -leaf[1])
    shown = ", ".join(f"{path} {human_bytes(n)}" for path, n in leaves[:_UNSHARDED_SHOWN])
    rest = leaves[_UNSHARDED_SHOWN:]
    if rest:
        shown += f", and {len(rest)} more ({human_bytes(sum(n for _, n in rest))})"
    return f"state not split over all {report.devices} devices: {shown}"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%"


def _margin(report: AotReport) -> list[str]:
    """Whether the peak leaves the margin free, by how much it falls short, and what host offload
    of the optimizer state would leave (an estimate) when the state is in device memory."""
    if not report.fits:
        return []
    margin = f"{100 * report.min_headroom:g}% margin ({human_bytes(report.margin_bytes)})"
    if report.margin_met:
        return [f"margin: the {margin} is free at the peak"]
    short = report.margin_bytes - report.headroom
    limit = report.memory_bytes - report.margin_bytes
    lines = [
        f"margin: BELOW the {margin} by {human_bytes(short)}: the peak would have to be"
        f" {human_bytes(limit)} or less"
    ]
    offload = report.offload_peak
    if offload is not None:
        lines.append(
            f"  with optimizer_memory_host_offload=true the optimizer state's"
            f" {human_bytes(report.state['opt_state'])} per device leaves the device between"
            f" updates: peak {human_bytes(offload)}"
            f" ({_percent(report.memory_bytes - offload, report.memory_bytes)} headroom),"
            " ESTIMATE from these compiles (XLA may plan other temporaries; compile it to know)"
        )
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
    header = (
        "program",
        "XLA FLOPs",
        "XLA bytes",
        "XLA time",
        "FLOPs",
        "bytes",
        "roofline",
        "op est.",
    )
    lines.append(f"{header[0]:<18}" + "".join(f"{h:>12}" for h in header[1:]))
    for p in compiled:
        values = (
            f"{p.xla_flops:.4g}",
            human_bytes(round(p.xla_bytes_accessed)),
            step_estimate.seconds_text(p.xla_optimal_seconds),
            f"{p.flops:.4g}",
            human_bytes(round(p.bytes_accessed)),
            step_estimate.seconds_text(p.roofline_seconds),
            step_estimate.seconds_text(p.op_seconds),
        )
        lines.append(f"{p.name:<18}" + "".join(f"{v:>12}" for v in values))
    if report.roofline is None:
        lines.append(f"no time estimate: {report.step_note}")
        return lines
    lines += _legend(report, compiled)
    step = report.step
    if step is None:
        return lines
    lines.append(f"predicted step, {step_estimate.LABEL}: {step.formula()}")
    lines.append(step_estimate.chip_check_line(step_estimate.chip_check()))
    unstated = {k: None for p in compiled for k in p.unstated_kernel_ops}
    if unstated:
        lines.append(
            f"  TPU kernels that state no cost ({', '.join(unstated)}): the op estimate counts their"
            " operands' and results' bytes only"
        )
    if step_estimate.REPLAY in step.program_seconds:
        lines.append(f"  P(replay) per micro-batch from the {step.replay_source}")
    else:
        lines.append("  no replay: the engine has no dropless replay program")
    mfu = step.mfu
    lines.append(
        f"predicted MFU, {step_estimate.LABEL}: "
        + ("n/a" if mfu is None else f"{100 * mfu:.1f}%")
        + f" (model FLOPs {step.model_flops_per_micro_batch:.4g} per micro-batch, real tokens "
        f"only, over {step.devices} devices at {step.peak_flops_per_device / 1e12:.1f} TFLOP/s)"
    )
    return lines + _bounds(report, step)


def _legend(report: AotReport, compiled: list) -> list[str]:
    """What each time column of the cost table is, with the roofline's ratio to XLA's own."""
    lines = []
    peak, bandwidth = report.roofline
    lines.append(
        f"XLA time: XLA's own estimate (optimal_seconds; '-' where it gives none, as with a loop); "
        f"roofline: {step_estimate.LABEL} by this tool, max(FLOPs / {peak / 1e12:.1f} TFLOP/s, "
        f"bytes / {bandwidth / 1e12:.3f} TB/s) per device over the whole program; not a bound:"
        " the byte walk reads a loop body's operands once per trip, and collectives nothing hides"
        " are left out"
    )
    lines.append(
        f"op est.: {step_estimate.LABEL} by this tool, each op at max(FLOPs / peak, HBM bytes /"
        " bandwidth) as its arrays lie in their tiles, Pallas kernels at their stated cost,"
        " collectives over ICI less the ops scheduled beside them, summed; the step's figure"
    )
    checks = [
        f"{p.name} {p.roofline_seconds / p.xla_optimal_seconds:.2f}"
        for p in compiled
        if p.xla_optimal_seconds and p.roofline_seconds
    ]
    if checks:
        lines.append(f"roofline / XLA time where XLA gives one: {', '.join(checks)}")
    return lines


def _bounds(report: AotReport, step: step_estimate.StepEstimate) -> list[str]:
    """The step at compute speed (a lower bound), the MFU it allows (an upper bound), and the
    public measurements of the cell where there are some."""
    floor, ceiling = step.step_floor_seconds, step.mfu_ceiling
    if floor is None:
        return []
    fwd_bwd = step_estimate.seconds_text(step.compute_seconds.get("fwd_bwd"))
    # Past 100% the bound is still true but rules nothing out: the TPU kernels' FLOPs, left out
    # of the floor (below), can make it so on a cell that runs them (tpu-v5e-1: 111.9%)
    vacuous = (
        " (over 100%: it rules nothing out, the floor leaving out work)" if ceiling > 1 else ""
    )
    lines = [
        f"step, {step_estimate.BOUND}: {step_estimate.seconds_text(floor)} (fwd_bwd {fwd_bwd} at"
        f" {step.peak_flops_per_device / 1e12:.1f} TFLOP/s); so MFU at most {100 * ceiling:.1f}%"
        + vacuous
    ]
    stated = [p.name for p in report.programs if p.compiled and p.bound_flops < p.flops]
    if stated:
        lines.append(
            f"  counting XLA's own ops only: the TPU kernels' FLOPs in {', '.join(stated)}, as"
            " each kernel states them, are in the roofline but not in the bound (a kernel may"
            " state more than it runs: the grouped matmul counts every row it is given)"
        )
    unstated = {k: None for p in report.programs if p.compiled for k in p.unstated_kernels}
    if unstated:
        lines.append(
            f"  TPU kernels that state no FLOPs ({', '.join(unstated)}): their work is in neither"
            " the roofline's compute nor the bound (their bytes are in the roofline)"
        )
    return lines + step_estimate.public_comparison(report.preset, report.target, step)
