"""Device time by package function, from a profiler trace of a run and its programs' HLO.

`aot`'s cost by source (`benchmarks/tpu_cost_by_source.py`) says where a compiled program's work
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

from rl_trainer_bench.preflight.hlo.parse import parse_hlo
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
    """The events of the newest `*.trace.json.gz` under `folder` (a profile folder)."""
    traces = sorted(folder.rglob("*.trace.json.gz"))
    if not traces:
        raise FileNotFoundError(f"no *.trace.json.gz under {folder}: was the run profiled?")
    with gzip.open(traces[-1]) as trace:
        return json.load(trace)["traceEvents"]


def op_events(events: Iterable[dict]) -> list[OpEvent]:
    """The op events of the first device's line, or the host runtime's where no device has one,
    each with its own time: an op's span less the spans of the ops inside it (a loop's op holds
    its body's), so no time is counted twice."""
    events = list(events)
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
    }
    spans = [e for e in events if e.get("ph") == "X"]
    devices = sorted(pid for (pid, tid), n in names.items() if tid is None and "/device:" in n)
    for device in devices:
        on_device = [e for e in spans if e["pid"] == device]
        ops = [e for e in on_device if names.get((device, e.get("tid"))) == "XLA Ops"]
        if ops:
            modules = [e for e in on_device if names.get((device, e.get("tid"))) == "XLA Modules"]
            return [
                OpEvent(
                    _module_around(op, modules), op.get("args", {}).get("hlo_op", op["name"]), own
                )
                for op, own in _own_seconds(ops)
            ]
    ops = [e for e in spans if {"hlo_op", "hlo_module"} <= e.get("args", {}).keys()]
    ordinals = {e["args"].get("device_ordinal", "") for e in ops}
    first = min(ordinals, key=lambda o: (not o.isdigit(), int(o) if o.isdigit() else 0, o))
    ops = [e for e in ops if e["args"].get("device_ordinal", "") == first]
    return [
        OpEvent(op["args"]["hlo_module"], op["args"]["hlo_op"], own)
        for op, own in _own_seconds(ops)
    ]


def _module_around(op: dict, modules: list[dict]) -> str:
    """The program an op on a device's line belongs to: its own `hlo_module`, else the name of
    the "XLA Modules" event whose span holds it, without the program id."""
    named = op.get("args", {}).get("hlo_module")
    if named is not None:
        return named
    around = (m for m in modules if m["ts"] <= op["ts"] < m["ts"] + m["dur"])
    return _PROGRAM_ID.sub("", next(around, {"name": ""})["name"])


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


def dumped_sources(folder: Path) -> dict[str, dict[str, str]]:
    """{program name: {op name: source}} from every `*after_optimizations.txt` under `folder`.

    Two dumps of one program name are merged (a program compiled twice, as `MEASURE_PEAK`
    does, names its ops alike); programs that differ must differ in name, as the built-in
    engine's do (`jit_fwd_bwd`, `jit_fwd_bwd_dropless`, `jit_update`)."""
    sources: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(folder.rglob("*after_optimizations.txt")):
        text = path.read_text(errors="replace")
        named = _MODULE_NAME.match(text)
        if named:
            sources[named.group(1)].update(op_sources(parse_hlo(text, str(path)), text))
    return dict(sources)


def time_by_source(ops: Iterable[OpEvent], sources: Mapping[str, Mapping[str, str]]) -> list[dict]:
    """Rows per source function: device seconds and op events, the largest first."""
    totals: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "events": 0})
    for op in ops:
        row = totals[sources.get(op.module, {}).get(op.op, NOT_IN_HLO)]
        row["seconds"] += op.seconds
        row["events"] += 1
    rows = [{"source": source, **row} for source, row in totals.items()]
    return sorted(rows, key=lambda row: -row["seconds"])


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
