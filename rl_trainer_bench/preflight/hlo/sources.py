"""Which function of the package each op of a compiled HLO module came from.

A compiled module's text carries the Python stack of every op (`stack_frame_id=` on the op, and
the FileNames, FunctionNames, FileLocations and StackFrames tables after the computations). A cost
table by op name says little to the engine's author; charged to the innermost frame that lies in
the package (`moe.py:expert_matmul`, `loss.py:token_logps`) it says which code to change. Both the
compiled program's static cost (`benchmarks/tpu_cost_by_source.py`) and a profiler trace's
measured op times (`trace_ops.py`) are charged this way.
"""

from __future__ import annotations

import re
from pathlib import Path

from rl_trainer_bench.preflight.hlo.parse import HloModule, Instruction

PACKAGE = "rl_trainer_bench/"
NO_PACKAGE_FRAME = "(no package frame)"
NO_STACK = "(no stack)"
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_FRAME = re.compile(r"stack_frame_id=(\d+)")


def stack_tables(text: str) -> dict[str, dict[int, str]]:
    """The HLO text's FileNames, FunctionNames, FileLocations and StackFrames tables by id."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        if line in _TABLES:
            current = tables.setdefault(line, {})
        elif current is not None and (row := _TABLE_ROW.match(line)):
            current[int(row.group(1))] = row.group(2)
        elif not line.strip() or line.startswith(("HloModule", "ENTRY", "%")):
            current = None
    return tables


def source_of(frame_id: int, tables: dict[str, dict[int, str]], package: str = PACKAGE) -> str:
    """`file.py:function` of the innermost frame of the stack that lies in `package`; a stack
    the tables cannot follow (a dump cut short) reads as no package frame."""
    seen = set()
    frames = tables.get("StackFrames", {})
    while frame_id in frames and frame_id not in seen:
        seen.add(frame_id)
        frame = _fields(frames[frame_id])
        location = _fields(tables.get("FileLocations", {}).get(frame.get("file_location_id"), ""))
        path = tables.get("FileNames", {}).get(location.get("file_name_id"), "").strip('"')
        names = tables.get("FunctionNames", {})
        function = names.get(location.get("function_name_id"), "").strip('"')
        if package in path and function:
            return f"{Path(path).name}:{function}"
        parent = frame.get("parent_frame_id", frame_id)
        frame_id = parent if parent != frame_id else -1  # a root frame names itself
    return NO_PACKAGE_FRAME


def _fields(row: str) -> dict[str, int]:
    return {k: int(v) for k, v in _FIELD.findall(row)}


def instruction_source(
    instruction: Instruction, tables: dict[str, dict[int, str]], package: str = PACKAGE
) -> str:
    """The package function `instruction` came from, or `(no stack)` for an op the compiler
    made without one (copies and layout changes it adds)."""
    frame = _FRAME.search(instruction.attributes)
    return source_of(int(frame.group(1)), tables, package) if frame else NO_STACK


def op_sources(module: HloModule, text: str, package: str = PACKAGE) -> dict[str, str]:
    """{op name: source} for every instruction of every computation of `module` (parsed from
    `text`): the names a profiler trace gives the ops it times."""
    tables = stack_tables(text)
    return {
        instruction.name: instruction_source(instruction, tables, package)
        for computation in module.computations.values()
        for instruction in computation.instructions
    }
