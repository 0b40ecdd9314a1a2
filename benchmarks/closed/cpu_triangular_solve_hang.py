"""Batched triangular solves on the CPU, as MaxText's Gated DeltaNet runs them: does jaxlib return?

MaxText's Qwen3.5 training step never finished on the 2-core dev machine: every device's thread
waited inside jaxlib's CPU LAPACK call (`lapack_strsm_ffi` -> `ParallelBatchMap` ->
`BlockingCounter::Wait`). This reproduces the wait without MaxText: six independent batched
`solve_triangular` calls in one program, their gradient, and a vmapped scan of them. Run it under a
timeout, with and without XLA flags, to see which jaxlib and flags return:

    timeout 60 python benchmarks/closed/cpu_triangular_solve_hang.py; echo "exit $?"   # 124: it hung
    XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false timeout 60 python ...

Each program prints its result and its seconds (compile included) as it finishes.

Closed (benchmarks/closed/README.md); its report: benchmarks/reports/maxtext-engine_cpu_2026-12-03.md.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def independent_solves(a, b):
    """Six solves no data dependence orders: XLA's CPU runtime may run them at once."""
    outs = [jax.scipy.linalg.solve_triangular(a + i, b * i, lower=True) for i in range(6)]
    return sum(out.sum() for out in outs)


def scanned_solves(a, b):
    def step(total, scale):
        return total + jax.scipy.linalg.solve_triangular(a, b * scale, lower=True).sum(), None

    return jax.lax.scan(step, 0.0, jnp.arange(4.0))[0]


def main() -> None:
    print(f"jax {jax.__version__}, {jax.device_count()} device(s)", flush=True)
    lower = jnp.tril(jax.random.normal(jax.random.key(0), (16, 8, 64, 64))) + 8 * jnp.eye(64)
    right = jax.random.normal(jax.random.key(1), (16, 8, 64, 64))
    programs = {
        "six independent solves": (jax.jit(independent_solves), (lower, right)),
        "their gradient": (jax.jit(jax.grad(independent_solves)), (lower, right)),
        "vmapped gradient of a scan of solves": (
            jax.jit(jax.vmap(jax.grad(scanned_solves), in_axes=(0, None))),
            (jnp.stack([lower, lower]), right),
        ),
    }
    for name, (program, arguments) in programs.items():
        start = time.perf_counter()
        value = float(jnp.sum(program(*arguments)))
        print(f"{name}: {value:.6g} in {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
