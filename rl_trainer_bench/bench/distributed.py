"""Start the JAX runtime the way the pod's environment asks: Pathways, multi-process, or one host.

The bench runs where the trainer runs: under Pathways (`proxy` among JAX_PLATFORMS, e.g. `proxy,cpu`), as one process per
host with a coordinator, or as one process with forced host CPU devices for the small presets. This
must happen before anything touches a device, so the driver calls it first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping

import jax

from rl_trainer_bench.bench.runtime import (
    MULTI_PROCESS,
    PATHWAYS,
    TPU_POD,
    forces_host_cpu,
    runtime_for,
)
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

    The runtime is the one `runtime.runtime_for` names, which the plan printed before this runs.
    `host_devices` is the preset's CPU device count for the whole run (0: leave the host platform
    alone); with several processes each one takes its share. A host preset (e.g. cpu-tiny's 2x2x2
    mesh) gets the CPU platform unless JAX_PLATFORMS chose one, in every command alike: on a host
    with an accelerator JAX would otherwise pick the accelerator, whose devices the preset's mesh
    was not made for.
    """
    chosen = runtime_for(env, host_devices)
    if chosen.kind == PATHWAYS:
        return _start_pathways(env)
    take_host_cpu(env, host_devices)
    processes = process_count(env)
    _force_host_devices(host_devices // processes if host_devices else 0)
    if chosen.kind == MULTI_PROCESS:
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=processes,
            process_id=_int_env(env, "JAX_PROCESS_ID"),
        )
        return (
            f"runtime: jax.distributed process {jax.process_index()} of {jax.process_count()}"
            f" via {env['JAX_COORDINATOR_ADDRESS']}"
        )
    if chosen.kind == TPU_POD:
        jax.distributed.initialize()  # multi-host TPU: JAX detects the cluster from the pod
        return f"runtime: jax.distributed (TPU pod) process {jax.process_index()}"
    return f"runtime: {chosen.describe()}"


def take_host_cpu(env: Mapping[str, str], host_devices: int) -> None:
    """Put JAX on the host's CPU for a host preset whose environment names no platform
    (`runtime.forces_host_cpu`): every command that runs or compiles the preset here alike."""
    if forces_host_cpu(env, host_devices):
        with contextlib.suppress(RuntimeError):  # backends already up: keep what they are
            jax.config.update("jax_platforms", "cpu")


def _start_pathways(env: Mapping[str, str]) -> str:
    """pathwaysutils.initialize(), which registers the proxy backend JAX needs for `proxy`.

    Without pathwaysutils the platform list names a backend this JAX may not register by itself,
    so the run says so plainly and lets JAX try; the trainer's image has pathwaysutils when the
    trainer runs under Pathways.
    """
    platforms = env["JAX_PLATFORMS"]
    try:
        pathwaysutils = importlib.import_module("pathwaysutils")
    except ImportError:
        return (
            f"runtime: pathways (JAX_PLATFORMS={platforms}; pathwaysutils not installed: JAX's"
            " own proxy backend alone, which some JAX releases do not register)"
        )
    pathwaysutils.initialize()
    return f"runtime: pathways via pathwaysutils.initialize() (JAX_PLATFORMS={platforms})"


def start_for_preset(host_devices: int) -> str:
    """Start JAX as a preset asks, in this process's environment (`initialize_runtime`)."""
    return initialize_runtime(os.environ, host_devices)


def _force_host_devices(count: int) -> None:
    """Give the CPU platform `count` devices, unless XLA_FLAGS already chose or JAX already started."""
    if count <= 0 or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    # Once backends are initialized (e.g. inside a test session) the count is fixed: keep it.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", count)
