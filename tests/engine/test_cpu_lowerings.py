"""On the CPU, jax's triangular solve becomes XLA's own op instead of jaxlib's LAPACK call, with the
same result. In a child process: the registration holds for the whole process."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import jax, jax.numpy as jnp, numpy as np
from rl_trainer_bench.engine.maxtext import cpu_lowerings

a = jnp.tril(jnp.ones((3, 4, 4))) + 3 * jnp.eye(4)
b = jnp.arange(48.0).reshape(3, 4, 4)
solve = jax.jit(lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True))
before = solve.lower(a, b).as_text()
expected = np.linalg.solve(np.asarray(a), np.asarray(b))
print(cpu_lowerings.use_xla_triangular_solve())
after = jax.jit(lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True)).lower(a, b)
print("lapack before:", "lapack_strsm" in before)
print("lapack after:", "lapack_strsm" in after.as_text())
print("hlo op after:", "stablehlo.triangular_solve" in after.as_text())
print("same solution:", np.allclose(after.compile()(a, b), expected, rtol=1e-5))
"""


def test_the_cpu_solve_is_xlas_op_and_solves_the_same():
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == [
        "triangular_solve=xla-hlo",
        "lapack before: True",
        "lapack after: False",
        "hlo op after: True",
        "same solution: True",
    ]
