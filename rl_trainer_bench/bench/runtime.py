"""Which JAX runtime an environment asks for: Pathways, several processes, a TPU pod, or one process.

Decided from the environment alone, with no JAX, so the plan (`run --plan`, the renderer) says the
runtime a pod will start before anything runs, and the driver starts exactly the one the plan named
(`distributed.initialize_runtime`).

Pathways is chosen as pathwaysutils chooses it: pathwaysutils' `is_pathways_backend_used` is true
when the JAX platforms setting contains `proxy`, so `JAX_PLATFORMS=proxy,cpu` (what launchers set:
the proxy for the TPUs, the host CPU for host-side arrays) is Pathways just as `proxy` alone is.
Here the comma-separated entries are compared, which is the same test for every platform list JAX
accepts and does not mistake a platform whose name merely contains the letters for the proxy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.chips.local_chips import jax_platforms

PATHWAYS = "pathways"
MULTI_PROCESS = "multi-process"
TPU_POD = "multi-host TPU"
SINGLE_PROCESS = "single process"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The runtime an environment asks for (`kind`) and the variables that said so (`detail`)."""

    kind: str
    detail: str = ""
    hosts: int = 1  # the processes, one a host, where the environment says how many

    def describe(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


def uses_pathways(env: Mapping[str, str]) -> bool:
    """Whether the process runs under Pathways: `proxy` among JAX_PLATFORMS' entries."""
    return "proxy" in jax_platforms(env)


def runtime_for(env: Mapping[str, str], host_devices: int = 0) -> Runtime:
    """The runtime `env` asks for, in the order the driver tries them; one process of a host
    preset (`host_devices` > 0) says that it runs on the host's CPU (`host_platform`)."""
    if uses_pathways(env):
        target = env.get("JAX_BACKEND_TARGET")
        return Runtime(
            PATHWAYS,
            f"JAX_PLATFORMS={env['JAX_PLATFORMS']}: pathwaysutils.initialize() before any device"
            f" work; proxy at {target or 'the default address (JAX_BACKEND_TARGET unset)'}",
        )
    if env.get("JAX_COORDINATOR_ADDRESS"):
        processes = env.get("JAX_NUM_PROCESSES") or "1"
        return Runtime(
            MULTI_PROCESS,
            f"jax.distributed, {processes} processes via {env['JAX_COORDINATOR_ADDRESS']}",
            int(processes) if processes.isdigit() and int(processes) > 0 else 1,
        )
    hosts = [host for host in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
    if len(hosts) > 1:
        return Runtime(
            TPU_POD, f"jax.distributed over {len(hosts)} hosts of TPU_WORKER_HOSTNAMES", len(hosts)
        )
    return Runtime(SINGLE_PROCESS, host_platform(env, host_devices))


def forces_host_cpu(env: Mapping[str, str], host_devices: int) -> bool:
    """Whether a host preset's run sets the CPU platform itself: JAX_PLATFORMS unset, so JAX
    would otherwise pick an accelerator the preset's mesh was not made for."""
    return host_devices > 0 and not jax_platforms(env)


def runs_on_host_cpu(env: Mapping[str, str], host_devices: int) -> bool:
    """Whether the process is bound to the host's CPU before JAX starts: a host preset that sets
    the platform itself, or JAX_PLATFORMS naming the CPU alone."""
    return forces_host_cpu(env, host_devices) or jax_platforms(env) == ["cpu"]


def host_platform(env: Mapping[str, str], host_devices: int) -> str:
    """Where a host preset's single process runs, in the words every command prints: on the
    host's CPU, never on an accelerator of the host, which then stays idle ("" for a preset
    that is not a host preset: the environment's platform, as JAX picks it)."""
    if not host_devices:
        return ""
    if forces_host_cpu(env, host_devices):
        return (
            f"host CPU, {host_devices} devices: JAX_PLATFORMS=cpu for a host preset; an"
            " accelerator of this host stays idle, a chip's own preset runs on it"
        )
    return f"a host preset's {host_devices} devices on JAX_PLATFORMS={env['JAX_PLATFORMS']}"
