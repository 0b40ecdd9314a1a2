"""A micro-batch's copy from host memory into the programs' input shardings, the link's fastest way.

Straight from the host arrays into device memory: a hop through a `pinned_host` buffer first is
many times slower on a TPU host, and a step that staged through one waited longer than its copy
(the chip's figures: BENCHMARKS.md, "What STAGE_BEFORE_UPDATE saves on one v5e chip", and
`benchmarks/chip/host_link_on_chip.py`, which remakes them). Two ways, for the two places a copy
is made:
- `copy(arrays)`, an unstaged input, on an idle device, with the step waiting: a TPU's link moves
  one large array at a fraction of the rate it moves the same bytes as pieces put together (their
  transfers run side by side), so each device's block of an array of at least two pieces' bytes
  is put as up to MAX_PIECES contiguous pieces of its rows-by-tokens view, of PIECE_BYTES or more,
  each array's pieces in one `device_put` (on every device at once), and joined on the device by one small
  program compiled with the engine's (a concatenation and a reshape in device memory, a few
  milliseconds where the copy saves tens). Smaller arrays go whole: a piece's fixed cost would eat
  what it saves.
- `start(arrays)`, a staged input, copied beside the step's last `fwd_bwd`: each array whole, on
  the engine's copying thread, so the call returns at once. Beside a running program a whole copy
  arrives while it runs and costs it nothing, whereas the pieces' join would queue on the device
  behind the program and lengthen the step by its own time.
The CPU has no link to fill: its arrays always go whole (`piece_bytes_for`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh

from rl_trainer_bench.engine.builtin import programs, sharding

PIECE_BYTES = 2 << 20  # a piece's least bytes; a device's block splits from twice this
MAX_PIECES = 32  # the most pieces of a block: the count the chip's figures go up to


def piece_bytes_for(platform: str) -> int | None:
    """The pieces' size on `platform` (None: every array whole; the CPU has no link to fill)."""
    return None if platform == "cpu" else PIECE_BYTES


@dataclasses.dataclass(frozen=True)
class Split:
    """How one array's device blocks are cut: `pieces` contiguous runs of its flattened rows."""

    pieces: int
    block: tuple[int, ...]  # one device's block of the array


def plan_split(block: tuple[int, ...], itemsize: int, piece_bytes: int) -> Split | None:
    """The cut of a device block of shape `block` into as many pieces of at least `piece_bytes`
    as it holds, MAX_PIECES at most (None: it goes whole, under two pieces' bytes)."""
    size = math.prod(block) * itemsize
    rows = block[0] * block[1] if len(block) >= 2 else 0
    if size < 2 * piece_bytes or rows < 2:
        return None
    return Split(min(MAX_PIECES, rows, size // piece_bytes), block)


def describe_policy(piece_bytes: int | None) -> str:
    """The copy's path for pieces of `piece_bytes` (`piece_bytes_for`), for the run's header."""
    if piece_bytes is None:
        return "host->device, each array whole"
    return (
        f"host->device; unstaged, a device's block of {2 * piece_bytes / 2**20:g} MiB or more in"
        f" up to {MAX_PIECES} pieces of {piece_bytes / 2**20:g} MiB or more, joined on the device;"
        " staged, each array whole"
    )


class InputCopy:
    """Copies micro-batches of one spec onto one mesh; `describe()` names the path it takes."""

    def __init__(
        self, mesh: Mesh, spec: Mapping[str, jax.ShapeDtypeStruct], piece_bytes: int | None
    ):
        """`piece_bytes`: the pieces' size (`piece_bytes_for`); None puts every array whole."""
        self._mesh, self._piece_bytes = mesh, piece_bytes
        self._targets = programs.input_shardings(mesh, spec)
        self._splits: dict[str, Split] = {}
        if piece_bytes is not None:
            for name, s in spec.items():
                block = self._targets[name].shard_shape(s.shape)
                cut = plan_split(block, np.dtype(s.dtype).itemsize, piece_bytes)
                if cut is not None:
                    self._splits[name] = cut
        self._join = self._compiled_join(spec) if self._splits else None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "engine-input-copy")

    def describe(self) -> str:
        """The path, for the run's header: the policy, and which arrays it cuts into how many."""
        cut = ", ".join(f"{name} in {split.pieces}" for name, split in self._splits.items())
        return f"{describe_policy(self._piece_bytes)}: {cut or 'none cut'}"

    def copy(self, arrays: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """`arrays` on the devices in their input shardings, issued now, in pieces where cut."""
        whole = {name: a for name, a in arrays.items() if name not in self._splits}
        placed = jax.device_put(whole, {name: self._targets[name] for name in whole})
        if self._splits:
            pieces = {name: self._pieces(name, arrays[name]) for name in self._splits}
            placed.update(self._join(pieces))
        return placed

    def start(self, arrays: Mapping[str, np.ndarray]) -> concurrent.futures.Future:
        """`whole(arrays)` on the copying thread: a future of the device arrays."""
        return self._thread.submit(self.whole, arrays)

    def whole(self, arrays: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """`arrays` on the devices in their input shardings, each array whole, issued now."""
        return jax.device_put(dict(arrays), self._targets)

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    def _pieces(self, name: str, array: np.ndarray) -> list[jax.Array]:
        """Each device's block of `array` cut into the split's pieces, put together: piece j of
        every device forms the j-th piece array, laid out one device's piece after another."""
        split, target = self._splits[name], self._targets[name]
        by_device = {
            device: np.array_split(
                np.ascontiguousarray(array[index]).reshape(-1, *split.block[2:]), split.pieces
            )
            for device, index in target.addressable_devices_indices_map(array.shape).items()
        }
        devices = list(by_device)
        flat = [by_device[d][j] for j in range(split.pieces) for d in devices]
        on_device = jax.device_put(flat, [d for _ in range(split.pieces) for d in devices])
        layout = sharding.piece_sharding(self._mesh)
        pieces = []
        for j in range(split.pieces):
            blocks = on_device[j * len(devices) : (j + 1) * len(devices)]
            shape = (blocks[0].shape[0] * self._mesh.size, *blocks[0].shape[1:])
            pieces.append(jax.make_array_from_single_device_arrays(shape, layout, blocks))
        return pieces

    def _compiled_join(self, spec: Mapping[str, jax.ShapeDtypeStruct]):
        """One program joining every split array's pieces into its device blocks, compiled now
        (a compile inside a scored step would fail the run)."""
        splits, layout = self._splits, sharding.piece_sharding(self._mesh)

        def join_block(parts):
            return {
                name: jax.numpy.concatenate(parts[name], axis=0).reshape(split.block)
                for name, split in splits.items()
            }

        program = jax.jit(
            jax.shard_map(
                join_block,
                mesh=self._mesh,
                in_specs=(sharding.PIECES,),
                out_specs={name: self._targets[name].spec for name in splits},
            ),
            out_shardings={name: self._targets[name] for name in splits},
        )
        abstract = {
            name: [
                jax.ShapeDtypeStruct(
                    (rows * self._mesh.size, *split.block[2:]), spec[name].dtype, sharding=layout
                )
                for rows in _piece_rows(split)
            ]
            for name, split in splits.items()
        }
        return program.lower(abstract).compile()


def _piece_rows(split: Split) -> list[int]:
    """The rows of each piece, as `np.array_split` cuts a block's flattened rows."""
    rows = split.block[0] * split.block[1]
    return [len(part) for part in np.array_split(np.empty(rows, np.bool_), split.pieces)]
