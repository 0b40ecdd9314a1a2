"""The step record: what is measured about one trainer step, how those figures are made, and the
forms people read it in.

A step's record is built here from the step's host clock (`clock.py`) and, where the engine gives
completion markers, from a timeline of when each program's result became ready
(`device_timeline.py`); the arithmetic that turns those stamps into per-call device seconds, the
first call's extra and the boundary's idle gap lives here so it is tested apart from any device.
An arm's result (`ArmRun`) is its step records and the counters the A/B's exact checks read.

The record's text forms live with it, so a field added to the record is added to its forms in
the same place: the `[TrainerBench] step=...` line people read in a pod's log (the step ruler),
`parse` to read those lines back, and the end-of-run summary table. Its JSON line in results.jsonl
is written by `results_file.py`, which owns the file's durability.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rl_trainer_bench.bench.clock import StepClock


@dataclasses.dataclass
class StepRecord:
    """Everything measured about one step. Times are seconds; `None` means not measured/not known."""

    step: int
    warmup: bool  # reported, never scored
    step_s: float  # from the step's first dispatch to its drain (metrics read) on the host
    fwd_bwd_dispatch_s: list[float]  # per micro-batch: host seconds inside worker.fwd_bwd
    # First fwd_bwd's device time over the median regular one; None with one call per step or
    # when the step replayed (a replay rides on the next call, so regular calls carry extra work).
    first_call_extra_s: float | None
    update_s: float  # host seconds inside worker.update
    drain_s: float  # host seconds waiting for the step's results after update returned
    stage_s: float  # host seconds inside prepare_fwd_bwd_input (0 when not staged)
    device_wait_s: float  # seconds wait_for_device blocked (0 when not staged)
    tokens: int  # real (non-padding) tokens trained this step
    tokens_per_s_per_device: float
    tflops_per_device: float | None
    mfu: float | None  # achieved / peak, where the chip's peak is known
    loss: float
    grad_norm: float
    loss_denominator: float  # completion tokens summed over the step's micro-batches
    overflow_count: int | None  # None: the engine does not measure it
    replay_count: int | None
    micro_batches: list[str]  # names, in the order trained (bench_<step>_<index>)
    digests: list[str]  # one content digest per micro-batch, same order
    device_ready_s: list[float]  # per fwd_bwd: when its result was ready, from the step's start
    update_ready_s: float | None  # when the update's result was ready, from the step's start
    boundary_idle_s: (
        float | None
    )  # device idle from the previous update ready to this step's first work
    staged: str | None = None  # name of the micro-batch staged at this step's boundary
    stage_hidden: float | None = None  # fraction of the stage's copy that overlapped device work
    # Seconds of the host's staging (from its stage's start to its wait's end) during which the
    # device had nothing to run: what staging cost the step on the device's clock. None: not staged
    # or no device timeline.
    stage_exposed_s: float | None = None
    recompiles: int = 0
    arm: str = ""  # A/B arm label; empty outside an A/B
    fwd_bwd_device_s: list[float] = dataclasses.field(default_factory=list)  # per call, on device

    @property
    def non_finite(self) -> list[str]:
        """The engine's metrics that came back NaN or infinite this step (a broken training step:
        the run and the A/B fail on it)."""
        return [name for name in FINITE_METRICS if not math.isfinite(getattr(self, name))]

    def to_json(self) -> dict[str, Any]:
        """The record as strict JSON: a non-finite metric is `null`, named in `non_finite`."""
        data = dataclasses.asdict(self)
        flagged = self.non_finite
        for name in flagged:
            data[name] = None
        return {**data, "non_finite": flagged}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        for name in data.get("non_finite") or []:
            if name in FINITE_METRICS and fields.get(name) is None:
                fields[name] = math.nan  # written as null: the value was not finite
        return cls(**fields)


# The engine's metrics a record keeps as floats; NaN or infinity in one is flagged, never hidden.
FINITE_METRICS = ("loss", "grad_norm", "loss_denominator")


@dataclasses.dataclass
class ArmRun:
    """What one arm produced: its step records and the counters the exact checks read.

    `Bench.run` fills every field but `setting` and `source`, which the A/B command names; read back
    from a log, `updates`, `stages` and `recompiles` are `None` where the log does not say, and the
    check that needs them is skipped.
    """

    label: str
    setting: str
    staged: bool  # the arm stages the next first micro-batch at each boundary
    records: list[StepRecord]  # warm-up steps included, flagged warmup=True
    updates: int | None = None  # optimizer updates applied in the arm
    stages: int | None = None  # prepare_fwd_bwd_input calls in the arm
    recompiles: list[str] | None = None  # programs compiled during scored steps (must be empty)
    param_digest: str | None = None  # parameters after the arm (None: the engine cannot say)
    source: str = ""  # where the records came from: a bench group or a log file
    # Per boundary, by the step it closes (every step closes one, the last included): does it
    # stage? None: every boundary as `staged` says (an interleaved A/B run switches setting at its
    # boundaries).
    stages_at: list[bool] | None = None
    # The micro-batch's copy timed alone after the compile (bench/host_link.py): what the first
    # fwd_bwd after an unstaged boundary is predicted to wait for. None: not measured.
    boundary_copy_s: float | None = None
    # The engine's staging path as its run's header names it (`staging_path`).
    staging_path: str = ""

    def stages_expected(self) -> list[bool]:
        """Whether each boundary (one per step, by the step it closes) should stage."""
        if self.stages_at is not None:
            return list(self.stages_at)
        return [self.staged] * len(self.records)

    @property
    def scored(self) -> list[StepRecord]:
        return [r for r in self.records if not r.warmup]


# ----------------------------------------------------------------------------------------------
# One step's record, from its clock and its device stamps
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """What a step trained and where: known before it ran, computed off the clock."""

    step: int
    warmup: bool
    arm: str
    micro_batches: list[str]
    digests: list[str]
    tokens: int  # real (non-padding) tokens over the step's micro-batches
    model_flops: float | None  # over the step's fwd_bwd calls; None where the engine cannot count
    staged: str | None  # the micro-batch staged at this step's boundary
    devices: int
    peak_flops: float | None  # per device, where the chip is known


@dataclasses.dataclass(frozen=True)
class DeviceStamps:
    """When each of the step's programs (and its staged copy) was ready, perf_counter seconds."""

    fwd_bwd_ready: list[float]
    update_ready: float
    previous_ready: float | None  # the previous step's update, ready (None for an arm's first)
    copy_ready: float | None  # the staged copy, ready (None when nothing was staged)


