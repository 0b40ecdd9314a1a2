"""Model FLOPs of a micro-batch: the accounting MFU is computed from (docs/engine.md).

Only real tokens count (padding is excluded), attention counts each segment's causal square, and
recomputation is either left out (model FLOPs) or added (hardware FLOPs under the remat policy).
Plain numpy, so a report can count FLOPs without building the engine.
"""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig


def active_parameters(config: EngineConfig) -> int:
    """Parameters one token passes through: its layers' mixers, router, K experts, shared expert,
    and the head (docs/gated-deltanet.md)."""
    m = config.model
    q_width, kv_width = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = (
        3 if m.attention_output_gate else 2
    ) * m.d_model * q_width + 2 * m.d_model * kv_width
    key_width = m.linear_num_key_heads * m.linear_key_head_dim
    value_width = m.linear_num_value_heads * m.linear_value_head_dim
    linear = m.d_model * (
        2 * key_width + 3 * value_width + 2 * m.linear_num_value_heads
    ) + m.linear_conv_kernel_dim * (2 * key_width + value_width)
    ffn = m.top_k * 3 * m.d_model * m.expert_ffn_dim + 3 * m.d_model * m.shared_expert_ffn_dim
    router = m.d_model * m.num_experts
    mixers = m.layers_of("full_attention") * attention + m.layers_of("linear_attention") * linear
    return mixers + m.num_layers * (ffn + router) + m.d_model * m.vocab_size


def linear_attention_macs_per_token(config: EngineConfig) -> float:
    """Multiply-adds of the chunked gated delta rule per token and value head, forward.

    Per chunk of C tokens: k k^T and q k^T (C Dk each per token), the triangular solve for
    [U | W] (C (Dv + Dk) / 2), the decayed q k^T times the deltas (C Dv), and W H, (G q) H and the
    state update (Dk Dv each). The second pass of context parallelism is not counted, like remat.
    """
    m = config.model
    chunk = min(m.linear_chunk_size, config.seq_len // max(config.mesh.context, 1))
    dk, dv = m.linear_key_head_dim, m.linear_value_head_dim
    return 2 * chunk * dk + chunk * (dk + dv) / 2 + chunk * dv + 3 * dk * dv


def causal_pairs(segment_ids: np.ndarray) -> float:
    """sum over segments of length^2 / 2: the (query, key) pairs causal attention scores."""
    squares = 0.0
    for row in np.asarray(segment_ids):
        _, lengths = np.unique(row[row != 0], return_counts=True)
        squares += float(np.sum(lengths.astype(np.float64) ** 2) / 2)
    return squares


def micro_batch_flops(config: EngineConfig, segment_ids: np.ndarray, count_remat: bool) -> float:
    """6 x real tokens x active parameters + 12 x full-attention layers x (H x hd) x causal pairs
    + 6 x real tokens x linear-attention layers x value heads x the chunked rule's multiply-adds
    per token (docs/gated-deltanet.md).

    count_remat=True adds the recomputation: layers x 4/3 under full remat, and the chunked head
    x 4/3 always (its logits are recomputed in the backward pass).
    """
    m = config.model
    tokens = int(np.count_nonzero(segment_ids))
    head = 6.0 * tokens * m.d_model * m.vocab_size
    layers = 6.0 * tokens * (active_parameters(config) - m.d_model * m.vocab_size)
    layers += (
        12.0 * m.layers_of("full_attention") * m.num_heads * m.head_dim * causal_pairs(segment_ids)
    )
    layers += (
        6.0
        * tokens
        * m.layers_of("linear_attention")
        * m.linear_num_value_heads
        * linear_attention_macs_per_token(config)
    )
    if count_remat:
        head *= 4 / 3
        if m.remat_policy == "full":
            layers *= 4 / 3
    return head + layers
