"""Device time by package function, from a profiler trace of a run and its programs' HLO.

`aot`'s cost by source (`benchmarks/aot/tpu_cost_by_source.py`) says where a compiled program's work
is; a trace of the run says where its time went. The trace times each op the device ran by its
HLO name (`fusion.123`), which says nothing to the engine's author until the op is found in the
program's compiled text and charged to the function it came from (`sources.py`). This joins the
two: every op event of the trace, summed by (program, op), charged to its source function.

Which events are ops, in `jax.profiler`'s Chrome trace (`*.trace.json.gz`):
- on an accelerator, the events of a device process's (`/device:TPU:0`) "XLA Ops" line, each
  inside an event of its "XLA Modules" line naming the program (`jit_fwd_bwd(17)`: the program
  id in parentheses is dropped), unless the op event names its module itself;
- on the host CPU, the XLA runtime's events that name their op and module in `args` (`hlo_op`,
  `hlo_module`), of the first device (`device_ordinal`): host devices run side by side.
The programs' compiled text comes from XLA's dump (`--xla_dump_to=DIR --xla_dump_hlo_as_text`;
each `*after_optimizations.txt`), so any engine's programs can be read, not only the built-in's.
An op that no given text holds is charged to `(op not in the HLO given)`, never dropped.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo.parse import Instruction, parse_hlo
from rl_trainer_bench.preflight.hlo.sources import op_sources

NOT_IN_HLO = "(op not in the HLO given)"
_MODULE_NAME = re.compile(r"^HloModule ([^\s,]+)")
_PROGRAM_ID = re.compile(r"\(\d+\)$")


@dataclasses.dataclass(frozen=True)
class OpEvent:
    """One op the device ran: its program, its HLO name and how long it took (seconds)."""

    module: str
    op: str
    seconds: float


def read_trace(folder: Path) -> list[dict]:
    """The events of the newest `*.trace.json.gz` under `folder` (a profile folder): the
    metadata events that name processes and threads, and the spans with a place and a time.

    Raises FileNotFoundError where there is none and ValueError where it is not such a trace
    (empty, cut short, not gzip, not JSON, or JSON of another shape)."""
    traces = sorted(folder.rglob("*.trace.json.gz"))
    if not traces:
        raise FileNotFoundError(f"no *.trace.json.gz under {folder}: was the run profiled?")
    try:
        with gzip.open(traces[-1], "rt", encoding="utf-8") as trace:
            events = json.load(trace).get("traceEvents")
    except (OSError, EOFError, UnicodeDecodeError, ValueError, AttributeError) as error:
        raise ValueError(f"{traces[-1]}: not a gzipped Chrome trace ({error})") from None
    if not isinstance(events, list):
        raise ValueError(f"{traces[-1]}: not a Chrome trace (no traceEvents list)")
    return [e for e in events if _well_formed(e)]


def _well_formed(event: object) -> bool:
    if not isinstance(event, dict) or "pid" not in event:
        return False
    if event.get("ph") == "M":
        return isinstance(event.get("args"), dict) and isinstance(event["args"].get("name"), str)
    if event.get("ph") == "X":
        numbers = (event.get("ts"), event.get("dur"))
        return all(isinstance(n, (int, float)) for n in numbers) and isinstance(
            event.get("args", {}), dict
        )
    return False


def device_lines(events: Iterable[dict]) -> dict[str, list[dict]]:
    """The first device's lines, by thread name ("XLA Modules", "XLA Ops", ...), each its spans
    in time order; empty where no device process is in the trace (the host CPU's)."""
    events = list(events)
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
    }
    devices = sorted(pid for (pid, tid), n in names.items() if tid is None and "/device:" in n)
    lines: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if devices and e.get("ph") == "X" and e["pid"] == devices[0]:
            lines[names.get((e["pid"], e.get("tid")), "")].append(e)
    return {name: sorted(line, key=lambda e: e["ts"]) for name, line in lines.items()}


