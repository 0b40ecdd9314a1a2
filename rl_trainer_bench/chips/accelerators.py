"""Facts about accelerator chips and TPU slices, in one table, for the ruler, the AOT check and the renderer.

MFU needs each chip's peak, the AOT check its memory, and the renderer a slice's node selectors,
hosts and Pathways instance type; keeping them in one place means a new chip is one row, and the
renderer can use it without importing JAX. Figures are public spec sheets unless marked measured.
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip kind."""

    name: str  # the name users type: h200, v5p, tpu7x, ...
    device_kinds: tuple[str, ...]  # jax `Device.device_kind` strings that mean this chip
    peak_bf16_flops: float  # per chip, FLOP/s
    peak_source: str
    memory_bytes: int  # per chip
    # TPU only: GKE node selector value, Pathways instance type prefix, chips per host, topology rank.
    gke_accelerator: str = ""
    pathways_prefix: str = ""
    chips_per_host: int = 0
    topology_dims: int = 0
    # Per chip, bytes/s: the roofline time estimate of the AOT check divides bytes accessed by it.
    hbm_bytes_per_second: float = 0.0
    # Per chip, bytes/s in both directions over all its inter-chip links (ICI), as the spec sheet
    # gives it: the op estimate (`preflight.op_estimate`) times collectives from it. 0: unknown.
    ici_bytes_per_second: float = 0.0
    ici_source: str = ""
    # JAX devices one chip shows as: Ironwood (tpu7x) has two TensorCore dies per chip and JAX
    # addresses each as a device with half the chip's memory, FLOP/s and bandwidth.
    devices_per_chip: int = 1
    # Per device: the memory the chip's runtime grants a program (`memory_stats()['bytes_limit']`),
    # where measured; less than the nameplate share (a v5e's 16 GiB grants 15.75 GiB), and the
    # figure a program's fit is judged against. 0: not measured, the nameplate share stands.
    runtime_memory_bytes: int = 0
    runtime_memory_source: str = ""
    # The side of one matrix unit's square array (a TPU's MXU): a matmul's dimensions are
    # padded to it on the unit (the op estimate's MXU work). 0: not in the table, no padding.
    mxu_size: int = 0
    mxu_source: str = ""
    # Matrix units a device has (with `mxu_size` and the peak they give the clock: peak / (units
    # x side^2 x 2 FLOPs)) and the 32-bit values one vector register holds, one vector op's work
    # a cycle: the op estimate times a kernel's vector work from them. 0: not in the table.
    mxu_count: int = 0
    vector_register_values: int = 0
    vector_source: str = ""

    def per_device(self, per_chip: float) -> float:
        """One JAX device's share of a per-chip figure (memory, FLOP/s, bandwidth)."""
        return per_chip / self.devices_per_chip

    @property
    def device_memory_bytes(self) -> int:
        """One JAX device's memory: what the runtime grants where measured, else the chip's
        nameplate memory shared by its devices."""
        return self.runtime_memory_bytes or self.memory_bytes // self.devices_per_chip

    @property
    def device_memory_source(self) -> str:
        """Where `device_memory_bytes` comes from, for a report's memory line."""
        if self.runtime_memory_bytes:
            return f"{self.name} runtime's bytes_limit, {self.runtime_memory_source}"
        return f"{self.name} table, {self.devices_per_chip} device(s) per chip"


CHIPS: tuple[Chip, ...] = (
    Chip(
        "h200",
        ("NVIDIA H200",),
        605e12,
        "measured bf16 8192^3 matmul, jax.jit, 2026-11-30",
        141 * 10**9,
        hbm_bytes_per_second=4.8e12,
    ),
    Chip(
        "h100",
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
        989e12,
        "NVIDIA spec sheet, dense bf16",
        80 * GIB,
        hbm_bytes_per_second=3.35e12,
    ),
    Chip(
        "v4",
        ("TPU v4",),
        275e12,
        "Cloud TPU v4 spec",
        32 * GIB,
        "tpu-v4-podslice",
        "tpuv4",
        4,
        3,
        hbm_bytes_per_second=1.228e12,
    ),
    Chip(
        "v5e",
        ("TPU v5 lite", "TPU v5e"),
        197e12,
        "Cloud TPU v5e spec",
        16 * GIB,
        "tpu-v5-lite-podslice",
        "tpuv5e",
        4,
        2,
        hbm_bytes_per_second=8.19e11,
        ici_bytes_per_second=2e11,
        ici_source="Cloud TPU v5e spec, interchip interconnect 1,600 Gbps",
        runtime_memory_bytes=16_909_336_064,
        runtime_memory_source="measured on one v5e chip, JAX 0.10.2, 2026-12-05",
        mxu_size=128,
        mxu_source="Cloud TPU v5e spec (four MXUs a TensorCore) and the Cloud TPU system"
        " architecture page (an MXU: 128 x 128 multiply-accumulators)",
        mxu_count=4,
        vector_register_values=8 * 128,
        vector_source="Pallas TPU docs, 'Writing TPU kernels with Pallas': vector memory is"
        " read and written in (8, 128) tiles, elementwise ops work on 32-bit values",
    ),
    Chip(
        "v5p",
        ("TPU v5", "TPU v5p"),
        459e12,
        "Cloud TPU v5p spec",
        95 * GIB,
        "tpu-v5p-slice",
        "tpuv5",
        4,
        3,
        hbm_bytes_per_second=2.765e12,
        ici_bytes_per_second=1.2e12,
        ici_source="Cloud TPU v5p spec, bidirectional ICI 1,200 GB/s a chip",
    ),
    Chip(
        "v6e",
        ("TPU v6 lite", "TPU v6e"),
        918e12,
        "Cloud TPU v6e spec",
        32 * GIB,
        "tpu-v6e-slice",
        "tpuv6e",
        4,
        2,
        hbm_bytes_per_second=1.64e12,
        ici_bytes_per_second=8e11,
        ici_source="Cloud TPU7x page, v6e column: bidirectional ICI 800 GB/s a chip",
    ),
    Chip(
        "tpu7x",
        ("TPU7x", "TPU 7x"),
        2307e12,
        "Cloud TPU Ironwood spec, bf16",
        192 * GIB,
        "tpu7x",
        "tpu7x",
        4,
        3,
        hbm_bytes_per_second=7.37e12,
        ici_bytes_per_second=1.2e12,
        ici_source="Cloud TPU7x spec, bidirectional ICI 1,200 GB/s a chip",
        devices_per_chip=2,
    ),
)


