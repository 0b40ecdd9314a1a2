"""The work a matmul takes on a TPU's matrix unit (MXU), beside the FLOPs it does.

Why: the op estimate times a matmul-bound op at its FLOPs over the chip's bf16 peak, and two
things make the unit do more than the FLOPs say.

- Precision. A TPU's MXU multiplies bfloat16; a float32 operand goes through it as one bfloat16
  pass at XLA's DEFAULT precision, 3 at HIGH and 6 at HIGHEST (`jax.lax.Precision`'s docstring,
  JAX 0.10.2: "performs float32 computations in 3 bfloat16 passes" / "in 6 bfloat16"). The
  compiled text writes a finer precision on the op (`operand_precision={highest,highest}`), or an
  algorithm (`algorithm=dot_bf16_bf16_f32_x6`); DEFAULT is written as nothing. Operands already in
  bfloat16 take one pass whatever the precision says (nothing is left to split).
- Padding. The unit is a square array (v5e: 128 x 128, the chip table's `mxu_size`): one operand's
  [K, N] tile sits in it while the other's rows stream through, so K and N count as whole multiples
  of the side. The compiler may hold either operand, so the smaller padded count is taken.
"""

from __future__ import annotations

import re

from rl_trainer_bench.preflight.hlo.parse import Instruction

# Bfloat16 passes of a float32 matmul at each precision XLA writes (`jax.lax.Precision`).
_PASSES = {"default": 1, "high": 3, "highest": 6}
_ALGORITHM_PASSES = re.compile(r"_x(\d+)$")
_FLOAT32_ALGORITHM = "dot_f32_f32_f32"  # float32 on a TPU: HIGHEST's six passes
_FLOAT32 = "f32"


def passes(matmul: Instruction, *operands: Instruction | None) -> int:
    """Bfloat16 passes the MXU makes for `matmul` (a dot or convolution): 1 unless an operand is
    float32 and the op asks for a finer precision or a multi-pass algorithm."""
    if not any(o is not None and o.arrays and o.arrays[0].dtype == _FLOAT32 for o in operands):
        return 1
    algorithm = matmul.attribute("algorithm") or ""
    if algorithm == _FLOAT32_ALGORITHM:
        return _PASSES["highest"]
    if found := _ALGORITHM_PASSES.search(algorithm):
        return int(found.group(1))
    written = (matmul.attribute("operand_precision") or "").strip("{}").split(",")
    return max((_PASSES.get(p.strip().lower(), 1) for p in written), default=1)


def padding(rows: int, contracted: int, columns: int, side: int) -> float:
    """How much more the unit does than the FLOPs of a [rows, contracted] x [contracted, columns]
    matmul: the contracted dimension and the held operand's other one padded to whole `side`s,
    holding whichever operand pads less; 1 where the side is unknown (0) or a size is."""
    if not side or min(rows, contracted, columns) <= 0:
        return 1.0
    padded = lambda size: -(-size // side) * side  # noqa: E731
    work = min(rows * padded(columns), columns * padded(rows)) * padded(contracted)
    return work / (rows * contracted * columns)
