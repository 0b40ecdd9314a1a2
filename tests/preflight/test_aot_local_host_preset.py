"""`aot --target local` of a host preset compiles for the host's CPU devices, as the preset's run
takes them, on a host with an accelerator too (JAX would otherwise pick the accelerator).

Inside the test session JAX already has 8 host devices and JAX_PLATFORMS=cpu (conftest.py), so
this runs in a fresh interpreter with neither set, as a user's shell would be.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import jax
from rl_trainer_bench.preflight.aot.targets import resolve_target
target = resolve_target("local", {count})
print(jax.config.jax_platforms, len(target.devices), target.devices[0].platform)
"""


def _target(count: int) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(count=count)],
        env={**clean, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip()


def test_a_host_preset_compiles_for_the_hosts_cpu_devices():
    assert _target(8) == "cpu 8 cpu"


def test_a_preset_that_is_not_a_host_preset_leaves_the_platform_to_jax():
    assert _target(0) == "None 1 cpu"
