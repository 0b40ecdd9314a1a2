"""Model FLOPs of a micro-batch: the accounting MFU is computed from (docs/engine.md).

Only real tokens count (padding is excluded), attention counts each segment's causal square, and
recomputation is either left out (model FLOPs) or added (hardware FLOPs under the remat policy).
Plain numpy, so a report can count FLOPs without building the engine.
"""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig


def active_parameters(config: EngineConfig) -> int:
    """Parameters one token passes through: attention, router, K experts, shared expert, head."""
    m = config.model
    q_width, kv_width = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = 2 * m.d_model * q_width + 2 * m.d_model * kv_width
    ffn = m.top_k * 3 * m.d_model * m.expert_ffn_dim + 3 * m.d_model * m.shared_expert_ffn_dim
    router = m.d_model * m.num_experts
    return m.num_layers * (attention + ffn + router) + m.d_model * m.vocab_size


def causal_pairs(segment_ids: np.ndarray) -> float:
    """sum over segments of length^2 / 2: the (query, key) pairs causal attention scores."""
    squares = 0.0
    for row in np.asarray(segment_ids):
        _, lengths = np.unique(row[row != 0], return_counts=True)
        squares += float(np.sum(lengths.astype(np.float64) ** 2) / 2)
    return squares


def micro_batch_flops(config: EngineConfig, segment_ids: np.ndarray, count_remat: bool) -> float:
    """6 x real tokens x active parameters + 12 x L x (H x hd) x causal pairs.

    count_remat=True adds the recomputation: layers x 4/3 under full remat, and the chunked head
    x 4/3 always (its logits are recomputed in the backward pass).
    """
    m = config.model
    tokens = int(np.count_nonzero(segment_ids))
    head = 6.0 * tokens * m.d_model * m.vocab_size
    layers = 6.0 * tokens * (active_parameters(config) - m.d_model * m.vocab_size)
    layers += 12.0 * m.num_layers * m.num_heads * m.head_dim * causal_pairs(segment_ids)
    if count_remat:
        head *= 4 / 3
        if m.remat_policy == "full":
            layers *= 4 / 3
    return head + layers
