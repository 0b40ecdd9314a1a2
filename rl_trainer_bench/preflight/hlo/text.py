"""HLO input for `hlo-overlap`: a file's bytes into one text per module, canonical where needed.

Dumps arrive gzipped, concatenated (several `HloModule`s in one file) or written by hand in the
forms XLA's own tests use. A gzipped file is unpacked; anything else that is not UTF-8 text (a
binary HLO proto) is refused with a one-line error. A file of several modules is cut at each
`HloModule` header, so each module gets its own report and none is half-read.

Each module is read as written first, so the report's line numbers are the file's. When that
reader refuses a module, the module goes through XLA's own HLO parser, when this process has one
(jaxlib's `hlo_module_from_text`, a private module imported defensively), and its canonical
printing (one instruction per line, every operand named, layouts attached) is read instead; line
numbers then refer to that printing, which the report says. Without XLA's parser, or when XLA
refuses the text too, the reader's own error stands.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Callable

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo.parse import HloModule, HloParseError, parse_hlo

# Indented too: XLA's C++ tests hold their modules in indented raw strings, pasted as they are
_MODULE_HEADER = re.compile(r"^[ \t]*HloModule\s", re.MULTILINE)
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_UNPACKED = 1 << 32  # 4 GiB of text: larger than any program's dump, smaller than a zip bomb


@dataclasses.dataclass(frozen=True)
class ModuleText:
    """One module's text and where it starts in its file."""

    text: str
    first_line: int


@dataclasses.dataclass(frozen=True)
class ReadModule:
    """A parsed module and whether its line numbers are XLA's canonical printing's."""

    module: HloModule
    canonical: bool


def decode(data: bytes, source: str) -> str:
    """The text of an HLO file's bytes: gunzipped when gzipped; UserError for other binary data."""
    if data.startswith(_GZIP_MAGIC):
        try:
            unpacker = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            data = unpacker.decompress(data, _MAX_UNPACKED)
        except zlib.error as error:
            raise UserError(
                f"{source}: a damaged gzip file ({error}); pass the dump again"
            ) from None
        if unpacker.unconsumed_tail:
            raise UserError(f"{source}: unpacks to more than 4 GiB; pass one program's HLO text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{source}: byte {error.start} is not UTF-8 text (a binary HLO proto?); pass HLO text, "
            "e.g. compiled.as_text() or an XLA dump with --xla_dump_hlo_as_text"
        ) from None


def split_modules(text: str) -> list[ModuleText]:
    """One text per `HloModule` header (the whole text when it has at most one)."""
    starts = [match.start() for match in _MODULE_HEADER.finditer(text)]
    if len(starts) <= 1:
        return [ModuleText(text, 1)]
    starts[0] = 0  # comments before the first header stay with the first module
    bounds = [*starts[1:], len(text)]
    return [
        ModuleText(text[start:end], text.count("\n", 0, start) + 1)
        for start, end in zip(starts, bounds, strict=True)
    ]


def xla_canonical_text(text: str) -> str | None:
    """XLA's canonical printing of one module, or None without XLA's parser or when it refuses."""
    parse = _xla_parser()
    if parse is None:
        return None
    try:
        return parse(text).to_string()
    except (RuntimeError, ValueError, TypeError):  # XLA's status errors are RuntimeErrors
        return None


def _xla_parser() -> Callable | None:
    try:
        from jax._src.lib import xla_client  # private: absent, renamed or moved in other versions
    except ImportError:
        return None
    return getattr(getattr(xla_client, "hlo", None), "hlo_module_from_text", None)


def read_module(module_text: ModuleText, source: str) -> ReadModule:
    """Parse one module as written, else XLA's canonical printing of it (see the module doc)."""
    try:
        return ReadModule(parse_hlo(module_text.text, source, module_text.first_line), False)
    except HloParseError as as_written:
        canonical = xla_canonical_text(module_text.text)
        if canonical is None:
            raise as_written from None
        where = f"{source} (module at line {module_text.first_line}, as XLA prints it)"
        return ReadModule(parse_hlo(canonical, where), True)


def read_modules(data: bytes, source: str) -> list[ReadModule]:
    """Every module of an HLO file, each read whole."""
    return [read_module(part, source) for part in split_modules(decode(data, source))]
