"""The device mesh (fsdp, context, expert) and every sharding rule of the engine, in one place.

Rows of a micro-batch are split over fsdp *and* expert, the sequence over context: the attention and
dense parts then run on disjoint tokens on every device (splitting rows over fsdp alone would repeat
them on each expert shard). Every parameter, and so every optimizer moment, gradient sum and
pending gradient, is split over every device of the mesh: expert weights over expert on their
expert dim and over (fsdp, context) on their model dim, every other weight over all three axes on
one dim (a dim the axes do not divide keeps the longest prefix of them that does).

Where a weight is whole: the dense weights of a layer are gathered in the compute dtype just
before use (`gathered`), so only one layer's weights are whole at a time. The parts whose
collectives decide the memory of the production cell run under `shard_map` with their collectives
written out (`docs/engine.md`, "Mesh"): the embedding lookup, attention (keys and values gathered
over context), the Gated DeltaNet chunk recurrence (shard states passed over context) and the MoE
layer (expert weights gathered over the axes of their model dim, buffers moved by one all-to-all
over expert). Left to the partitioner, those gathered the embedding and all experts' weights in
full on every device (benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md).

No other module spells a PartitionSpec: they name a rule from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rl_trainer_bench.engine.builtin.parameters import PARAMETERS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError

AXES = ("fsdp", "context", "expert")
ROWS = ("fsdp", "expert")  # mesh axes that split the rows (B) of a micro-batch

P = PartitionSpec
TOKENS = P(ROWS, "context")  # [B, T]: any per-token array
ACTIVATIONS = P(ROWS, "context", None)  # [B, T, D]
HEADS = P(ROWS, "context", None, None)  # [B, T, heads, width]
REPLICATED = P()
# A micro-batch array's piece in its copy (`input_copy.py`): each device's piece of its own block,
# one device's after another along the first dim.
PIECES = P(AXES)

# Mesh axes a parameter's `sharded` dim is split over (those its expert dim does not take), and the
# one its `expert_dim` is split over (`parameters.PARAMETERS` names the dims).
PARAMETER_AXES = AXES
EXPERT_AXIS = "expert"


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The (fsdp, context, expert) mesh over `devices` (default: all); sizes must multiply to their count."""
    devices = list(jax.devices() if devices is None else devices)
    if config.size != len(devices):
        raise ContractError(
            f"mesh fsdp={config.fsdp} x context={config.context} x expert={config.expert} "
            f"= {config.size} devices, but {len(devices)} are available: set mesh_fsdp, "
            f"mesh_context and mesh_expert so their product is {len(devices)}"
        )
    grid = np.asarray(devices, dtype=object).reshape(config.fsdp, config.context, config.expert)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def mesh_config_of(mesh: Mesh | jax.sharding.AbstractMesh) -> MeshConfig:
    """The MeshConfig a (possibly abstract) mesh realizes."""
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    return MeshConfig(fsdp=sizes["fsdp"], context=sizes["context"], expert=sizes["expert"])


def named(mesh, spec: PartitionSpec, memory_kind: str | None = None) -> NamedSharding:
    """A NamedSharding of `spec` over `mesh` (optionally in a given memory kind)."""
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def dividing_axes(size: int, axes: Sequence[str], mesh_shape: Mapping[str, int]) -> tuple[str, ...]:
    """The longest prefix of `axes` whose device count divides `size`."""
    axes = tuple(axes)
    while axes and size % math.prod(mesh_shape[a] for a in axes):
        axes = axes[:-1]
    return axes


def parameter_spec(name: str, shape: Sequence[int], mesh_shape: Mapping[str, int]) -> PartitionSpec:
    """The PartitionSpec of parameter `name` of `shape`, from its row in `parameters.PARAMETERS`.

    `shape` is the stacked parameter's, or one layer's slice of it (its layer dim scanned away).
    """
    parameter = PARAMETERS[name]
    dims = parameter.dims if len(shape) == len(parameter.dims) else parameter.dims[1:]
    spec: dict[str, tuple[str, ...]] = {}
    if parameter.expert_dim:
        size = shape[dims.index(parameter.expert_dim)]
        spec[parameter.expert_dim] = dividing_axes(size, (EXPERT_AXIS,), mesh_shape)
    if parameter.sharded:
        taken = {axis for axes in spec.values() for axis in axes}
        free = [axis for axis in PARAMETER_AXES if axis not in taken]
        size = shape[dims.index(parameter.sharded)]
        spec[parameter.sharded] = dividing_axes(size, free, mesh_shape)
    return P(*(spec.get(dim) or None for dim in dims))


def ambient_mesh_shape() -> dict[str, int]:
    """Axis sizes of the mesh the engine traces under (`jax.set_mesh`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))


def gather_dims(block: jax.Array, spec: PartitionSpec, keep: Sequence[str] = ()) -> jax.Array:
    """Inside `shard_map`: the whole of every dim of `block` that `spec` splits, but for `keep` axes.

    The FSDP gather written out: its transpose is a reduce-scatter of the gradient, in the dtype the
    block is gathered in.
    """
    for dim, axes in enumerate(spec):
        axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a not in keep)
        if axes:
            block = jax.lax.all_gather(block, axes, axis=dim, tiled=True)
    return block


def gathered(weight: jax.Array) -> jax.Array:
    """A dense weight (a layer's, its L dim scanned away) whole on every device.

    Pinning the gathered layout makes the FSDP all-gather explicit and puts it after the cast to
    the compute dtype, so it moves half the bytes of the float32 parameter. Expert weights are
    gathered inside the MoE layer instead (`moe.py`), over their model dim only.
    """
    return constrain(weight, REPLICATED)


def parameter_shardings(mesh, params) -> dict:
    """A sharding per parameter (ShapeDtypeStructs or arrays), by the rules of `parameter_spec`."""
    return {
        name: named(mesh, parameter_spec(name, value.shape, mesh.shape))
        for name, value in params.items()
    }


def unsharded_leaves(tree, devices: int) -> list[tuple[str, int]]:
    """(path, bytes per device) of every leaf of sharded ShapeDtypeStructs not split `devices` ways.

    Read by the memory report, so a leaf that stays whole somewhere is named with what it costs.
    """
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shard = leaf.sharding.shard_shape(leaf.shape)
        if math.prod(leaf.shape) < devices * math.prod(shard):
            nbytes = math.prod(shard) * np.dtype(leaf.dtype).itemsize
            found.append((jax.tree_util.keystr(path), nbytes))
    return found


def payload_sharding(mesh, ndim: int, memory_kind: str | None = None) -> NamedSharding:
    """Rows over (fsdp, expert), tokens over context, trailing dims (layers, top-k) whole."""
    return named(mesh, P(ROWS, "context", *([None] * (ndim - 2))), memory_kind)


def piece_sharding(mesh) -> NamedSharding:
    """Where the pieces of a micro-batch array's copy sit before they are joined (`PIECES`)."""
    return named(mesh, PIECES)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """Pin an intermediate to a layout of the ambient mesh (set by the engine around tracing)."""
    return jax.lax.with_sharding_constraint(x, spec)
