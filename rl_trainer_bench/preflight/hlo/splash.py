"""The matmul FLOPs of Pallas' splash attention kernels, which state no cost of their own.

Why: the op estimate times a TPU kernel from the `pl.CostEstimate` its custom call carries, and
splash attention's three kernels (forward, dq, dkv) carry none, so their work counted as nothing
but their operands' bytes, a tenth of what the chip's trace gives them
(benchmarks/reports/aot-op-terms_v5e-tpu7x_2026-12-07.md). Their FLOPs follow from
what the call carries: q [..., heads, T, head_dim] and k [..., T, head_dim] among its operands,
the kernel's phase in its name (`splash_mqa_fwd_segmented_residuals`, JAX's `get_kernel_name`) and
its block sizes in its `xprof_metadata`. A kernel runs the blocks of q rows x kv columns its mask
does not empty, each as whole matmuls of block_q x block_kv x head_dim: two a block forward
(q k^T, p v), three for dq (q k^T, do v^T, ds k), four for dkv (q k^T, do v^T, p^T do, ds^T q),
five with the dq fused into it. The mask itself is a constant whose values the text elides, so
the blocks counted are those of a causal mask over T x T, the mask both engines give the kernel
(the built-in engine's `local_splash_attention`, MaxText's causal splash); segment boundaries
empty no block the kernel can skip statically (the segment ids are data).
"""

from __future__ import annotations

import json
import re

from rl_trainer_bench.preflight.hlo.parse import Instruction

_NAME = re.compile(r"^splash_(?:mha|mqa)_(fwd|dq|dkv)")
_METADATA = re.compile(r'"xprof_metadata":"((?:[^"\\]|\\.)*)"')
# Block sizes of each phase in the metadata, and its matmuls a block
_BLOCKS = {"fwd": ("block_q", "block_kv"), "dq": ("block_q_dq", "block_kv_dq")}
_BLOCKS["dkv"] = ("block_q_dkv", "block_kv_dkv")
_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
_FUSED_DQ = "use_fused_bwd_kernel"


def splash_flops(call: Instruction, operands: list[Instruction | None]) -> float | None:
    """The matmul FLOPs of one splash attention kernel call (a causal mask), or None when `call`
    is not one or its block sizes or q and k are not readable."""
    phase = _NAME.match(call.name)
    metadata = _METADATA.search(call.attributes)
    if call.opcode != "custom-call" or phase is None or metadata is None:
        return None
    blocks = json.loads(json.loads(f'"{metadata.group(1)}"'))  # a JSON text in a JSON string
    q_key, kv_key = _BLOCKS[phase.group(1)]
    floats = [
        o.arrays[0]
        for o in operands
        if o is not None and o.arrays and o.arrays[0].dtype.startswith(("bf16", "f"))
    ]
    if len(floats) < 2 or not blocks.get(q_key) or not blocks.get(kv_key):
        return None
    q, k = floats[0], floats[1]
    if len(q.dims) < 2 or len(k.dims) < 2:
        return None
    rows, head_dim, columns = q.dims[-2], q.dims[-1], k.dims[-2]
    heads = q.elements // (rows * head_dim)
    matmuls = _MATMULS[phase.group(1)] + (phase.group(1) == "dkv" and bool(blocks.get(_FUSED_DQ)))
    block_q, block_kv = blocks[q_key], blocks[kv_key]
    return (
        2.0
        * matmuls
        * heads
        * head_dim
        * block_q
        * block_kv
        * causal_blocks(rows, columns, block_q, block_kv)
    )


def causal_blocks(rows: int, columns: int, block_q: int, block_kv: int) -> int:
    """Blocks of block_q rows x block_kv columns a causal mask over rows x columns does not empty:
    for each row block, the column blocks that start at or before its last row."""
    row_blocks, column_blocks = -(-rows // block_q), -(-columns // block_kv)
    return sum(
        min(column_blocks, -(-min((i + 1) * block_q, rows) // block_kv)) for i in range(row_blocks)
    )
