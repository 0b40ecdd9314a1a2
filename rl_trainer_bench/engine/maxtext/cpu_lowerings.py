"""On a CPU host, jax's triangular solve lowered to XLA's own HLO op, not jaxlib's LAPACK call.

MaxText's Gated DeltaNet (Qwen3.5) solves a batch of triangular systems per chunk. jax lowers
`triangular_solve` on the CPU to jaxlib's LAPACK custom call (`lapack_strsm_ffi`), whose batch runs
through a parallel map; on jaxlib 0.10.2 that call does not always return (every device thread waits
in `ParallelBatchMap` -> `BlockingCounter::Wait`; reproduced without MaxText by
`benchmarks/closed/cpu_triangular_solve_hang.py`,
benchmarks/reports/maxtext-engine_cpu_2026-12-03.md). jax's generic lowering of the same primitive
emits XLA's `triangular-solve` HLO op, which XLA expands itself; registered for the `cpu` platform
only, it replaces the custom call there and nowhere else. The same math, another kernel: the MaxText
adapter says so in its info line. The registration holds for the process (jax keeps one lowering per
primitive and platform); the built-in engine has no triangular solve.

It reads two private names of jax (`jax._src.lax.linalg`): jax has no public way to choose a
primitive's lowering, and its generic rule is the one every other platform uses.
"""

from __future__ import annotations

XLA_TRIANGULAR_SOLVE = "triangular_solve=xla-hlo"  # what the adapter's info line says


def use_xla_triangular_solve() -> str:
    """Lower `triangular_solve` on the CPU as jax lowers it elsewhere; returns what was done."""
    # JAX's private modules: a JAX that moved them fails only the run that asks for this lowering
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg

    mlir.register_lowering(
        linalg.triangular_solve_p, linalg._triangular_solve_lowering, platform="cpu"
    )
    return XLA_TRIANGULAR_SOLVE
