"""The flags a compile ran under, for the reports of `aot` and `hlo-overlap`.

libtpu reads `LIBTPU_INIT_ARGS` when it starts and compiles for a TPU slice with them; XLA reads
`XLA_FLAGS` for the local devices. They are part of what was compiled: an on-chip memory limit
there decides whether a kernel's blocks fit at all, an async-collective flag what overlaps what.
A report without them cannot be reproduced, so each report carries them.
"""

from __future__ import annotations

import os


def compiler_flags(tpu_slice: bool) -> dict[str, str | None]:
    """{variable: its value, None when unset} of the flags the compiler reads: libtpu's for a
    TPU slice, XLA's for the local devices."""
    variable = "LIBTPU_INIT_ARGS" if tpu_slice else "XLA_FLAGS"
    return {variable: os.environ.get(variable) or None}


def flag_lines(flags: dict[str, str | None]) -> list[str]:
    """One line per variable, an unset one said as such."""
    return [
        f"compiler flags: {variable}={value}"
        if value
        else f"compiler flags: {variable} unset (the compiler's defaults)"
        for variable, value in flags.items()
    ]
