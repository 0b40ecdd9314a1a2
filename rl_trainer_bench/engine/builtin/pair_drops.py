"""Whether a micro-batch's replayed routes drop a pair from the MoE buffers, counted on the host.

With router replay the routes are the micro-batch's own (`routed_experts`), so whether `fwd_bwd`
will raise its overflow flag is known before it runs. The engine compiles its dropless replay
program only when a micro-batch it will run drops a pair (`JaxEngine.compile_for`): on the
preset's cell none does, and that program's compile is the longest of the three.

The count follows the programs' own rule (`moe.expert_parallel`, `moe.local_capacity_ffn`,
`moe.local_sorted_ffn`): each device holds a block of rows (rows split over fsdp x expert) and of
tokens (split over context), flattens them in order and cuts them into `token_chunks` groups; a
padding token routes nowhere (`moe.route`); in each group and layer an expert keeps
`expert_capacity` pairs and any more drop. Which pairs drop depends on the ranking; whether any
does, only on the counts.
"""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.engine.config import (
    DROPLESS,
    EngineConfig,
    expert_capacity,
    tokens_per_group,
)


def drops_pairs(routes: np.ndarray, segment_ids: np.ndarray, config: EngineConfig) -> bool:
    """True when, at `config`'s buffer factor and mesh, some layer's group on some device routes
    more pairs to an expert than its slots.

    routes: [B, T, L, K] expert ids (-1: an empty slot); segment_ids: [B, T] (0: padding); both
    of a micro-batch `config`'s programs take (B and T split evenly, as `check_config` holds).
    """
    factor, num_experts = config.moe.ragged_buffer_factor, config.model.num_experts
    if factor == DROPLESS:
        return False
    rows, tokens, layers, top_k = routes.shape
    mesh, token_chunks = config.mesh, config.moe.token_chunks
    row_shards = mesh.fsdp * mesh.expert
    slots = expert_capacity(tokens_per_group(config), top_k, num_experts, factor)
    real = (segment_ids != 0)[:, :, None]
    for layer in range(layers):  # one layer at a time: a 397B micro-batch's routes are large
        # an unrouted pair goes to an extra bin, num_experts, which is never compared
        experts = np.where(real & (routes[:, :, layer] >= 0), routes[:, :, layer], num_experts)
        blocks = experts.reshape(
            row_shards, rows // row_shards, mesh.context, tokens // mesh.context, top_k
        ).transpose(0, 2, 1, 3, 4)  # [row block, token block, rows, tokens, K]: one a device
        groups = blocks.reshape(row_shards * mesh.context * token_chunks, -1).astype(np.int64)
        bins = groups + (num_experts + 1) * np.arange(len(groups))[:, None]
        counts = np.bincount(bins.ravel(), minlength=len(groups) * (num_experts + 1))
        if (counts.reshape(len(groups), -1)[:, :num_experts] > slots).any():
            return True
    return False
