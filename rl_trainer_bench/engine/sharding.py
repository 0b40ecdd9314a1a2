"""The device mesh (fsdp, context, expert) and every sharding rule of the engine, in one place.

Rows of a micro-batch are split over fsdp *and* expert, the sequence over context: the attention and
dense parts then run on disjoint tokens on every device (splitting rows over fsdp alone would repeat
them on each expert shard). Expert weights are split over expert (their model dim over fsdp), every
other weight over fsdp. The MoE layer groups tokens by the device that holds them, so a group's
buffer moves to its experts' devices by one all-to-all over the expert axis (`DISPATCH`).

No other module spells a PartitionSpec: they name a rule from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.parameters import PARAMETERS

AXES = ("fsdp", "context", "expert")
ROWS = ("fsdp", "expert")  # mesh axes that split the rows (B) of a micro-batch

P = PartitionSpec
TOKENS = P(ROWS, "context")  # [B, T, ...]: any per-token array
ACTIVATIONS = P(ROWS, "context", None)  # [B, T, D]
GROUPED = P(
    ROWS, "context", None, None
)  # [Gr, Gc, N, D]: tokens grouped by the device holding them
DISPATCH = P("fsdp", "context", "expert", None, None)  # [Gr, Gc, E, C, D] at the experts' devices
COLLECTED = P(ROWS, "context", None, None, None)  # [Gr, Gc, E, C, D] back at the tokens' devices
REPLICATED = P()

# Mesh axes a parameter's `sharded` dim is split over, and the one its `expert_dim` is split over
# (`parameters.PARAMETERS` names the dims).
PARAMETER_AXES = "fsdp"
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


def row_groups(config: MeshConfig) -> int:
    """How many row shards a micro-batch has (fsdp x expert)."""
    return config.fsdp * config.expert


def named(mesh, spec: PartitionSpec, memory_kind: str | None = None) -> NamedSharding:
    """A NamedSharding of `spec` over `mesh` (optionally in a given memory kind)."""
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def parameter_spec(name: str) -> PartitionSpec:
    """The PartitionSpec of parameter `name`, from its row in `parameters.PARAMETERS`."""
    parameter = PARAMETERS[name]
    axes = {parameter.sharded: PARAMETER_AXES, parameter.expert_dim: EXPERT_AXIS}
    return P(*(axes.get(dim) for dim in parameter.dims))


def parameter_shardings(mesh, params) -> dict:
    """A sharding per parameter, by the rules of `parameter_spec`."""
    return {name: named(mesh, parameter_spec(name)) for name in params}


def payload_sharding(mesh, ndim: int, memory_kind: str | None = None) -> NamedSharding:
    """Rows over (fsdp, expert), tokens over context, trailing dims (layers, top-k) whole."""
    return named(mesh, P(ROWS, "context", *([None] * (ndim - 2))), memory_kind)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """Pin an intermediate to a layout of the ambient mesh (set by the engine around tracing)."""
    return jax.lax.with_sharding_constraint(x, spec)
