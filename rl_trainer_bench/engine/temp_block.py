"""The device-memory block XLA's buffer assignment allocates for a compiled TPU program's temporaries.

Loading a program allocates its arguments' and outputs' buffers and one preallocated block per
memory space for everything else; on TPU the HBM one is memory space (color) 0. For a program
without a loop, `memory_analysis().temp_size_in_bytes` is that block to within kilobytes. For a
program with a loop (`scan`, a `while`) libtpu's `temp_size` is larger by an amount no allocation of
the assignment holds: 1.97 GiB in the one-chip v5e cell's fwd_bwd, which ran on a chip where its
`temp_size` would not have fit beside the state
(benchmarks/reports/aot-one-chip-memory_v5e-v6e_2026-12-05.md). So a TPU program's temporaries are
counted as the block, read from the buffer assignment XLA writes when asked to dump the optimized
module; the dump adds about 5% to a compile (the same report).

Only XLA's text dump carries the assignment: `memory_analysis()` leaves its serialized form empty on
libtpu 0.10.2's JAX, and a compiled executable keeps its modules but not their assignment. And XLA
dumps only what it compiles: a program JAX's persistent compilation cache holds (JAX_COMPILATION_CACHE_DIR,
the dump options are not in its key) is loaded from the cache and dumps nothing, so the dumping
compile runs with that cache off.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (?:color (\d+), )?preallocated-temp\b")


def hbm_temp_block(assignment_text: str) -> int | None:
    """Bytes of the memory-space-0 (HBM) preallocated temporary block in one module's
    `*-buffer-assignment.txt`; None when the assignment has none (a program with no temporaries
    has a block of a few bytes, not none)."""
    for line in assignment_text.splitlines():
        match = _ALLOCATION.match(line)
        if match and int(match.group(2) or 0) == 0:
            return int(match.group(1))
    return None


def dump_options(folder: str | Path) -> dict[str, Any]:
    """XLA options that dump the optimized module and its buffer assignment into `folder`, not a
    file per compiler pass."""
    return {
        "xla_dump_to": str(folder),
        "xla_dump_hlo_as_text": True,
        "xla_dump_hlo_pass_re": "NONE_MATCH",
    }


@contextlib.contextmanager
def persistent_cache_off() -> Iterator[None]:
    """JAX's persistent compilation cache off for the block, as it was after. JAX decides once per
    process whether it uses the cache and keeps that decision when the setting changes later (as an
    aot for a TPU target turns it off), so the decision is reset on the way in and out whatever the
    setting reads."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


def compile_dumping(lowered: Any, options: dict[str, Any], folder: str | Path):
    """`lowered` compiled by XLA (never loaded from the persistent cache) with its optimized module
    and buffer assignment dumped into `folder`."""
    with persistent_cache_off():
        return lowered.compile(compiler_options={**options, **dump_options(folder)})


def compile_reading_block(lowered: Any, options: dict[str, Any], platform: str):
    """`lowered` compiled with `options`: (compiled, the HBM temporary block in bytes or None).

    Off TPU the block is not read (None) and nothing is dumped: there `temp_size_in_bytes` is the
    temporaries' allocation. A dump XLA did not write (a remote compile) also gives None.
    """
    if platform != "tpu":
        return lowered.compile(compiler_options=options), None
    with tempfile.TemporaryDirectory(prefix="xla-assignment-") as folder:
        compiled = compile_dumping(lowered, options, folder)
        assignments = sorted(Path(folder).glob("*after_optimizations-buffer-assignment.txt"))
        # XLA's own text; undecodable bytes (a dump cut short by a full disk) match no line
        text = assignments[-1].read_text(errors="replace") if assignments else ""
        block = hbm_temp_block(text)
    return compiled, block