def from_measurements(
    inputs: StepInputs,
    clock: StepClock,
    device: DeviceStamps | None,
    metrics: Mapping[str, Any],
    recompiles: int,
) -> StepRecord:
    """The step's record: host figures from the clock's spans (`fwd_bwd`, `update`, `stage`,
    `device_wait`), device figures from the stamps, training figures from the engine's metrics."""
    step_s = clock.end - clock.start
    flops = inputs.model_flops
    tflops = None if flops is None else flops / step_s / inputs.devices / 1e12
    replays = _counted(metrics, "replay_count")
    timeline = _device_figures(inputs, clock, device)
    return StepRecord(
        step=inputs.step,
        warmup=inputs.warmup,
        step_s=step_s,
        fwd_bwd_dispatch_s=clock.seconds("fwd_bwd"),
        # A dropless replay of micro-batch i is dispatched inside fwd_bwd(i+1), so with replays
        # the regular calls carry extra work the first one does not: not comparable.
        first_call_extra_s=first_call_extra(timeline["fwd_bwd_device_s"]) if not replays else None,
        update_s=sum(clock.seconds("update")),
        drain_s=clock.end - clock.ends("update")[-1],
        stage_s=sum(clock.seconds("stage")),
        device_wait_s=sum(clock.seconds("device_wait")),
        tokens=inputs.tokens,
        tokens_per_s_per_device=inputs.tokens / step_s / inputs.devices,
        tflops_per_device=tflops,
        mfu=tflops * 1e12 / inputs.peak_flops if tflops is not None and inputs.peak_flops else None,
        loss=float(metrics["loss"]),
        grad_norm=float(metrics["grad_norm"]),
        loss_denominator=float(metrics["loss_denominator"]),
        overflow_count=_counted(metrics, "overflow_count"),
        replay_count=replays,
        micro_batches=list(inputs.micro_batches),
        digests=list(inputs.digests),
        staged=inputs.staged,
        recompiles=recompiles,
        arm=inputs.arm,
        **timeline,
    )


def _counted(metrics: Mapping[str, Any], name: str) -> int | None:
    """An engine's count, or None when it does not measure it (absent or None)."""
    value = metrics.get(name)
    return None if value is None else int(value)


