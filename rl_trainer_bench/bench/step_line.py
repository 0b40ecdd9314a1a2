"""The step ruler's log line: one `[TrainerBench] step=...` line per step, and `parse` to read
the lines back into step records.

The log line is what people read in a pod's log, so it is short and stable: key=value tokens after
the prefix, one per figure the line carries. Two pods' logs are often all a user has to compare,
so every figure the A/B reads survives the round trip; `without_times` blanks the clock so two
runs' lines compare.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_trainer_bench.bench.ruler import StepRecord

LOG_PREFIX = "[TrainerBench]"


def stage_line(knob: str, record: StepRecord) -> str:
    """The line after a staged step's ruler line: what was staged and how much of its copy hid."""
    hidden = "-" if record.stage_hidden is None else f"{record.stage_hidden:.3f}"
    return (
        f"{knob} step={record.step} staged={record.staged} stage_s={record.stage_s:.6f}"
        f" device_wait_s={record.device_wait_s:.6f} hidden={hidden}"
    )


@dataclasses.dataclass(frozen=True)
class _Key:
    key: str  # as printed
    field: str  # StepRecord field
    kind: str  # int | bool | str | time | float | exact | floats | strs
    optional: bool = False


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
    missing = [k.key for k in _LINE_KEYS if k.field not in fields]
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
