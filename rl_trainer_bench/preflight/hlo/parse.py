"""Read XLA's HLO text into computations of instructions, with shapes and byte sizes.

The collective-overlap summary needs four things from a compiled program: the instruction order of
each computation (after scheduling, text order is execution order), each instruction's shape (for
bytes and FLOPs), its operands (start/done pairs are linked through them) and its attributes
(replica groups, called computations, trip counts). CPU, GPU and TPU text differ in layouts
(`{1,0:T(8,128)(2,1)S(1)}`), tuple comments (`/*index=5*/`), whether operands carry their shapes and
the debug sections before the first computation; hand-written text (XLA's own tests) also spreads an
instruction over several lines, writes `//` comments inside a body, spaces inside dimensions
(`u32[1, 2]`) and before a layout. This reader accepts all of them and refuses anything else with
the line number, so a truncated or foreign file never yields a silent summary. It reads one module:
a second `HloModule` header or two computations of one name are refused, never half-read
(`hlo.text` splits a file of several modules first).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

from rl_trainer_bench.errors import UserError

# Bytes per element of each HLO primitive type; sub-byte types are rounded up per array.
_BITS = {
    "pred": 8,
    "s2": 2,
    "u2": 2,
    "s4": 4,
    "u4": 4,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "s32": 32,
    "u32": 32,
    "s64": 64,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "token": 0,
}
_FP8 = re.compile(r"^f8e\w+$|^f4e2m1fn$|^f6e\w+$|^f8e8m0fnu$")
# An array and its layout, if any: `f32[2,3]`, `bf16[8,128]{1,0:T(8,128)(2,1)S(1)}`.
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](?:\s*\{([^{}]*)\})?")
# A layout's memory space, `S(n)`; an array whose layout names none is in space 0.
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_COMMENT = re.compile(r"/\*.*?\*/")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
# A non-tuple shape: `f32[2,3]`, `u32[1, 2]`, `f32[2] {1,0}`, `f32[8]{0:T(8)S(1)}`, `token[]`.
_SHAPE = re.compile(r"[a-z][a-z0-9]*\[[^\]]*\](?:\s*\{[^{}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*(->\s*.*)?\{\s*$")
_CALLING_ATTRIBUTES = frozenset(
    {
        "calls",
        "called_computations",
        "to_apply",
        "body",
        "condition",
        "true_computation",
        "false_computation",
        "branch_computations",
    }
)
_CONTINUED_NAME = re.compile(r"%?[\w.\-]+")  # `%b` of `calls=%a, %b`
_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})


class HloParseError(UserError):
    """HLO text that this reader cannot follow; the message carries the file and line number."""


def is_element_type(name: str) -> bool:
    """Whether `name` is an HLO primitive type this reader can size."""
    return name in _BITS or bool(_FP8.match(name))


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of a shape: element type, dimensions (dynamic `<=N` dimensions count as N), the
    memory space its layout names (`S(n)`, else 0) and whether the layout carries a tiling
    (`T(8,128)`, as a TPU program's layouts do). On TPUs space 0 is HBM, 1 the core's VMEM, 2
    its SMEM, 5 the host's pinned memory; a GPU's space 1 holds collective buffers in HBM."""

    dtype: str
    dims: tuple[int, ...]
    memory_space: int = 0
    tiled: bool = False
    # The layout's dimension order, most minor first, and its first tile (`T(8,128)`), where the
    # text gives them: what `stored_bytes` pads to.
    minor_to_major: tuple[int, ...] = dataclasses.field(default=(), compare=False)
    tile: tuple[int, ...] = dataclasses.field(default=(), compare=False)

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> int:
        return (self.elements * self._bits() + 7) // 8

    @property
    def stored_bytes(self) -> int:
        """The bytes the array takes in memory laid out in its tiles: a TPU stores a `[N, 1]`
        array of `T(8,128)` as N rows of 128 lanes, and every pass over it moves them all. The
        tile covers the most minor dimensions; each is rounded up to a whole number of tiles."""
        if not self.tile or len(self.minor_to_major) != len(self.dims):
            return self.bytes
        padded = list(self.dims)
        for size, dim in zip(reversed(self.tile), self.minor_to_major, strict=False):
            padded[dim] = -(-padded[dim] // size) * size
        return (math.prod(padded) * self._bits() + 7) // 8

    @property
    def element_bits(self) -> int:
        """Bits of one element (a sub-byte type's own width)."""
        return self._bits()

    def _bits(self) -> int:
        if self.dtype in _BITS:
            return _BITS[self.dtype]
        if _FP8.match(self.dtype):
            return int(self.dtype[1])
        raise ValueError(f"unknown HLO element type {self.dtype!r}")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction as written: `[ROOT] name = shape opcode(operands), attributes`."""

    name: str
    opcode: str
    arrays: tuple[Array, ...]  # the arrays of its (possibly tuple) result shape, in order
    is_tuple: bool
    operands: tuple[str, ...]  # operand instruction names
    attributes: str  # the raw text after the operand list
    line: int  # 1-based line number in the file
    literal: str = ""  # a constant's value or a parameter's index, as written

    @property
    def bytes(self) -> int:
        return sum(array.bytes for array in self.arrays)

    def attribute(self, key: str) -> str | None:
        """The raw value of `key=...` (balanced over brackets and quotes), or None."""
        for name, value in split_attributes(self.attributes):
            if name == key:
                return value
        return None

    def called_computations(self) -> list[str]:
        """Names of the computations this instruction runs (fusion bodies, loop bodies, branches)."""
        names: list[str] = []
        for key, value in split_attributes(self.attributes):
            if key in _CALLING_ATTRIBUTES:
                names += [n.strip().lstrip("%") for n in value.strip("{}").split(",")]
        return [n for n in names if n]


@dataclasses.dataclass
class Computation:
    name: str
    is_entry: bool
    instructions: list[Instruction]
    line: int

    def by_name(self) -> dict[str, Instruction]:
        return {instruction.name: instruction for instruction in self.instructions}


@dataclasses.dataclass
class HloModule:
    name: str
    attributes: str
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation:
        entries = [c for c in self.computations.values() if c.is_entry]
        return entries[0] if entries else list(self.computations.values())[-1]

    @property
    def is_scheduled(self) -> bool:
        return "is_scheduled=true" in self.attributes

    @property
    def num_partitions(self) -> int:
        match = re.search(r"num_partitions=(\d+)", self.attributes)
        return int(match.group(1)) if match else 1

    @property
    def replica_count(self) -> int:
        match = re.search(r"replica_count=(\d+)", self.attributes)
        return int(match.group(1)) if match else 1

    @property
    def device_count(self) -> int | None:
        """Partitions x replicas when the header records either; None when it records neither."""
        if not re.search(r"\b(num_partitions|replica_count)=\d+", self.attributes):
            return None
        return self.num_partitions * self.replica_count


def parse_shape(text: str) -> tuple[tuple[Array, ...], bool]:
    """The arrays of a shape string (`f32[2,3]{1,0}` or a tuple of them) and whether it is a tuple."""
    text = _COMMENT.sub("", text).strip()
    arrays = tuple(
        Array(
            dtype,
            tuple(_dimension(d) for d in dims.split(",") if d.strip()),
            _memory_space(layout),
            "T(" in layout.partition(":")[2],
            *_order_and_tile(layout),
        )
        for dtype, dims, layout in _ARRAY.findall(text)  # layouts hold no brackets
    )
    return arrays, text.startswith("(")


_TILE = re.compile(r"T\(([\d,]+)\)")


def _order_and_tile(layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A layout's dimension order (`1,0`) and its first tile's sizes (`T(8,128)`); () for either
    the layout does not give."""
    order, _, tiling = layout.partition(":")
    try:
        minor_to_major = tuple(int(d) for d in order.split(",") if d.strip())
    except ValueError:
        minor_to_major = ()
    tile = _TILE.search(tiling)
    return minor_to_major, tuple(int(t) for t in tile.group(1).split(",")) if tile else ()


def _memory_space(layout: str) -> int:
    """The memory space a layout (`1,0:T(8,128)S(1)`) names after its colon; 0 where none."""
    tiling = layout.partition(":")[2]
    match = _MEMORY_SPACE.search(tiling)
    return int(match.group(1)) if match else 0


def _dimension(text: str) -> int:
    """A dimension's size; a bounded dynamic one (`<=N`) counts as N, an unbounded one (`?`) as 0."""
    size = text.strip().removeprefix("<=")
    return int(size) if size.isdigit() else 0


def split_attributes(text: str) -> Iterator[tuple[str, str]]:
    """`key=value` pairs of an attribute list, split at commas outside brackets and quotes.

    XLA prints a list of called computations without braces where an opcode has no spelling of
    its own (`calls=%a, %b`): a bare name after a pair continues that pair's value.
    """
    key, value = "", ""
    for piece in _split_top_level(text):
        name, sep, rest = piece.partition("=")
        if sep:
            if key:
                yield key, value
            key, value = name.strip(), rest.strip()
        elif key and _CONTINUED_NAME.fullmatch(piece):
            value = f"{value}, {piece}"
    if key:
        yield key, value


def _split_top_level(text: str) -> list[str]:
    pieces, current, depth, quote = [], [], 0, ""
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            current.append(char)
            if char == "\\":
                current.append(text[index + 1 : index + 2])
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
            current.append(char)
        elif char in "([{":
            depth += 1
            current.append(char)
        elif char in ")]}":
            depth -= 1
            current.append(char)
        elif char == "," and depth == 0:
            pieces.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    if "".join(current).strip():
        pieces.append("".join(current))
    return [piece.strip() for piece in pieces if piece.strip()]


def _bracket_depths(text: str, start: int = 0):
    """(index, bracket depth after that character) from `start` on; brackets in quotes don't count."""
    depth, quote = 0, ""
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if char == quote and text[index - 1] != "\\":
                quote = ""
        elif char == '"':
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        yield index, depth


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at `text[start]`; -1 when it never closes."""
    return next((index + 1 for index, depth in _bracket_depths(text, start) if depth == 0), -1)


def parse_instruction(text: str, line: int) -> Instruction | None:
    """One instruction line, or None when the line is not of the instruction form."""
    head = _INSTRUCTION.match(text)
    if head is None:
        return None
    rest = text[head.end() :]
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        shape = _SHAPE.match(rest)
        end = shape.end() if shape else -1
    if end < 0:
        return None
    shape_text, rest = rest[:end], rest[end:]
    opcode = _OPCODE.match(rest)
    if opcode is None:
        return None
    open_paren = opcode.end() - 1
    close = _balanced(rest, open_paren)
    if close < 0:
        return None
    operand_text = rest[open_paren + 1 : close - 1]
    arrays, is_tuple = parse_shape(shape_text)
    if not arrays and "token" not in shape_text and shape_text.strip("() ") != "":
        return None
    if not all(is_element_type(array.dtype) for array in arrays):
        return None  # `f3x[2]`: not a type XLA has, so not an instruction
    name = opcode.group(1)
    # A constant's parentheses hold its literal and a parameter's its index, not operands.
    operands = () if name in ("constant", "parameter") else tuple(_operand_names(operand_text))
    return Instruction(
        name=head.group(2),
        opcode=name,
        arrays=arrays,
        is_tuple=is_tuple,
        operands=operands,
        attributes=rest[close:].lstrip(", ").strip(),
        line=line,
        literal=operand_text.strip() if name in ("constant", "parameter") else "",
    )


def _operand_names(text: str) -> Iterator[str]:
    """Operand names; older text writes `f32[2]{0} %x`, newer just `%x`."""
    for piece in _split_top_level(_COMMENT.sub("", text)):
        word = piece.split()[-1]
        yield word.lstrip("%")


def parse_hlo(text: str, source: str = "<hlo>", first_line: int = 1) -> HloModule:
    """Parse one HLO module; HloParseError names `source` and the line for anything unexpected.

    `first_line` is the file line of `text`'s first line, so a module cut from a longer file is
    reported with the file's line numbers.
    """
    reader = _ModuleReader(source)
    for number, raw in enumerate(text.splitlines(), start=first_line):
        reader.read_line(number, raw.rstrip())
    return reader.module(first_line)


class _ModuleReader:
    """One pass over a module's lines. Inside a computation's braces lines are instructions, which
    may continue over several lines; outside them only the module header, debug sections and
    computation headers may stand, so anything else is refused with its line number."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.name, self.attributes = "", ""
        self.computations: dict[str, Computation] = {}
        self.current: Computation | None = None  # the computation whose body is being read
        self.statement: list[str] = []  # the lines of the instruction being read
        self.statement_line = 0
        self.in_section = False  # inside a debug section (`FileNames` ...) before the bodies

    def read_line(self, number: int, line: str) -> None:
        """Read one line (trailing white space already gone)."""
        if self.current is not None:
            self._read_body_line(number, line)
        else:
            self._read_outer_line(number, line.strip())

    def module(self, first_line: int) -> HloModule:
        """The module once every line is read; a computation left open means a truncated file."""
        if self.current is not None:
            raise HloParseError(
                f"{self.source}:{self.current.line}: computation {self.current.name} is never "
                "closed with '}' (truncated file?)"
            )
        if not self.computations:
            raise HloParseError(
                f"{self.source}:{first_line}: no HLO computation found; is this an HLO text file?"
            )
        return HloModule(self.name, self.attributes, self.computations)

    def _read_body_line(self, number: int, line: str) -> None:
        """An instruction, a continuation of the one being read, or the body's closing brace."""
        code = strip_line_comment(line).rstrip()
        if not code.strip():
            return
        if self._inside_statement(code):
            self.statement.append(code.strip())  # a `}` closing a multi-line attribute's braces
        elif code.strip() == "}" or code.strip().startswith("},"):  # `}, execution_thread=..`
            self._finish_statement()
            self._close_computation()
        elif self.statement and _continues(" ".join(self.statement), code):
            self.statement.append(code.strip())
        else:
            self._finish_statement()
            self.statement.append(code)
            self.statement_line = number

    def _inside_statement(self, code: str) -> bool:
        """A line indented past the instruction being read, while that instruction leaves brackets
        open: a multi-line `backend_config` closes its objects on lines of their own (`},`),
        which would otherwise read as the computation's closing brace."""
        if not self.statement:
            return False
        first = self.statement[0]
        deeper = len(code) - len(code.lstrip()) > len(first) - len(first.lstrip())
        return deeper and _open_brackets(" ".join(self.statement)) > 0

    def _finish_statement(self) -> None:
        """Parse the instruction read so far into the current computation."""
        if not self.statement:
            return
        joined = " ".join(self.statement)
        instruction = parse_instruction(joined, self.statement_line)
        if instruction is None:
            raise HloParseError(
                f"{self.source}:{self.statement_line}: not an HLO instruction "
                f"({_excerpt(joined.strip())}); "
                "pass the text of a compiled module (compiled.as_text() or an XLA dump)"
            )
        self.current.instructions.append(instruction)
        self.statement.clear()

    def _close_computation(self) -> None:
        """Keep the finished computation; a second one of the same name would shadow the first."""
        current = self.current
        if current.name in self.computations:
            raise HloParseError(
                f"{self.source}:{current.line}: a second computation named {current.name} "
                f"(the first is at line {self.computations[current.name].line}); names must be "
                "unique within a module"
            )
        self.computations[current.name] = current
        self.current = None

    def _read_outer_line(self, number: int, stripped: str) -> None:
        """Between bodies: blank lines, comments, the module header, debug sections, a header."""
        if not stripped or stripped.startswith("//"):
            self.in_section = False if not stripped else self.in_section
            return
        if stripped.startswith("HloModule "):
            self._read_module_header(number, stripped)
            return
        if stripped in _SECTIONS:
            self.in_section = True
            return
        if self.in_section and re.match(r"^\d+\s", stripped):
            return
        header = _HEADER.match(strip_line_comment(stripped).strip())
        if header is None:
            raise HloParseError(
                f"{self.source}:{number}: expected a computation header such as "
                f"'ENTRY %main (p: f32[2]) -> f32[2] {{', found {_excerpt(stripped)}"
            )
        self.current = Computation(header.group(2), bool(header.group(1)), [], number)

    def _read_module_header(self, number: int, stripped: str) -> None:
        """The module's name and attributes; a second header means two modules in one text."""
        if self.name:
            raise HloParseError(
                f"{self.source}:{number}: a second HloModule ({_excerpt(stripped)}); this reader "
                "takes one module at a time"
            )
        name, _, self.attributes = stripped[len("HloModule ") :].partition(",")
        self.name = name.strip()


def strip_line_comment(line: str) -> str:
    """`line` without a `//` comment; `//` inside a quoted string (a file path) is kept."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote and line[index - 1] != "\\":
                quote = ""
        elif char == '"':
            quote = char
        elif line.startswith("//", index):
            return line[:index]
    return line


def _continues(statement: str, line: str) -> bool:
    """Whether `line` carries on the instruction in `statement` rather than starting a new one.

    It does while brackets are open, after a trailing `,` or `=`, before a leading `,`, and while
    the statement is not yet a whole instruction (`ROOT %x = f32[4]` then `all-reduce(...)`).
    """
    if _open_brackets(statement) > 0:
        return True
    if statement.rstrip().endswith((",", "=")) or line.lstrip().startswith(","):
        return True
    return parse_instruction(statement, 0) is None and _INSTRUCTION.match(line) is None


def _open_brackets(text: str) -> int:
    """Brackets `text` leaves open (an instruction continued on the next line)."""
    return next(reversed([depth for _, depth in _bracket_depths(text)]), 0)


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
