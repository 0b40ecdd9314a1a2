"""Which function of the package each op of a compiled HLO module came from.

A compiled module's text carries the Python stack of every op (`stack_frame_id=` on the op, and
the FileNames, FunctionNames, FileLocations and StackFrames tables after the computations). A cost
table by op name says little to the engine's author; charged to the innermost frame that lies in
the package (`moe.py:expert_matmul`, `loss.py:token_logps`) it says which code to change. Both the
compiled program's static cost (`benchmarks/aot/tpu_cost_by_source.py`) and a profiler trace's
measured op times (`trace_ops.py`) are charged this way.
"""

from __future__ import annotations

import re
from pathlib import Path

from rl_trainer_bench.preflight.hlo.parse import HloModule, Instruction

PACKAGE = "rl_trainer_bench/"
NO_PACKAGE_FRAME = "(no package frame)"
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
    """`file.py:function` of the innermost frame of the stack that lies in `package`; with none
    there, `(no package frame: file.py:function)` naming the stack's innermost frame (JAX's or a
    library's: where to look next), and a stack the tables cannot follow (a dump cut short) reads
    as `(no package frame)`."""
    seen = set()
    frames = tables.get("StackFrames", {})
    innermost = ""
    while frame_id in frames and frame_id not in seen:
        seen.add(frame_id)
        frame = _fields(frames[frame_id])
        location = _fields(tables.get("FileLocations", {}).get(frame.get("file_location_id"), ""))
        path = tables.get("FileNames", {}).get(location.get("file_name_id"), "").strip('"')
        names = tables.get("FunctionNames", {})
        function = names.get(location.get("function_name_id"), "").strip('"')
        if package in path and function:
            return f"{Path(path).name}:{function}"
        innermost = innermost or (f"{Path(path).name}:{function}" if path and function else "")
        parent = frame.get("parent_frame_id", frame_id)
        frame_id = parent if parent != frame_id else -1  # a root frame names itself
    return f"(no package frame: {innermost})" if innermost else NO_PACKAGE_FRAME


def _fields(row: str) -> dict[str, int]:
    return {k: int(v) for k, v in _FIELD.findall(row)}


def instruction_source(
    instruction: Instruction,
    tables: dict[str, dict[int, str]],
    package: str = PACKAGE,
    enclosing: str = "",
) -> str:
    """The package function `instruction` came from; for an op the compiler made without a
    stack (copies, layout changes, a loop's bookkeeping), `(no stack: opcode)`, and `, in
    file.py:function` where the loop, call or fusion that runs it (`enclosing`) came from one."""
    frame = _FRAME.search(instruction.attributes)
    if frame:
        return source_of(int(frame.group(1)), tables, package)
    return f"(no stack: {instruction.opcode}{f', in {enclosing}' if enclosing else ''})"


def op_sources(module: HloModule, text: str, package: str = PACKAGE) -> dict[str, str]:
    """{op name: source} for every instruction of every computation of `module` (parsed from
    `text`): the names a profiler trace gives the ops it times. An op with no stack of its own
    is placed in the package function its computation runs for (`enclosing_sources`)."""
    tables = stack_tables(text)
    enclosing = enclosing_sources(module, tables, package)
    return {
        instruction.name: instruction_source(instruction, tables, package, enclosing.get(name, ""))
        for name, computation in module.computations.items()
        for instruction in computation.instructions
    }


def enclosing_sources(
    module: HloModule, tables: dict[str, dict[int, str]], package: str = PACKAGE
) -> dict[str, str]:
    """{computation: the package function its nearest caller came from} for every computation
    some instruction runs (a while loop's body and condition, a fusion's, a call's): the scan
    whose loop a body's stackless ops keep. A caller with no package frame passes on its own
    computation's; computations no package frame reaches are left out."""
    callers = {
        called: (name, instruction)
        for name, computation in module.computations.items()
        for instruction in computation.instructions
        for called in instruction.called_computations()
    }
    found: dict[str, str] = {}

    def of(name: str, seen: frozenset[str]) -> str:
        if name in found or name not in callers or name in seen:
            return found.get(name, "")
        computation, caller = callers[name]
        own = _FRAME.search(caller.attributes)
        source = source_of(int(own.group(1)), tables, package) if own else ""
        if not source or source.startswith("("):
            source = of(computation, seen | {name})
        found[name] = source
        return source

    return {name: source for name in callers if (source := of(name, frozenset()))}