def op_events(events: Iterable[dict]) -> list[OpEvent]:
    """The op events of the first device's "XLA Ops" line, or the host runtime's where the trace
    has none, each with its own time: an op's span less the spans of the ops inside it (a loop's
    op holds its body's), so no time is counted twice."""
    events = list(events)
    lines = device_lines(events)
    if lines.get("XLA Ops"):
        modules = lines.get("XLA Modules", [])
        return [
            OpEvent(
                _module_around(op, modules),
                str(op.get("args", {}).get("hlo_op", op.get("name"))),
                own,
            )
            for op, own in _own_seconds(lines["XLA Ops"])
        ]
    spans = [e for e in events if e.get("ph") == "X"]
    ops = [e for e in spans if {"hlo_op", "hlo_module"} <= e.get("args", {}).keys()]
    if not ops:
        return []
    first = min((_ordinal(e) for e in ops), key=lambda o: (not o.isdigit(), len(o), o))
    ops = [e for e in ops if _ordinal(e) == first]
    return [
        OpEvent(str(op["args"]["hlo_module"]), str(op["args"]["hlo_op"]), own)
        for op, own in _own_seconds(ops)
    ]


def _ordinal(event: dict) -> str:
    return str(event["args"].get("device_ordinal", ""))


def _module_around(op: dict, modules: list[dict]) -> str:
    """The program an op on a device's line belongs to: its own `hlo_module`, else the name of
    the "XLA Modules" event whose span holds it, without the program id."""
    named = op.get("args", {}).get("hlo_module")
    if named is not None:
        return str(named)
    around = (m for m in modules if m["ts"] <= op["ts"] < m["ts"] + m["dur"])
    return _PROGRAM_ID.sub("", str(next(around, {}).get("name", "")))


def _own_seconds(ops: list[dict]) -> list[tuple[dict, float]]:
    """Each op with its span less the spans of the ops nested directly inside it on its line."""
    own = {id(op): op["dur"] for op in ops}
    lines: dict[tuple, list[dict]] = defaultdict(list)
    for op in ops:
        lines[(op["pid"], op.get("tid"))].append(op)
    for line in lines.values():
        open_ops: list[dict] = []
        for op in sorted(line, key=lambda e: (e["ts"], -e["dur"])):
            while open_ops and op["ts"] >= open_ops[-1]["ts"] + open_ops[-1]["dur"]:
                open_ops.pop()
            if open_ops:
                own[id(open_ops[-1])] -= op["dur"]
            open_ops.append(op)
    return [(op, own[id(op)] / 1e6) for op in ops]


def dumped_ops(folder: Path) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """({program name: {op name: source}}, {program name: {op name: what it is}}) from every
    `*after_optimizations.txt` under `folder`; what an op is: its opcode and result shapes
    (`fusion bf16[40960,2048]`), which a reader needs once the dump is gone.

    A file that is no module's text is refused (UserError), as `parse_hlo` refuses one cut short.
    Two dumps of one program name are merged (a program compiled twice, as `MEASURE_PEAK`
    does, names its ops alike); programs that differ must differ in name, as the built-in
    engine's do (`jit_fwd_bwd`, `jit_fwd_bwd_dropless`, `jit_update`)."""
    sources: dict[str, dict[str, str]] = defaultdict(dict)
    descriptions: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(folder.rglob("*after_optimizations.txt")):
        text = path.read_text(errors="replace")
        named = _MODULE_NAME.match(text)
        if not named:
            raise UserError(f"{path}: not an HLO module's text (no 'HloModule' line first)")
        module = parse_hlo(text, str(path))
        sources[named.group(1)].update(op_sources(module, text))
        descriptions[named.group(1)].update(
            (op.name, _described(op)) for computation in module.computations.values()
            for op in computation.instructions
        )  # fmt: skip
    return dict(sources), dict(descriptions)


