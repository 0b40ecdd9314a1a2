"""The engine's Pallas kernels whose size a program is an engine key's: the key a compile's on-chip
memory overflow points to.

A TPU kernel whose blocks and scratch overflow a core's VMEM fails its compile ("Ran out of memory
in memory space vmem ... for %<the kernel's call>"). Where an engine key sets how much one program
of the kernel holds, that failure is the chip's answer to the key's value (the Gated DeltaNet's
kernels at `linear_chunk_kernel_heads=16` on a v5e: benchmarks/reports/chip-round-7_tpu-v5e_2026-12-07.md),
a choice the user changes, not the cell's size and not a bug. Plain text, no JAX: the bench's
refusals and the AOT report read it.
"""

from __future__ import annotations

import re

# The Gated DeltaNet's chunk kernels (`builtin/delta_rule_kernel.py`), by the names of their calls
GATED_DELTA_RULE_FORWARD = "gated_delta_rule_forward"
GATED_DELTA_RULE_BACKWARD = "gated_delta_rule_backward"
# kernel call -> (the engine key that sizes a program of it, what to set it to)
SIZED_BY_KEY = dict.fromkeys(
    (GATED_DELTA_RULE_FORWARD, GATED_DELTA_RULE_BACKWARD),
    ("linear_chunk_kernel_heads", "fewer value heads a program"),
)
# XLA's words for a kernel that overflows a TPU core's VMEM
VMEM_OVERFLOW = "memory space vmem"


def vmem_overflow_fix(text: str) -> str | None:
    """For a compile error's `text` that is a VMEM overflow of a kernel an engine key sizes: one
    clause naming the kernel, the key and the fix; else None."""
    if VMEM_OVERFLOW not in text.lower():
        return None
    for kernel, (key, fix) in SIZED_BY_KEY.items():
        if re.search(rf"%{kernel}(\.\d+)?\b", text):
            return (
                f"the Pallas kernel {kernel} needs more of a TPU core's VMEM a program than the"
                f" core has at this {key}: set {fix} ({key} in --engine-flags)"
            )
    return None
