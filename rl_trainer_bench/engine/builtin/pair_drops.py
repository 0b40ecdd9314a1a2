"""Whether a micro-batch's replayed routes drop a pair from the MoE buffers, counted on the host.

With router replay the routes are the micro-batch's own (`routed_experts`), so whether `fwd_bwd`
will raise its overflow flag is known before it runs. The engine compiles its dropless replay
program only when a micro-batch it will run drops a pair (`JaxEngine.will_run`): on the
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
    layers, top_k = routes.shape[2:]
    slots = expert_capacity(tokens_per_group(config), top_k, num_experts, factor)
    offsets, groups = _group_offsets(segment_ids, config)
    for layer in range(layers):  # one layer at a time: a 397B micro-batch's routes are GiBs
        # each pair's bin: its group's block of E + 1 bins, the first for an empty slot (-1)
        bins = offsets[..., None] + routes[:, :, layer].reshape((*offsets.shape, top_k))
        counts = np.bincount(bins.ravel(), minlength=(groups + 1) * (num_experts + 1))
        if (counts[: groups * (num_experts + 1)].reshape(groups, -1)[:, 1:] > slots).any():
            return True
    return False


def _group_offsets(segment_ids: np.ndarray, config: EngineConfig) -> tuple[np.ndarray, int]:
    """Per token, laid out [row block, rows, token block, tokens] (a device holds one row block
    of one token block), the bin of expert 0 in its group's E + 1 bins, whose first counts empty
    slots (-1); a padding token's bins are one more group's, never compared. Also how many groups
    there are."""
    mesh, chunks, num_experts = config.mesh, config.moe.token_chunks, config.model.num_experts
    row_shards = mesh.fsdp * mesh.expert
    rows, tokens = segment_ids.shape[0] // row_shards, segment_ids.shape[1] // mesh.context
    groups = row_shards * mesh.context * chunks
    row_block = np.arange(row_shards).reshape(-1, 1, 1, 1)
    token_block = np.arange(mesh.context).reshape(1, 1, -1, 1)
    # a device flattens its rows' tokens in order and cuts them into `chunks` groups
    place = np.arange(rows).reshape(1, -1, 1, 1) * tokens + np.arange(tokens)
    group = (row_block * mesh.context + token_block) * chunks + place // (rows * tokens // chunks)
    real = segment_ids.reshape(row_shards, rows, mesh.context, tokens) != 0
    group = np.where(real, group, groups)
    return (group * (num_experts + 1) + 1).astype(np.int32), groups