def _device_figures(
    inputs: StepInputs, clock: StepClock, device: DeviceStamps | None
) -> dict[str, Any]:
    """The record's device-side fields; empty or None without a device timeline."""
    if device is None:
        return dict(
            fwd_bwd_device_s=[],
            device_ready_s=[],
            update_ready_s=None,
            boundary_idle_s=None,
            stage_hidden=None,
            stage_exposed_s=None,
        )
    dispatched = clock.starts("fwd_bwd")
    hidden = exposed = None
    if inputs.staged is not None and device.copy_ready is not None:
        busy_ends = [*device.fwd_bwd_ready, device.update_ready]
        spans = device_seconds(
            [*dispatched, *clock.starts("update")], busy_ends, device.previous_ready
        )
        busy = [(end - seconds, end) for seconds, end in zip(spans, busy_ends, strict=True)]
        staging_start = clock.starts("stage")[0]
        hidden = overlap_fraction((staging_start, device.copy_ready), busy)
        waited = clock.ends("device_wait")
        exposed = idle_seconds((staging_start, max(waited, default=device.copy_ready)), busy)
    return dict(
        fwd_bwd_device_s=device_seconds(dispatched, device.fwd_bwd_ready, device.previous_ready),
        device_ready_s=[ready - clock.start for ready in device.fwd_bwd_ready],
        update_ready_s=device.update_ready - clock.start,
        boundary_idle_s=boundary_idle(device.previous_ready, dispatched[0]),
        stage_hidden=hidden,
        stage_exposed_s=exposed,
    )


# ----------------------------------------------------------------------------------------------
# Device timeline arithmetic
# ----------------------------------------------------------------------------------------------


def device_seconds(
    dispatched: Sequence[float], ready: Sequence[float], previous_ready: float | None
) -> list[float]:
    """Per program: seconds the device spent on it, from its ready stamps.

    A program starts when it was dispatched or when the one before it finished, whichever is later
    (a device runs one program at a time), so its device time is `ready - max(dispatched, previous
    ready)`. `previous_ready` is the last ready stamp before the first program (None: none).
    """
    out = []
    before = previous_ready
    for start, done in zip(dispatched, ready, strict=True):
        began = start if before is None else max(start, before)
        out.append(max(0.0, done - began))
        before = done
    return out


def first_call_extra(device_s: Sequence[float]) -> float | None:
    """The first call's device seconds over the median regular (non-first) call; None with one call."""
    if len(device_s) < 2:
        return None
    return device_s[0] - statistics.median(device_s[1:])


def boundary_idle(previous_ready: float | None, first_dispatch: float) -> float | None:
    """Seconds the device sat idle at the boundary: from the previous step's last result being
    ready to this step's first dispatch (None for the first step, which has no boundary)."""
    if previous_ready is None:
        return None
    return max(0.0, first_dispatch - previous_ready)


def overlap_fraction(
    interval: tuple[float, float], busy: Iterable[tuple[float, float]]
) -> float | None:
    """The fraction of `interval` (a copy, start to ready) that falls inside device-busy spans.

    Busy spans must not overlap each other (one device program at a time). None when the interval
    is empty: nothing was measured, and nothing is claimed.
    """
    start, end = interval
    if end <= start:
        return None
    return min(1.0, _covered(interval, busy) / (end - start))


def idle_seconds(interval: tuple[float, float], busy: Iterable[tuple[float, float]]) -> float:
    """Seconds of `interval` outside the device-busy spans (which must not overlap each other)."""
    start, end = interval
    return max(0.0, end - start - _covered(interval, busy)) if end > start else 0.0


def _covered(interval: tuple[float, float], busy: Iterable[tuple[float, float]]) -> float:
    """Seconds of `interval` inside the busy spans."""
    start, end = interval
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy)


# ----------------------------------------------------------------------------------------------
# The log line: one `[TrainerBench] step=...` line per step, and `parse` to read it back
#
# The log line is what people read in a pod's log, so it is short and stable: key=value tokens
# after the prefix, one per figure the line carries. Two pods' logs are often all a user has to
# compare, so every figure the A/B reads survives the round trip; `without_times` blanks the clock
# so two runs' lines compare.
# ----------------------------------------------------------------------------------------------

LOG_PREFIX = "[TrainerBench]"


def stage_line(knob: str, record: StepRecord) -> str:
    """The line after a staged step's ruler line: what was staged and how much of its copy hid."""
    hidden = "-" if record.stage_hidden is None else f"{record.stage_hidden:.3f}"
    exposed = "-" if record.stage_exposed_s is None else f"{record.stage_exposed_s:.6f}"
    return (
        f"{knob} step={record.step} staged={record.staged} stage_s={record.stage_s:.6f}"
        f" device_wait_s={record.device_wait_s:.6f} hidden={hidden} exposed_s={exposed}"
    )


