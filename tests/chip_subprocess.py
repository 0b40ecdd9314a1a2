"""How a chip test runs its comparison: the test session keeps JAX on the host CPU (conftest.py),
so the script runs in a Python process of its own on the chip, and the test is skipped on a host
without a TPU chip this process can open. Run such tests alone (one process can hold the chip):
`python -m pytest -q -m tpu_chip tests/`."""

import os
import subprocess
import sys

import pytest

from rl_trainer_bench.chips import local_chips

ON_A_CHIP = [
    pytest.mark.tpu_chip,
    pytest.mark.skipif(
        local_chips.local_tpu() is None, reason="needs a TPU chip this process can open"
    ),
]


def run_on_the_chip(script: str) -> str:
    """`script` in a process of its own without the session's CPU settings (JAX_PLATFORMS,
    XLA_FLAGS): its output; the test fails with its output where it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout
