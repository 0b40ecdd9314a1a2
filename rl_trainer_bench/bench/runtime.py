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

PATHWAYS = "pathways"
MULTI_PROCESS = "multi-process"
TPU_POD = "multi-host TPU"
SINGLE_PROCESS = "single process"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The runtime an environment asks for (`kind`) and the variables that said so (`detail`)."""

    kind: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


def platforms(env: Mapping[str, str]) -> list[str]:
    """JAX_PLATFORMS' entries, lower case, in order ([] when unset: JAX picks)."""
    return [
        entry.strip().lower() for entry in env.get("JAX_PLATFORMS", "").split(",") if entry.strip()
    ]


def uses_pathways(env: Mapping[str, str]) -> bool:
    """Whether the process runs under Pathways: `proxy` among JAX_PLATFORMS' entries."""
    return "proxy" in platforms(env)


def runtime_for(env: Mapping[str, str]) -> Runtime:
    """The runtime `env` asks for, in the order the driver tries them."""
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
        )
    hosts = [host for host in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
    if len(hosts) > 1:
        return Runtime(TPU_POD, f"jax.distributed over {len(hosts)} hosts of TPU_WORKER_HOSTNAMES")
    return Runtime(SINGLE_PROCESS)
