"""The step boundary's copy, before anything runs: what STAGE_BEFORE_UPDATE can save on a cell.

The switch exists for one cost. With it off, the next step's first micro-batch is copied
host-to-device after the update, on an idle device, and the step's first `fwd_bwd` waits for it
(the step ruler's "first call's extra"). With it on, that copy is issued while the device still
computes the step's last micro-batch, and only the part of it that outlasts that micro-batch's
device time is left at the boundary. So the switch saves at most the copy, all of it where the
copy is shorter than a micro-batch's device time, and nothing on a cell whose copy is negligible.

The copy's bytes follow from the engine config alone (`engine/payload_shapes.py`): by array, per
device (every batch array is split over all of the mesh's devices: rows over fsdp x expert, tokens
over context), per host (its devices' shares) and as the client sends them. Under Pathways one
client sends every host's share through its proxy: the whole micro-batch crosses one link. With a
process per host (jax.distributed, a multi-host TPU) each host sends its own share; one process
sends it all. Its time is the bytes the client sends over the link's rate, plus a fixed cost for
each array's transfer. Where the bench runs, both are measured after the compile
(`bench/host_link.py`) and named MEASURED; a plan made before launch cannot measure a pod's link,
so it prints the rate it assumes and names it ASSUMED.

No JAX: the plan prints this before any device work.
"""

from __future__ import annotations

import dataclasses
import math

from rl_trainer_bench.bench.runtime import MULTI_PROCESS, PATHWAYS, TPU_POD, Runtime
from rl_trainer_bench.chips.accelerators import TpuSlice
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.payload_shapes import array_bytes
from rl_trainer_bench.units import human_bytes

MEASURED, ASSUMED = "MEASURED", "ASSUMED"
# Who sends the copy (`sender`), and how the plan says it.
PER_HOST, ALL_HOSTS, ONE_PROCESS = "per host", "through the proxy", "one process"
CLIENTS = {
    PER_HOST: "each host's process sends its own share",
    ALL_HOSTS: "the Pathways client sends every host's share through its proxy",
    ONE_PROCESS: "one process sends it all",
}


@dataclasses.dataclass(frozen=True)
class HostLink:
    """The host-to-device link a micro-batch crosses: its rate and each array's fixed cost."""

    bytes_per_s: float
    per_transfer_s: float
    kind: str  # MEASURED where the bench ran, ASSUMED in a plan made before launch
    source: str  # where the figures come from, for the line that prints them

    def describe(self) -> str:
        rate = (
            f"{self.bytes_per_s / 1e9:.3g} GB/s"
            if math.isfinite(self.bytes_per_s)
            else "no rate the copy resolves (it took no longer than its fixed cost)"
        )
        return (
            f"{rate} and {self.per_transfer_s * 1e3:.3g} ms a transfer, {self.kind} ({self.source})"
        )


# The link a plan assumes before launch: a 538 MB micro-batch (the preset's with 512 MiB of
# `extra_host_bytes`) copied from host memory to one TPU v5e chip by the built-in engine's own copy
# of an unstaged input (in pieces, joined on the device: engine/builtin/input_copy.py), MEASURED
# 2026-12-07: 9.78 GB/s and 0.169 ms a transfer. In the step the first fwd_bwd after an unstaged
# boundary waited about 60% longer (90 ms against 56), and a pod's link, a Pathways proxy's above
# all, can be far slower (BENCHMARKS.md, "What STAGE_BEFORE_UPDATE saves on one v5e chip"): the
# run measures its own.
ASSUMED_LINK = HostLink(
    bytes_per_s=9.78e9,
    per_transfer_s=1.69e-4,
    kind=ASSUMED,
    source="the built-in engine's copy measured on one TPU v5e chip; a pod's own link is measured"
    " when it runs",
)


@dataclasses.dataclass(frozen=True)
class BoundaryCopy:
    """One micro-batch's bytes as the step boundary copies them."""

    arrays: tuple[tuple[str, int], ...]  # (name, bytes) of each array of the whole micro-batch
    devices: int  # the mesh's devices
    hosts: int  # the hosts those devices are on
    client: str  # who sends the copy: the runtime's way (`sender`)

    @property
    def total(self) -> int:
        return sum(size for _name, size in self.arrays)

    @property
    def per_device(self) -> int:
        return -(-self.total // self.devices)

    @property
    def per_host(self) -> int:
        return self.per_device * (-(-self.devices // self.hosts))

    @property
    def sent_by_client(self) -> int:
        """Bytes one client process sends: all of it, but with a process per host, its share."""
        return self.per_host if self.client == PER_HOST else self.total

    def seconds(self, link: HostLink) -> float:
        """The copy's time over `link`: each array's fixed cost, then the client's bytes."""
        return len(self.arrays) * link.per_transfer_s + self.sent_by_client / link.bytes_per_s

    def bytes_line(self) -> str:
        """The plan's line: the bytes by array, per device, per host, as the client sends them."""
        by_array = ", ".join(f"{name} {human_bytes(size)}" for name, size in self.arrays)
        return (
            f"{human_bytes(self.total)} a micro-batch ({by_array}); {human_bytes(self.per_device)}"
            f" per device ({self.devices}), {human_bytes(self.per_host)} per host ({self.hosts});"
            f" {CLIENTS[self.client]}: {human_bytes(self.sent_by_client)} a copy"
        )

    def prediction_line(self, link: HostLink) -> str:
        """The plan's line: what the boundary costs with the switch off, and what on can save."""
        copy_ms = f"{self.seconds(link) * 1e3:.3g} ms"
        proxy = (
            "; a Pathways proxy's rate is its own and can be far lower: the run measures it"
            if self.client == ALL_HOSTS and link.kind == ASSUMED
            else ""
        )
        return (
            f"STAGE_BEFORE_UPDATE off: each step's first fwd_bwd waits {copy_ms} for its"
            f" micro-batch's copy on an idle device ({len(self.arrays)} transfers,"
            f" {human_bytes(self.sent_by_client)} at {link.describe()}{proxy}); on: the engine's"
            f" staging path copies it beside the step's last fwd_bwd, hidden where it ends first"
            f" (a staging path can be slower than this copy: the step's stage_s, device_wait_s and"
            f" hidden say): the most the switch can save is the copy, {copy_ms} a step at this rate"
        )


def sender(runtime: Runtime | None) -> str:
    """Who sends the copy under `runtime` (one process where the plan knows no environment)."""
    if runtime is not None and runtime.kind == PATHWAYS:
        return ALL_HOSTS
    if runtime is not None and runtime.kind in (MULTI_PROCESS, TPU_POD):
        return PER_HOST
    return ONE_PROCESS


def boundary_copy(
    engine: EngineConfig, runtime: Runtime | None, tpu_slice: TpuSlice | None
) -> BoundaryCopy:
    """The boundary's copy of one of `engine`'s micro-batches: its devices on the slice's hosts
    where the plan names a slice, else on the runtime's (one, where it knows none)."""
    hosts = tpu_slice.num_hosts if tpu_slice is not None else runtime.hosts if runtime else 1
    arrays = tuple(array_bytes(engine).items())
    return BoundaryCopy(arrays, engine.mesh.size, max(1, hosts), sender(runtime))


def exposed_with_stage(copy_s: float, last_fwd_bwd_s: float) -> float:
    """What is left at the boundary with STAGE_BEFORE_UPDATE on: the part of the copy that
    outlasts the step's last `fwd_bwd` (its device time), which the copy runs beside."""
    return max(0.0, copy_s - last_fwd_bwd_s)
