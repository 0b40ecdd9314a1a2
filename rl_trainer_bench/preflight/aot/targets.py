"""Where the AOT check compiles for: this process's devices or a TPU slice's topology.

A TPU slice is compiled from this host through `jax.experimental.topologies` (the `[tpu]`
extra), so a user on a CPU-only machine learns whether a cell fits a slice before spending one.
Each target carries its device memory and, where the chip table knows it, the roofline figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import jax
from jax.experimental import topologies
from jax.experimental.compilation_cache import compilation_cache

from rl_trainer_bench.bench.distributed import take_host_cpu
from rl_trainer_bench.chips import accelerators
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot.arguments import LOCAL
from rl_trainer_bench.preflight.aot.compile import first_line


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the programs are compiled for: devices, their kind and each device's memory."""

    name: str  # "local" or a slice such as "tpu7x:4x4x8"
    devices: tuple[Any, ...]
    device_kind: str
    memory_bytes: int | None  # per device
    memory_source: str
    chip: accelerators.Chip | None = None  # for peak FLOP/s and HBM bandwidth; None: unknown
    devices_per_chip: int = 1

    @property
    def roofline(self) -> tuple[float, float] | None:
        """(peak FLOP/s, HBM bytes/s) of one device, or None when the table lacks either."""
        chip = self.chip
        if chip is None or not chip.peak_bf16_flops or not chip.hbm_bytes_per_second:
            return None
        share = self.devices_per_chip
        return chip.peak_bf16_flops / share, chip.hbm_bytes_per_second / share


def resolve_target(name: str, wanted_devices: int = 0) -> Target:
    """The local devices (`local`) or a TPU slice's topology; UserError for an unknown slice."""
    if name == LOCAL:
        return _local_target(wanted_devices)
    try:
        tpu_slice = accelerators.parse_slice(name)
    except ValueError as error:
        raise UserError(f"--target / TRAINER_SLICE: {error}; or 'local'") from None
    return _topology_target(tpu_slice)


def _local_target(wanted_devices: int) -> Target:
    """This process's devices; a host preset's (`wanted_devices` > 0) on the host's CPU, as its
    run takes them (`runtime.forces_host_cpu`): on a host with an accelerator JAX would pick the
    accelerator, whose devices the preset's mesh was not made for."""
    take_host_cpu(os.environ, wanted_devices)
    if wanted_devices and jax.config.jax_platforms in (None, "", "cpu"):
        # A preset that runs on host CPU devices needs them before JAX starts its backend.
        with contextlib.suppress(RuntimeError):
            if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
                jax.config.update("jax_num_cpu_devices", wanted_devices)
    devices = tuple(jax.devices())
    device = devices[0]
    stats = _memory_stats(device)
    chip = accelerators.chip_for_device_kind(device.device_kind)
    if stats.get("bytes_limit"):
        # What JAX may allocate (on GPUs the preallocated fraction), not the chip's nameplate.
        memory, source = int(stats["bytes_limit"]), "the runtime's bytes_limit for this device"
    elif chip is not None:
        memory, source = chip.device_memory_bytes, chip.device_memory_source
    elif device.platform == "cpu":
        memory = _host_memory() // len(devices)
        source = f"host memory shared by {len(devices)} CPU devices"
    else:
        memory, source = None, f"unknown for {device.device_kind!r}"
    return Target(LOCAL, devices, device.device_kind, memory, source, chip)


def _memory_stats(device) -> dict:
    try:
        return device.memory_stats() or {}
    except (RuntimeError, NotImplementedError):
        return {}


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_bounds(tpu_slice: accelerators.TpuSlice) -> dict[str, tuple[int, ...]]:
    """libtpu's host shape for a slice smaller than a host (v5e:1x1, v6e:2x1): the slice is its
    one host. libtpu's default host is 2x2x1 chips, which it refuses to cut smaller ("Topology
    layout "v5e:1x1" is not divisible by ... chips_per_host_bounds "2x2x1""); larger slices keep
    the default."""
    if tpu_slice.num_chips >= tpu_slice.chip.chips_per_host:
        return {}
    dims = [int(d) for d in tpu_slice.topology.split("x")]
    return {"chips_per_host_bounds": (*dims, *[1] * (3 - len(dims)))}


def _topology_target(tpu_slice: accelerators.TpuSlice) -> Target:
    if not os.environ.get("JAX_PLATFORMS"):
        # This host has no TPU: keep JAX's own backend on the CPU while libtpu compiles.
        with contextlib.suppress(RuntimeError):
            jax.config.update("jax_platforms", "cpu")
    # A compile-only TPU client cannot load an executable back from JAX's persistent cache: with
    # JAX_COMPILATION_CACHE_DIR set, a second check of the same program printed libtpu's
    # "INVALID_ARGUMENT: PjRtCompiler must be constructed with a Client" and compiled anyway.
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX keeps its first decision otherwise
    try:
        topology = topologies.get_topology_desc(tpu_slice.name, "tpu", **host_bounds(tpu_slice))
    except Exception as error:  # libtpu absent, mismatched or busy: JAX raises several types here
        fix = (
            "another process holds libtpu: wait for it, or set ALLOW_MULTIPLE_LIBTPU_LOAD=1"
            if "lockfile" in str(error)
            else "install the matched pair with pip install 'rl-trainer-bench[tpu]'"
        )
        raise UserError(
            f"--target {tpu_slice.name}: cannot build the TPU topology on this host "
            f"({first_line(error)}); {fix}"
        ) from None
    devices = tuple(topology.devices)
    if len(devices) != tpu_slice.num_devices:
        raise UserError(
            f"--target {tpu_slice.name}: libtpu's topology has {len(devices)} devices where the"
            f" chip table expects {tpu_slice.describe()}; fix devices_per_chip of"
            f" {tpu_slice.chip.name} in rl_trainer_bench/chips/accelerators.py"
        )
    per_chip = tpu_slice.chip.devices_per_chip  # Ironwood shows each chip as two devices
    memory = tpu_slice.chip.device_memory_bytes
    source = tpu_slice.chip.device_memory_source
    return Target(
        tpu_slice.name, devices, devices[0].device_kind, memory, source, tpu_slice.chip, per_chip
    )
