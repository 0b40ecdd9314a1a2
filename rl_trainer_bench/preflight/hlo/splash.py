"""The matmul FLOPs and vector work of Pallas' splash attention kernels, which state no cost.

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

Between its matmuls a block's every score (a 32-bit value) takes vector ops, as the kernels' code
(JAX 0.10.2's `splash_attention_kernel.py`) writes them, whatever the mask: forward 6 (the segment ids compared, the masked scores selected,
the row's max, the max subtracted, exp, the row's sum), dq 7 (compare, select, the logsumexp
subtracted, exp, di subtracted, times p, ds cast to bf16), dkv 8 (the same with p cast to bf16
too; 9 with the dq fused, its ds cast again). The mask's own combining ops are not counted (the
mask's values are elided). Counted at their FLOPs alone, the kernels ran far below their
roofline on the chip (benchmarks/reports/aot-op-terms_v5e-tpu7x_2026-12-07.md): the vector unit,
not the matrix unit, holds a block's softmax.
"""

from __future__ import annotations

import dataclasses
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
# Vector ops a score takes in each phase's body (the docstring lists them), and the fused dq's
_VECTOR_OPS = {"fwd": 6, "dq": 7, "dkv": 8}
_FUSED_DQ_VECTOR_OPS = 1


@dataclasses.dataclass(frozen=True)
class _Call:
    """What a splash kernel call says of its work: phase, heads, q rows, kv columns, head_dim,
    its blocks of q and kv, and whether the dq is fused into its dkv."""

    phase: str
    heads: int
    rows: int
    columns: int
    head_dim: int
    block_q: int
    block_kv: int
    fused_dq: bool

    @property
    def scores(self) -> int:
        """Scores the kernel computes: every element of the blocks a causal mask leaves."""
        blocks = causal_blocks(self.rows, self.columns, self.block_q, self.block_kv)
        return self.heads * self.block_q * self.block_kv * blocks


def splash_flops(call: Instruction, operands: list[Instruction | None]) -> float | None:
    """The matmul FLOPs of one splash attention kernel call (a causal mask), or None when `call`
    is not one or its block sizes or q and k are not readable."""
    found = _read(call, operands)
    if found is None:
        return None
    matmuls = _MATMULS[found.phase] + (found.phase == "dkv" and found.fused_dq)
    return 2.0 * matmuls * found.head_dim * found.scores


def splash_vector_ops(call: Instruction, operands: list[Instruction | None]) -> float:
    """The 32-bit vector ops one splash attention kernel call does on its scores (a causal mask);
    0 when `call` is not one or is not readable."""
    found = _read(call, operands)
    if found is None:
        return 0.0
    per_score = _VECTOR_OPS[found.phase] + _FUSED_DQ_VECTOR_OPS * (
        found.phase == "dkv" and found.fused_dq
    )
    return float(per_score * found.scores)


def _read(call: Instruction, operands: list[Instruction | None]) -> _Call | None:
    """The call's phase, shapes and blocks, or None when it is not a splash kernel or they are not
    readable."""
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
    return _Call(
        phase.group(1),
        q.elements // (rows * head_dim),
        rows,
        columns,
        head_dim,
        blocks[q_key],
        blocks[kv_key],
        bool(blocks.get(_FUSED_DQ)),
    )


def causal_blocks(rows: int, columns: int, block_q: int, block_kv: int) -> int:
    """Blocks of block_q rows x block_kv columns a causal mask over rows x columns does not empty:
    for each row block, the column blocks that start at or before its last row."""
    row_blocks, column_blocks = -(-rows // block_q), -(-columns // block_kv)
    return sum(
        min(column_blocks, -(-min((i + 1) * block_q, rows) // block_kv)) for i in range(row_blocks)
    )
