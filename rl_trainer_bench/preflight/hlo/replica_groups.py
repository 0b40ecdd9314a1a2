"""Which devices a collective's replica groups hold, and which mesh axes those groups are.

XLA writes a collective's groups three ways (explicit lists, an iota over a reshaped and transposed
device range, and a mesh with selected axes) and a collective-permute as source-target pairs; a
user thinks in mesh axes. Mapping the groups back to the axes of the mesh the program was compiled
for (`--mesh`, major to minor) tells which axis a collective moves data over; groups that are no
mesh slice map to none. `replica_groups={}` is one group of every device.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo.parse import HloModule, Instruction


def groups_and_axes(
    instruction: Instruction, module: HloModule, mesh: Mapping[str, int]
) -> tuple[int, tuple[str, ...] | None, bool]:
    """(group size, mesh axes, spans every device); size 0 and axes None where unknown."""
    devices = math.prod(mesh.values()) if mesh else module.device_count
    if instruction.opcode.startswith("collective-permute"):
        pairs = _pairs(instruction.attribute("source_target_pairs") or "")
        return 2, _axes_of_pairs(pairs, mesh) if mesh and pairs else None, False
    all_devices = re.search(r"replica_groups=\{\}", instruction.attributes) is not None
    if devices is None:
        if all_devices:
            return 0, None, True  # every device, but the header does not say how many
        devices = 0
    groups = replica_groups(instruction.attributes, devices)
    if groups is None:
        return 0, None, all_devices
    size = len(groups[0]) if groups else 0
    return size, _axes_of_groups(groups, mesh) if mesh else None, all_devices


def replica_groups(attributes: str, num_devices: int) -> list[list[int]] | None:
    """The device groups of a collective's `replica_groups` in any of XLA's three spellings.

    `{{0,1},{2,3}}` (explicit), `[2,2]<=[4]` or `[4,2]<=[2,2,2]T(2,1,0)` (iota), and
    `mesh['a'=4,'b'=2] {'a'}` with optional `device_ids=(...)` (mesh axes). `{}` means one group of
    all devices. None when the attribute is absent or not understood.
    """
    match = re.search(r"replica_groups=", attributes)
    if match is None:
        return None
    text = attributes[match.end() :]
    try:  # a damaged spelling (`[2,,4]<=[3]`) is not understood: None, not a traceback
        if text.startswith("mesh["):
            return _mesh_groups(text, num_devices)
        if text.startswith("["):
            iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
            return _iota(iota.group(1), iota.group(2), iota.group(3)).tolist() if iota else None
    except (ValueError, IndexError):
        return None
    if text.startswith("{}"):
        return [list(range(num_devices))]
    explicit = re.match(r"\{((?:\{[\d,\s]*\},?)*)\}", text)
    if explicit is None:
        return None
    return [
        [int(d) for d in group.split(",") if d.strip()]
        for group in re.findall(r"\{([\d,\s]*)\}", explicit.group(1))
    ]


def _iota(shape: str, dims: str, perm: str | None) -> np.ndarray:
    reshape = [int(d) for d in dims.split(",")]
    array = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        array = array.transpose([int(p) for p in perm.split(",")])
    return array.reshape([int(d) for d in shape.split(",")])


_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")


_SELECTED_AXIS = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")


def _mesh_groups(text: str, num_devices: int) -> list[list[int]] | None:
    """Groups of the mesh form: devices that differ only along the selected (sub-)axes."""
    head = re.match(r"mesh\[([^\]]*)\]", text)
    if head is None:
        return None
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(head.group(1))]
    rest = text[head.end() :]
    ids = np.arange(math.prod(s for _, s in axes) or num_devices)
    device_ids = re.match(r",\s*device_ids=\((\[[\d,]+\](?:<=\[[\d,]+\])?(?:T\([\d,]+\))?)\)", rest)
    if device_ids:
        iota = re.match(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?", device_ids.group(1))
        ids = _iota(str(ids.size), iota.group(2) or iota.group(1), iota.group(3)).reshape(-1)
        rest = rest[device_ids.end() :]
    selection = re.match(r"\s*\{([^}]*)\}", rest)
    if selection is None:
        return None
    # Split every axis into (major, selected, minor) pieces so sub-axes `'a':(pre)size` work too.
    dims: list[int] = []
    selected: list[int] = []
    chosen = {name: (pre, size) for name, pre, size in _SELECTED_AXIS.findall(selection.group(1))}
    for name, size in axes:
        if name not in chosen:
            dims.append(size)
            continue
        pre, sub = chosen[name]
        pre, sub = (int(pre), int(sub)) if sub else (1, size)
        dims += [pre, sub, size // (pre * sub)]
        selected.append(len(dims) - 2)
    grid = ids.reshape(dims)
    others = [d for d in range(len(dims)) if d not in selected]
    moved = np.transpose(grid, others + selected)
    group_size = math.prod(dims[d] for d in selected)
    return moved.reshape(-1, group_size).tolist()


def mesh_partition(mesh: Mapping[str, int], axes: Sequence[str]) -> frozenset[frozenset[int]]:
    """The device groups that a collective over `axes` of `mesh` uses (devices in mesh order)."""
    names = list(mesh)
    grid = np.arange(math.prod(mesh.values())).reshape([mesh[n] for n in names])
    keep = [names.index(a) for a in axes]
    others = [d for d in range(len(names)) if d not in keep]
    size = math.prod(mesh[a] for a in axes)
    groups = np.transpose(grid, others + keep).reshape(-1, size)
    return frozenset(frozenset(g) for g in groups.tolist())


def _axes_of_groups(groups: list[list[int]], mesh: Mapping[str, int]) -> tuple[str, ...] | None:
    wanted = frozenset(frozenset(g) for g in groups)
    names = [n for n in mesh if mesh[n] > 1]
    for count in range(len(names) + 1):
        for axes in itertools.combinations(names, count):
            if mesh_partition(mesh, axes) == wanted:
                return axes
    return None


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text)]


def _axes_of_pairs(pairs: list[tuple[int, int]], mesh: Mapping[str, int]) -> tuple[str, ...] | None:
    """The mesh axes along which a collective-permute's source and target differ."""
    shape = [mesh[n] for n in mesh]
    total = math.prod(shape)
    if any(a >= total or b >= total for a, b in pairs):
        return None
    differ: set[str] = set()
    for source, target in pairs:
        a, b = np.unravel_index(source, shape), np.unravel_index(target, shape)
        differ |= {name for name, x, y in zip(mesh, a, b, strict=True) if x != y}
    return tuple(n for n in mesh if n in differ)


def parse_mesh(text: str) -> dict[str, int]:
    """`fsdp=2,context=2,expert=2` (mesh order, major to minor) into an ordered mapping."""
    mesh: dict[str, int] = {}
    for piece in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = piece.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise UserError(
                f"--mesh: {piece!r} is not NAME=SIZE; write e.g. fsdp=2,context=2,expert=2"
            )
        mesh[name.strip()] = int(size)
    return mesh
