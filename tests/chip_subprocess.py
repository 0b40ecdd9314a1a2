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


# The session's settings for its CPU compiles, none of which a chip process wants: the host
# platform and its devices, libtpu loaded by several processes, and the session's compile cache
# (each chip script compiles programs no other test does: a cache would only store them).
SESSION_ONLY = (
    "JAX_PLATFORMS",
    "XLA_FLAGS",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
    "JAX_COMPILATION_CACHE_DIR",
)
# Ends the script without Python's shutdown and the TPU runtime's teardown in it: 0.4 s of a
# process that opened a v5e chip (10.45 s against 10.86 from start to end; the rest of the exit is
# the kernel's); the script's output is flushed first, and the chip is released with the process.
_EXIT_AT_ONCE = "\nimport os, sys\nsys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n"


def run_on_the_chip(script: str) -> str:
    """`script` in a process of its own without the session's settings (SESSION_ONLY): its
    output; the test fails with its output where it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    done = subprocess.run(
        [sys.executable, "-c", script + _EXIT_AT_ONCE],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout
