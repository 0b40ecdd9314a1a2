"""What stays in device memory beside each of the engine's programs, and telling XLA about it.

The engine runs three programs, not one train step, so no program has the whole training state
among its arguments: while `fwd_bwd` runs, the optimizer state sits in device memory untouched
(the gradient sum is one of its arguments: it adds into it in place), unless it is offloaded to
host memory. XLA plans a program's temporaries (how early it gathers weights, what it keeps
for the backward pass) against the device memory it believes is free, which is everything but
the program's own arguments and outputs. Told nothing, it plans into memory the state occupies,
and the program that compiled would not fit beside the state at run time. So the engine compiles
each program on TPU with `xla_tpu_user_reserved_hbm_bytes` set to the state beside it, and the
AOT check compiles the same programs the same way and adds the same state to their footprint
(docs/engine.md, "Memory beside each program").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

# The parts of the state per device, and which of them sit beside each program without being one
# of its arguments (arguments are already inside XLA's argument bytes).
# `fwd_bwd` adds into the gradient sum in place (an argument it donates), so no micro-batch's
# gradient waits beside the next program, with or without dropless retry.
# `staged_micro_batch`: with STAGE_BEFORE_UPDATE=on, the next step's first micro-batch is on the
# device from before `update` (and a replay of the step's last micro-batch) until the next
# `fwd_bwd` takes it.
STATE_PARTS = ("params", "opt_state", "grad_accum", "staged_micro_batch")
BESIDE: Mapping[str, tuple[str, ...]] = {
    "fwd_bwd": ("opt_state",),
    "fwd_bwd_dropless": ("opt_state", "staged_micro_batch"),
    "update": ("staged_micro_batch",),
}


# Memory kinds that are not the device's: state placed there takes no device memory.
HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")


def _in_host_memory(leaf) -> bool:
    return getattr(leaf.sharding, "memory_kind", None) in HOST_MEMORY_KINDS


def per_device_bytes(tree: Any, *, host: bool = False) -> int:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (the largest shard), in
    device memory, or with `host` the bytes of its leaves placed in host memory instead."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        if _in_host_memory(leaf) != host:
            continue
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def state_bytes(
    abstract_state: Mapping[str, Any],
    staged_micro_batch: Any,
    *,
    stage_before_update: bool,
) -> dict[str, int]:
    """Per-device bytes in device memory of each of STATE_PARTS, and `host_memory`: the state's
    bytes per device kept in host memory instead (an offloaded optimizer state), never beside a
    program.

    abstract_state: `programs.abstract_state` (params, opt_state, grad_accum); staged_micro_batch:
    one micro-batch as sharded ShapeDtypeStructs, counted when it is staged before `update`.
    """
    return {
        "params": per_device_bytes(abstract_state["params"]),
        "opt_state": per_device_bytes(abstract_state["opt_state"]),
        "grad_accum": per_device_bytes(abstract_state["grad_accum"]),
        "staged_micro_batch": per_device_bytes(staged_micro_batch) if stage_before_update else 0,
        "host_memory": per_device_bytes(dict(abstract_state), host=True),
    }


def beside(
    program: str, state: Mapping[str, int], table: Mapping[str, tuple[str, ...]] = BESIDE
) -> int:
    """State bytes in device memory while `program` runs that are not among its arguments.

    `table`: which STATE_PARTS sit beside each program (the built-in engine's BESIDE by default).
    """
    if program not in table:
        raise KeyError(f"no state table for program {program!r}: add it to residency.BESIDE")
    return sum(state[part] for part in table[program])


def compiled_footprint(
    analysis: Any, beside_bytes: int, temp_block: int | None = None
) -> dict[str, int]:
    """A compiled program's `memory_analysis` per device as `aot` reads it, with `beside`: the
    state beside it, and `temp_block`: its HBM temporary block where it was read (engine/
    temp_block.py). `peak` is aot's sum (preflight/aot/compile.py): argument + output - alias +
    the temporaries (the block where read, else temp) + beside; the code's bytes are shown apart,
    as aot shows them."""
    figures = {
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "alias": int(analysis.alias_size_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "code": int(analysis.generated_code_size_in_bytes),
        "beside": beside_bytes,
    }
    if temp_block is not None:
        figures["temp_block"] = temp_block
    counted_temp = figures["temp"] if temp_block is None else temp_block
    figures["peak"] = (
        figures["argument"] + figures["output"] - figures["alias"] + counted_temp + beside_bytes
    )
    return figures


def compile_options(platform: str, reserved_bytes: int) -> dict[str, str]:
    """XLA options that plan a program around `reserved_bytes` per device held by others.

    Only libtpu has the option; elsewhere nothing is passed and the state beside a program is
    counted by the AOT report alone.
    """
    if platform != "tpu" or reserved_bytes <= 0:
        return {}
    return {"xla_tpu_user_reserved_hbm_bytes": str(int(reserved_bytes))}
