"""Which TPU chips this host has, read from its PCI bus without starting JAX.

The default preset of `run` and `ab` is the chip's own on a host with one TPU chip, so the main
job times the chip rather than the host's CPU beside it; the plan that says so is printed before
JAX starts, so the chips are found the way JAX's own TPU detection finds them: devices of Google's
PCI vendor id under /sys/bus/pci/devices, each chip kind by its PCI device id. The ids are those
JAX 0.10.2 lists (`jax._src.hardware_utils`); a host with another accelerator, or none, has no
local TPU here.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from pathlib import Path

PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_VENDOR_ID = "0x1ae0"
# PCI device id -> the chip table's name (`accelerators.TPU_CHIPS`)
TPU_DEVICE_IDS = {
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "tpu7x",
}


@dataclasses.dataclass(frozen=True)
class LocalTpu:
    """The TPU chips on this host: their kind (the chip table's name) and how many."""

    kind: str
    chips: int

    def describe(self) -> str:
        return f"{self.chips} TPU {self.kind} chip{'s' if self.chips > 1 else ''} on this host"


def local_tpu(devices: Path | None = None) -> LocalTpu | None:
    """This host's TPU chips (from the PCI tree `devices`, PCI_DEVICES by default), None without
    any or without a PCI tree to read. A host with chips of two kinds reports the most numerous."""
    kinds: collections.Counter[str] = collections.Counter()
    for vendor in sorted((devices or PCI_DEVICES).glob("*/vendor")):
        try:
            if vendor.read_text().strip() != GOOGLE_VENDOR_ID:
                continue
            kind = TPU_DEVICE_IDS.get((vendor.parent / "device").read_text().strip())
        except (OSError, ValueError):  # gone, unreadable, or not text: not a chip to time
            continue
        if kind is not None:
            kinds[kind] += 1
    if not kinds:
        return None
    kind, chips = kinds.most_common(1)[0]
    return LocalTpu(kind, chips)


def jax_platforms(env: Mapping[str, str]) -> list[str]:
    """JAX_PLATFORMS' entries, lower case, in order ([] when unset: JAX picks)."""
    return [
        entry.strip().lower() for entry in env.get("JAX_PLATFORMS", "").split(",") if entry.strip()
    ]


def usable_tpu(env: Mapping[str, str], devices: Path | None = None) -> LocalTpu | None:
    """This host's TPU chips where JAX may use them: JAX_PLATFORMS (in `env`) unset or naming
    `tpu`; None where it leaves TPUs out (`cpu`: the user keeps JAX off the chip)."""
    platforms = jax_platforms(env)
    if platforms and "tpu" not in platforms:
        return None
    return local_tpu(devices)