def _described(op: Instruction) -> str:
    """An instruction's opcode and result shapes: `fusion bf16[40960,2048]`."""
    shapes = ",".join(f"{a.dtype}[{','.join(map(str, a.dims))}]" for a in op.arrays[:3])
    return f"{op.opcode} {shapes}" + (",..." if len(op.arrays) > 3 else "")


def time_by_source(ops: Iterable[OpEvent], sources: Mapping[str, Mapping[str, str]]) -> list[dict]:
    """Rows per source function: device seconds and op events, the largest first."""
    totals: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "events": 0})
    for op in ops:
        row = totals[sources.get(op.module, {}).get(op.op, NOT_IN_HLO)]
        row["seconds"] += op.seconds
        row["events"] += 1
    rows = [{"source": source, **row} for source, row in totals.items()]
    return sorted(rows, key=lambda row: -row["seconds"])


def time_by_op(ops: Iterable[OpEvent], sources: Mapping[str, Mapping[str, str]], source: str):
    """The ops charged to `source`, a row per (program, op): device seconds and op events, the
    largest first."""
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: {"seconds": 0.0, "events": 0})
    for op in ops:
        if sources.get(op.module, {}).get(op.op, NOT_IN_HLO) == source:
            row = totals[(op.module, op.op)]
            row["seconds"] += op.seconds
            row["events"] += 1
    rows = [{"module": module, "op": name, **row} for (module, name), row in totals.items()]
    return sorted(rows, key=lambda row: -row["seconds"])


def ops_table(rows: list[dict], steps: int, top: int, descriptions: Mapping) -> str:
    """Markdown rows of `time_by_op`'s: program, op, what it is, ms per step, events per step."""
    lines = [
        "| program | op | what it is | ms per step | events per step |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows[:top]:
        described = descriptions.get(row["module"], {}).get(row["op"], "?")
        lines.append(
            f"| {row['module']} | {row['op']} | `{described}` |"
            f" {1e3 * row['seconds'] / steps:.2f} | {row['events'] / steps:g} |"
        )
    return "\n".join(lines)


def time_by_kind(rows: list[dict], descriptions: Mapping) -> list[dict]:
    """`time_by_op`'s rows summed per (program, what the op is): a function's thousands of small
    ops (a loop's scalar compares, each its own instruction) are one row here, where no one of
    them reaches the top of `ops_table`; the largest first, each with its count of ops."""
    totals: dict[tuple[str, str], dict] = defaultdict(
        lambda: {"seconds": 0.0, "events": 0, "ops": 0}
    )
    for row in rows:
        kind = totals[(row["module"], descriptions.get(row["module"], {}).get(row["op"], "?"))]
        kind["seconds"] += row["seconds"]
        kind["events"] += row["events"]
        kind["ops"] += 1
    kinds = [{"module": module, "kind": kind, **row} for (module, kind), row in totals.items()]
    return sorted(kinds, key=lambda row: -row["seconds"])


def kinds_table(kinds: list[dict], steps: int, top: int) -> str:
    """Markdown rows of `time_by_kind`'s: program, what the ops are, how many, ms and events per
    step."""
    lines = [
        "| program | what the ops are | ops | ms per step | events per step |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in kinds[:top]:
        lines.append(
            f"| {row['module']} | `{row['kind']}` | {row['ops']} |"
            f" {1e3 * row['seconds'] / steps:.2f} | {row['events'] / steps:g} |"
        )
    return "\n".join(lines)


def markdown_table(rows: list[dict], steps: int, top: int) -> str:
    """Markdown rows: source, ms per step, share of the ops' time, op events per step."""
    total = sum(row["seconds"] for row in rows) or 1.0
    lines = [
        "| source function | ms per step | share | ops per step |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows[:top]:
        lines.append(
            f"| `{row['source']}` | {1e3 * row['seconds'] / steps:.2f} |"
            f" {row['seconds'] / total:.1%} | {row['events'] / steps:g} |"
        )
    lines.append(f"| all ops | {1e3 * total / steps:.2f} | 100% | |")
    return "\n".join(lines)