@dataclasses.dataclass(frozen=True)
class _Key:
    key: str  # as printed
    field: str  # StepRecord field
    kind: str  # int | bool | str | time | float | exact | floats | strs
    optional: bool = False
    # A key added after pods' logs were written: a line without it reads back as None.
    newer: bool = False


_LINE_KEYS: tuple[_Key, ...] = (
    _Key("step", "step", "int"),
    _Key("arm", "arm", "str"),
    _Key("warmup", "warmup", "bool"),
    _Key("step_s", "step_s", "time"),
    _Key("fwd_bwd_s", "fwd_bwd_dispatch_s", "floats"),
    _Key("device_s", "fwd_bwd_device_s", "floats"),
    _Key("first_extra_s", "first_call_extra_s", "time", optional=True),
    _Key("update_s", "update_s", "time"),
    _Key("drain_s", "drain_s", "time"),
    _Key("stage_s", "stage_s", "time"),
    _Key("device_wait_s", "device_wait_s", "time"),
    _Key("idle_s", "boundary_idle_s", "time", optional=True),
    _Key("tokens", "tokens", "int"),
    _Key("tok_s_dev", "tokens_per_s_per_device", "float"),
    _Key("tflops_dev", "tflops_per_device", "float", optional=True),
    _Key("mfu", "mfu", "float", optional=True),
    _Key("loss", "loss", "exact"),
    _Key("grad_norm", "grad_norm", "exact"),
    _Key("loss_den", "loss_denominator", "exact"),
    _Key("overflow", "overflow_count", "int", optional=True),
    _Key("replays", "replay_count", "int", optional=True),
    _Key("recompiles", "recompiles", "int"),
    _Key("staged", "staged", "str", optional=True),
    _Key("hidden", "stage_hidden", "float", optional=True),
    _Key("stage_exposed_s", "stage_exposed_s", "time", optional=True, newer=True),
    _Key("mb", "micro_batches", "strs"),
    _Key("digests", "digests", "strs"),
    _Key("ready_s", "device_ready_s", "floats"),
    _Key("update_ready_s", "update_ready_s", "time", optional=True),
)


# Keys whose values depend on the clock; two runs of the same data differ only in these.
TIME_KEYS = frozenset(k.key for k in _LINE_KEYS if k.kind in ("time", "floats")) | frozenset(
    {"tok_s_dev", "tflops_dev", "mfu", "hidden"}
)


_NONE = "-"


def _format_value(kind: str, value: Any) -> str:
    if value is None:
        return _NONE
    if kind == "bool":
        return "1" if value else "0"
    if kind == "time":
        return f"{value:.6f}"
    if kind == "float":
        return f"{value:.4g}"
    if kind == "exact":
        return repr(float(value))  # shortest string that reads back to the same float
    if kind == "floats":
        return ",".join(f"{v:.6f}" for v in value) or _NONE
    if kind == "strs":
        return ",".join(value) or _NONE
    return str(value)


def format_line(record: StepRecord) -> str:
    """The one human line of a step: `[TrainerBench] step=3 warmup=0 step_s=... mb=... digests=...`."""
    tokens = [LOG_PREFIX]
    for key in _LINE_KEYS:
        value = getattr(record, key.field)
        if key.key == "arm" and not value:
            continue
        tokens.append(f"{key.key}={_format_value(key.kind, value)}")
    return " ".join(tokens)


def _parse_value(key: _Key, text: str) -> Any:
    if text == _NONE and (key.optional or key.kind in ("floats", "strs")):
        return [] if key.kind in ("floats", "strs") else None
    if key.kind == "int":
        return int(text)
    if key.kind == "bool":
        if text not in ("0", "1"):
            raise ValueError(f"{key.key}={text!r} is not 0 or 1")
        return text == "1"
    if key.kind in ("time", "float", "exact"):
        return float(text)
    if key.kind == "floats":
        return [float(v) for v in text.split(",")]
    if key.kind == "strs":
        return text.split(",")
    return text


@dataclasses.dataclass
class ParsedLog:
    """Records read back from a log, and the ruler lines that could not be read (never fatal)."""

    records: list[StepRecord]
    malformed: list[tuple[int, str]]  # (1-based line number, why)


def parse_line(line: str) -> StepRecord:
    """One ruler line back into a record; raises ValueError naming what is wrong."""
    body = line[line.index(LOG_PREFIX) + len(LOG_PREFIX) :].split()
    values: dict[str, str] = {}
    for token in body:
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"token {token!r} is not key=value")
        values[key] = value
    by_key = {k.key: k for k in _LINE_KEYS}
    fields: dict[str, Any] = {"arm": ""}
    for key, text in values.items():
        if key not in by_key:
            raise ValueError(f"unknown key {key!r}")
        fields[by_key[key].field] = _parse_value(by_key[key], text)
    missing = [k.key for k in _LINE_KEYS if k.field not in fields and not k.newer]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return StepRecord(**fields)


