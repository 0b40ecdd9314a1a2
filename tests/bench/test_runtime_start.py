"""A host preset's commands start JAX with the preset's CPU devices, whatever process runs them.

Inside the test session JAX already has 8 host devices (conftest.py), so this runs in a fresh
interpreter with neither JAX_PLATFORMS nor XLA_FLAGS set, as a user's shell would be.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import jax
from rl_trainer_bench.bench.distributed import start_for_preset
print(start_for_preset({count}))
print(jax.devices()[0].platform, len(jax.devices()), jax.config.jax_platforms)
"""


def _started(count: int, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(count=count)],
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.splitlines()


def test_a_host_preset_gets_the_cpu_platform_with_its_device_count_and_says_so():
    """JAX_PLATFORMS=cpu is set, not left to JAX: on a host with an accelerator JAX would pick it
    (where `run` once refused cpu-tiny's 8-device mesh on one chip while `ab` ran it on the CPU)."""
    assert _started(8) == [
        "runtime: single process (host CPU, 8 devices: JAX_PLATFORMS=cpu for a host preset; an"
        " accelerator of this host stays idle, a chip's own preset runs on it)",
        "cpu 8 cpu",
    ]


def test_a_preset_that_is_not_a_host_preset_leaves_the_platform_to_jax():
    assert _started(0) == ["runtime: single process", "cpu 1 None"]


def test_the_environment_chooses_over_the_preset():
    assert _started(8, XLA_FLAGS="--xla_force_host_platform_device_count=4")[-1] == "cpu 4 cpu"
    started = _started(8, JAX_PLATFORMS="cpu")
    assert started[0] == "runtime: single process (a host preset's 8 devices on JAX_PLATFORMS=cpu)"
