"""The training state of the production cell spread over every device, checked on abstract meshes.

Nothing is allocated: `abstract_state` builds sharded ShapeDtypeStructs over a
`jax.sharding.AbstractMesh` of the slice's shape, so a 256-device layout is checked on this host.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import programs, sharding

CELL = PRESETS["qwen3.5-397b-cell"].engine


def abstract_mesh(fsdp, context, expert):
    return AbstractMesh((fsdp, context, expert), sharding.AXES, axis_types=(AxisType.Auto,) * 3)


@pytest.mark.parametrize(
    "mesh_shape",
    [(32, 4, 2), (16, 8, 2)],  # tpu7x:4x4x8 as the preset ships; the v5p:4x8x8 recipe
    ids=["tpu7x-32x4x2", "v5p-16x8x2"],
)
def test_every_state_leaf_of_the_cell_is_split_over_all_devices(mesh_shape):
    mesh = abstract_mesh(*mesh_shape)
    config = dataclasses.replace(CELL, mesh=sharding.mesh_config_of(mesh))
    state = programs.abstract_state(config, mesh)
    whole = sharding.unsharded_leaves(state, mesh.size)
    # Only the optimizer's step counters (int32 scalars) and Gated DeltaNet's small per-head and
    # per-channel weights (convolution taps, A_log, dt_bias, output norm: no dim of theirs splits
    # 256 ways; 34 MiB per device in all) stay whole.
    small = [(path, size) for path, size in whole if "gdn_" in path]
    assert [leaf for leaf in whole if leaf not in small] == [
        ("['opt_state'][1][0].count", 4),
        ("['opt_state'][1][2].count", 4),
    ]
    assert sum(size for _, size in small) < 36 * 2**20
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if leaf.ndim and "gdn_" not in jax.tree_util.keystr(path):  # beside the small weights
            shard = leaf.sharding.shard_shape(leaf.shape)
            assert math.prod(leaf.shape) == mesh.size * math.prod(shard)
    per_device = sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(state["params"])
    )
    parameters = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state["params"]))
    # The whole small weights add 8.9 MB of parameters per device to the even split.
    assert per_device == pytest.approx(4 * parameters / mesh.size, rel=2e-3)


def test_a_dim_the_mesh_does_not_divide_keeps_the_axes_that_do_and_is_reported():
    mesh = abstract_mesh(32, 4, 2)
    odd_vocab = dataclasses.replace(CELL.model, vocab_size=248_320 + 32)  # 32 x odd
    config = dataclasses.replace(CELL, model=odd_vocab)
    state = programs.abstract_state(config, mesh)
    assert state["params"]["embed"].sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    whole = dict(sharding.unsharded_leaves(state, mesh.size))
    embed_bytes = (248_320 + 32) // 32 * 4096 * 4
    assert whole["['params']['embed']"] == embed_bytes
    assert whole["['grad_accum']['embed']"] == embed_bytes
    assert "['params']['wq']" not in whole


def test_expert_weights_split_experts_over_expert_and_the_model_dim_over_the_rest():
    spec = sharding.parameter_spec(
        "expert_gate", (60, 512, 4096, 1024), abstract_mesh(32, 4, 2).shape
    )
    assert spec == jax.sharding.PartitionSpec(None, ("expert",), ("fsdp", "context"), None)
