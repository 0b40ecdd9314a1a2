"""Start the JAX runtime the way the pod's environment asks: Pathways, multi-process, or one host.

The bench runs where the trainer runs: under Pathways (`JAX_PLATFORMS=proxy`), as one process per
host with a coordinator, or as one process with forced host CPU devices for the small presets. This
must happen before anything touches a device, so the driver calls it first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping

import jax

from rl_trainer_bench.errors import ConfigError


def _int_env(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{name}={text!r} is not an integer: set it with JAX_COORDINATOR_ADDRESS"
        ) from None


def process_count(env: Mapping[str, str]) -> int:
    """Processes the environment declares (1 unless JAX_NUM_PROCESSES says otherwise)."""
    return _int_env(env, "JAX_NUM_PROCESSES") if env.get("JAX_NUM_PROCESSES") else 1


def initialize_runtime(env: Mapping[str, str], host_devices: int) -> str:
    """Initialize JAX for this environment and return one line saying how.

    `host_devices` is the preset's CPU device count for the whole run (0: leave the host platform
    alone); with several processes each one takes its share.
    """
    if env.get("JAX_PLATFORMS", "") == "proxy":
        try:
            pathwaysutils = importlib.import_module("pathwaysutils")
        except ImportError:
            return (
                "runtime: Pathways proxy (pathwaysutils not installed; JAX's proxy backend alone)"
            )
        pathwaysutils.initialize()
        return "runtime: Pathways proxy via pathwaysutils.initialize()"
    processes = process_count(env)
    _force_host_devices(host_devices // processes if host_devices else 0)
    if env.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=processes,
            process_id=_int_env(env, "JAX_PROCESS_ID"),
        )
        return (
            f"runtime: jax.distributed process {jax.process_index()} of {jax.process_count()}"
            f" via {env['JAX_COORDINATOR_ADDRESS']}"
        )
    if len(env.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1:
        jax.distributed.initialize()  # multi-host TPU: JAX detects the cluster from the pod
        return f"runtime: jax.distributed (TPU pod) process {jax.process_index()}"
    return "runtime: single process"


def start_for_preset(host_devices: int) -> str:
    """Start JAX as a preset asks, before anything touches a device; the line saying how.

    A host preset (`host_devices` > 0, e.g. cpu-tiny's 2x2x2 mesh) gets the CPU platform with that
    many devices unless the environment chose a platform or a device count; other presets start as
    the environment says.
    """
    if host_devices and not os.environ.get("JAX_PLATFORMS"):
        with contextlib.suppress(RuntimeError):  # backends already up: keep what they are
            jax.config.update("jax_platforms", "cpu")
    return initialize_runtime(os.environ, host_devices)


def _force_host_devices(count: int) -> None:
    """Give the CPU platform `count` devices, unless XLA_FLAGS already chose or JAX already started."""
    if count <= 0 or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    # Once backends are initialized (e.g. inside a test session) the count is fixed: keep it.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", count)