def chip_by_name(name: str) -> Chip:
    """The chip called `name` (case-insensitive); raises ValueError listing the known names."""
    for chip in CHIPS:
        if chip.name == name.lower():
            return chip
    raise ValueError(f"unknown chip {name!r}: known chips are {', '.join(c.name for c in CHIPS)}")


def chip_for_device_kind(device_kind: str) -> Chip | None:
    """The chip behind a JAX device kind string, or None (a CPU, or a chip not in the table)."""
    for chip in CHIPS:
        if device_kind in chip.device_kinds:
            return chip
    return None


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """A TPU slice such as `tpu7x:4x4x8`: the chip, the topology, and what follows from them."""

    chip: Chip
    topology: str  # "4x4x8"

    @property
    def name(self) -> str:
        return f"{self.chip.name}:{self.topology}"

    @property
    def torus(self) -> tuple[int, ...]:
        """Chips along each axis of the slice's topology."""
        return tuple(int(d) for d in self.topology.split("x"))

    @property
    def num_chips(self) -> int:
        return math.prod(self.torus)

    @property
    def num_devices(self) -> int:
        """JAX devices the slice shows (what a mesh over the whole slice spans)."""
        return self.num_chips * self.chip.devices_per_chip

    def describe(self) -> str:
        """`tpu7x:4x4x8 (128 chips = 256 devices)`, or `v5p:4x8x8 (256 chips)` at one device a chip."""
        if self.chip.devices_per_chip == 1:
            return f"{self.name} ({self.num_chips} chips)"
        return f"{self.name} ({self.num_chips} chips = {self.num_devices} devices)"

    @property
    def chips_per_host(self) -> int:
        return min(self.chip.chips_per_host, self.num_chips)

    @property
    def num_hosts(self) -> int:
        return self.num_chips // self.chips_per_host

    @property
    def pathways_instance_type(self) -> str:
        return f"{self.chip.pathways_prefix}:{self.topology}"


TPU_CHIPS = tuple(chip for chip in CHIPS if chip.gke_accelerator)
_SLICE_PATTERN = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+){1,2})$", re.ASCII)


def known_slice_forms() -> str:
    """A one-line list of accepted slice forms, for error messages."""
    return (
        ", ".join(f"{c.name}:{'x'.join(['N'] * c.topology_dims)}" for c in TPU_CHIPS)
        + " (e.g. v5e:2x2, v6e:2x4, v5p:4x8x8, tpu7x:4x4x8)"
    )


def parse_slice(text: str) -> TpuSlice:
    """Parse `CHIP:TOPOLOGY`; an unknown chip or a malformed topology raises ValueError with the known forms."""
    match = _SLICE_PATTERN.match(text.strip().lower())
    chip = next((c for c in TPU_CHIPS if match and c.name == match.group(1)), None)
    if match is None or chip is None:
        raise ValueError(f"unknown TPU slice {text!r}: known forms are {known_slice_forms()}")
    topology = match.group(2)
    dims = [int(d) for d in topology.split("x")]
    if len(dims) != chip.topology_dims or any(d < 1 for d in dims):
        raise ValueError(
            f"TPU slice {text!r}: {chip.name} topologies have {chip.topology_dims} dimensions; "
            f"known forms are {known_slice_forms()}"
        )
    tpu_slice = TpuSlice(chip, topology)
    if tpu_slice.num_chips > chip.chips_per_host and tpu_slice.num_chips % chip.chips_per_host:
        raise ValueError(
            f"TPU slice {text!r}: {tpu_slice.num_chips} chips do not fill hosts of "
            f"{chip.chips_per_host}; known forms are {known_slice_forms()}"
        )
    return tpu_slice
