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

from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.engine_config import MeshConfig

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

# Parameter rules by name; stacked layer weights carry a leading, unsharded layer axis.
PARAMETER_SPECS = {
    "embed": P("fsdp", None),  # [V, D]
    "final_norm": P(None),  # [D]
    "head": P(None, "fsdp"),  # [D, V]
    "attn_norm": P(None, None),  # [L, D]
    "wq": P(None, "fsdp", None, None),  # [L, D, H, hd]
    "wk": P(None, "fsdp", None, None),  # [L, D, KV, hd]
    "wv": P(None, "fsdp", None, None),  # [L, D, KV, hd]
    "wo": P(None, None, None, "fsdp"),  # [L, H, hd, D]
    "mlp_norm": P(None, None),  # [L, D]
    "router": P(None, "fsdp", None),  # [L, D, E]
    "expert_gate": P(None, "expert", "fsdp", None),  # [L, E, D, F]
    "expert_up": P(None, "expert", "fsdp", None),  # [L, E, D, F]
    "expert_down": P(None, "expert", None, "fsdp"),  # [L, E, F, D]
    "shared_gate": P(None, "fsdp", None),  # [L, D, Fs]
    "shared_up": P(None, "fsdp", None),  # [L, D, Fs]
    "shared_down": P(None, None, "fsdp"),  # [L, Fs, D]
    "wq_gate": P(None, "fsdp", None, None),  # [L, D, H, hd]
    # Gated DeltaNet, stacked on its layers: projections split on D like attention's.
    "gdn_wq": P(None, "fsdp", None, None),  # [L, D, Hk, Dk]
    "gdn_wk": P(None, "fsdp", None, None),  # [L, D, Hk, Dk]
    "gdn_wv": P(None, "fsdp", None, None),  # [L, D, Hv, Dv]
    "gdn_wz": P(None, "fsdp", None, None),  # [L, D, Hv, Dv]
    "gdn_wb": P(None, "fsdp", None),  # [L, D, Hv]
    "gdn_wa": P(None, "fsdp", None),  # [L, D, Hv]
    "gdn_conv_q": P(None, None, None, None),  # [L, taps, Hk, Dk]
    "gdn_conv_k": P(None, None, None, None),  # [L, taps, Hk, Dk]
    "gdn_conv_v": P(None, None, None, None),  # [L, taps, Hv, Dv]
    "gdn_a_log": P(None, None),  # [L, Hv]
    "gdn_dt_bias": P(None, None),  # [L, Hv]
    "gdn_norm": P(None, None),  # [L, Dv]
    "gdn_wo": P(None, None, None, "fsdp"),  # [L, Hv, Dv, D]
}


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


def parameter_shardings(mesh, params) -> dict:
    """A sharding per parameter, by the name rules above."""
    return {name: named(mesh, PARAMETER_SPECS[name]) for name in params}


def payload_sharding(mesh, ndim: int, memory_kind: str | None = None) -> NamedSharding:
    """Rows over (fsdp, expert), tokens over context, trailing dims (layers, top-k) whole."""
    return named(mesh, P(ROWS, "context", *([None] * (ndim - 2))), memory_kind)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """Pin an intermediate to a layout of the ambient mesh (set by the engine around tracing)."""
    return jax.lax.with_sharding_constraint(x, spec)
