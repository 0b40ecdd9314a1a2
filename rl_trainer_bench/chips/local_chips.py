"""Which TPU chips this process can open, read from the host's PCI bus and device nodes without
starting JAX.

The default preset of `run` and `ab` is the chip's own where the process can open one TPU chip, so
the main job times the chip rather than the host's CPU beside it; the plan that says so is printed
before JAX starts, so the chips are found without it. The PCI bus (/sys/bus/pci/devices: Google's
vendor id, each chip kind by its PCI device id, the ids JAX 0.10.2 lists in
`jax._src.hardware_utils`) names the kind, but it lists every chip of the VM: a container given one
chip of a 4-chip v5e VM (a GKE pod with `google.com/tpu: 1`) still sees four functions there. What
the process can open are the chips whose device node it has: a v5e, v5p, v6e or TPU7x chip is
opened through VFIO, as /dev/vfio/<its PCI function's iommu group>; a v4 chip as /dev/accel<N>. So
the chips counted are the TPU functions whose group node is present, plus the accel nodes present.
A host with another accelerator, or none, has no local TPU here.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

PCI_DEVICES = Path("/sys/bus/pci/devices")
DEVICE_NODES = Path("/dev")
GOOGLE_VENDOR_ID = "0x1ae0"
# PCI device id -> the chip table's name (`accelerators.TPU_CHIPS`)
TPU_DEVICE_IDS = {
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "tpu7x",
}
# /dev/accel0, /dev/accel1, ...: one node per chip where the chips are not behind VFIO
_ACCEL_NODE = re.compile(r"accel\d+")


@dataclasses.dataclass(frozen=True)
class LocalTpu:
    """The TPU chips this process can open: their kind (the chip table's name), how many, and how
    many of that kind the host's PCI bus lists (the VM's, more where the process was given some)."""

    kind: str
    chips: int
    on_bus: int

    def describe(self) -> str:
        said = f"{self.chips} TPU {self.kind} chip{'s' if self.chips > 1 else ''} on this host"
        if self.on_bus > self.chips:
            said += f" that this process can open, of {self.on_bus} on its PCI bus"
        return said


def _iommu_group(function: Path) -> str | None:
    """The iommu group of a PCI function (its `iommu_group` link names the group's folder)."""
    try:
        return Path(os.readlink(function / "iommu_group")).name
    except OSError:  # no IOMMU group: not a function VFIO can hand out
        return None


def _tpu_kind(function: Path) -> str | None:
    """The chip table's name of a PCI function that is a TPU chip, None for any other."""
    try:
        if (function / "vendor").read_text().strip() != GOOGLE_VENDOR_ID:
            return None
        return TPU_DEVICE_IDS.get((function / "device").read_text().strip())
    except (OSError, ValueError):  # gone, unreadable, or not text: not a chip to time
        return None


def local_tpu(devices: Path | None = None, nodes: Path | None = None) -> LocalTpu | None:
    """The TPU chips this process can open, from the PCI tree `devices` (PCI_DEVICES by default)
    and the device nodes under `nodes` (DEVICE_NODES); None without any. A host with chips of two
    kinds reports the most numerous on its bus."""
    nodes = nodes or DEVICE_NODES
    on_bus: collections.Counter[str] = collections.Counter()
    opened: collections.Counter[str] = collections.Counter()
    for function in sorted((devices or PCI_DEVICES).glob("*")):
        kind = _tpu_kind(function)
        if kind is None:
            continue
        on_bus[kind] += 1
        group = _iommu_group(function)
        if group is not None and (nodes / "vfio" / group).exists():
            opened[kind] += 1
    if not on_bus:
        return None
    kind, functions = on_bus.most_common(1)[0]
    accel = sum(1 for node in nodes.glob("accel*") if _ACCEL_NODE.fullmatch(node.name))
    chips = min(functions, opened[kind] + accel)
    return LocalTpu(kind, chips, functions) if chips else None


def jax_platforms(env: Mapping[str, str]) -> list[str]:
    """JAX_PLATFORMS' entries, lower case, in order ([] when unset: JAX picks)."""
    return [
        entry.strip().lower() for entry in env.get("JAX_PLATFORMS", "").split(",") if entry.strip()
    ]


def usable_tpu(
    env: Mapping[str, str], devices: Path | None = None, nodes: Path | None = None
) -> LocalTpu | None:
    """The TPU chips this process can open where JAX may use them: JAX_PLATFORMS (in `env`) unset
    or naming `tpu`; None where it leaves TPUs out (`cpu`: the user keeps JAX off the chip)."""
    platforms = jax_platforms(env)
    if platforms and "tpu" not in platforms:
        return None
    return local_tpu(devices, nodes)