def parse(log_text: str) -> ParsedLog:
    """Every `[TrainerBench] step=` line of a log as a record; other lines are skipped.

    Lines of other kinds that share the prefix (configuration, compile, stage, summary lines) do
    not start with `step=` and are not records. A ruler line that does not read back is listed in
    `malformed` with its line number and the reason, so a truncated pod log still yields the rest.
    """
    records, malformed = [], []
    marker = f"{LOG_PREFIX} step="
    for number, line in enumerate(log_text.splitlines(), start=1):
        if marker not in line:
            continue
        try:
            records.append(parse_line(line))
        except (ValueError, TypeError) as error:
            malformed.append((number, str(error)))
    return ParsedLog(records, malformed)


def without_times(line: str) -> str:
    """A ruler line with every clock-dependent value blanked: what two identical runs share."""
    tokens = []
    for token in line.split(" "):
        key, sep, _ = token.partition("=")
        tokens.append(f"{key}=~" if sep and key in TIME_KEYS else token)
    return " ".join(tokens)


# ----------------------------------------------------------------------------------------------
# The table a run ends with: median, min, max and spread of each figure over the scored steps
# ----------------------------------------------------------------------------------------------

# (label, how to read the figure from a record); rows without a value in any scored step are left out.
_SUMMARY_ROWS: tuple[tuple[str, Any], ...] = (
    ("step_s", lambda r: r.step_s),
    ("fwd_bwd dispatch_s (mean)", lambda r: _mean(r.fwd_bwd_dispatch_s)),
    ("fwd_bwd device_s (mean)", lambda r: _mean(r.fwd_bwd_device_s)),
    ("first_call_extra_s", lambda r: r.first_call_extra_s),
    ("update_s", lambda r: r.update_s),
    ("drain_s", lambda r: r.drain_s),
    ("stage_s", lambda r: r.stage_s),
    ("device_wait_s", lambda r: r.device_wait_s),
    ("boundary_idle_s", lambda r: r.boundary_idle_s),
    ("stage_hidden", lambda r: r.stage_hidden),
    ("stage_exposed_s", lambda r: r.stage_exposed_s),
    ("tokens/s/device", lambda r: r.tokens_per_s_per_device),
    ("TFLOP/s/device", lambda r: r.tflops_per_device),
    ("MFU", lambda r: r.mfu),
)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summary(records: Sequence[StepRecord]) -> str:
    """A table of the scored steps: median, min, max and spread ((max - min) / median) per figure."""
    scored = [r for r in records if not r.warmup]
    lines = [
        f"{LOG_PREFIX} summary over {len(scored)} scored steps"
        + (f" (arm {scored[0].arm})" if scored and scored[0].arm else ""),
        f"{'figure':<28}{'median':>14}{'min':>14}{'max':>14}{'spread':>10}",
    ]
    for label, read in _SUMMARY_ROWS:
        values = [v for v in (read(r) for r in scored) if v is not None and math.isfinite(v)]
        if not values:
            continue
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median if median else 0.0
        lines.append(
            f"{label:<28}{median:>14.6g}{min(values):>14.6g}{max(values):>14.6g}{spread:>9.1%}"
        )
    together = _together(scored)
    return "\n".join(lines + ([together] if together else []))


# The rates a run achieved as a whole, each step weighed by its time
_RATES = tuple(
    row for row in _SUMMARY_ROWS if row[0] in ("tokens/s/device", "TFLOP/s/device", "MFU")
)


def _together(scored: Sequence[StepRecord]) -> str | None:
    """The scored steps as one run: their tokens and FLOPs over their summed time.

    A step's rates follow how many real tokens its micro-batches hold: the pool's micro-batches
    differ in padding and each step trains a rotating share of them, so the median step's MFU may
    sit on either side of what the run achieved. This is that figure; over whole turns of the
    pool it weighs every micro-batch alike."""
    time = sum(r.step_s for r in scored)
    rates = []
    for label, read in _RATES:
        values = [read(r) for r in scored]
        if time > 0 and all(v is not None and math.isfinite(v) for v in values):
            rates.append(
                f"{label} {sum(v * r.step_s for v, r in zip(values, scored, strict=True)) / time:.6g}"
            )
    if not rates:
        return None
    return (
        f"{'all scored steps together':<28}"
        + ", ".join(rates)
        + " (their tokens and FLOPs over their summed time)"
    )
