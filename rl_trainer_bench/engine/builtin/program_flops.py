"""FLOPs the built-in engine's `fwd_bwd` executes on a micro-batch, against the model's FLOPs.

The model FLOPs (`flops.micro_batch_flops`) count what a trainer's program needs: each real
token's routed experts and each segment's causal attention. The built-in engine executes more,
by construction (docs/engine.md): its experts run a capacity-padded einsum, every slot of every
expert's buffer, ceil(factor x N x K / E) per group of N device-local positions, padding
positions included, unless the expert compute is token-sorted (the routed pairs alone); and its
attention scores every query against every key of its row (the causal and segment masks are
applied to the scores, no block is skipped). When a MaxText trainer
is timed with the built-in engine, the plan states the ratio of the two from this shape
arithmetic, so nobody reads the built-in engine's step time as the trainer's. Plain numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_trainer_bench.engine.builtin.flops import causal_pairs, micro_batch_flops
from rl_trainer_bench.engine.config import (
    DROPLESS,
    SORTED_EXPERT_COMPUTE,
    EngineConfig,
    expert_capacity,
    tokens_per_group,
)


@dataclasses.dataclass(frozen=True)
class ExecutedFlops:
    """A micro-batch's model FLOPs and what the built-in `fwd_bwd` executes, forward and backward."""

    model: float
    executed: float
    expert_ratio: float  # expert FLOPs executed / routed
    attention_ratio: float  # attention FLOPs executed / causal (0 without full-attention layers)

    @property
    def ratio(self) -> float:
        return self.executed / self.model


def builtin_fwd_bwd_flops(config: EngineConfig, segment_ids: np.ndarray) -> ExecutedFlops:
    """The built-in engine's FLOPs on a micro-batch with `segment_ids` [B, T] (0 = padding).

    Recomputation is left out on both sides (model FLOPs), so the ratio is the programs' own.
    """
    m = config.model
    rows, seq_len = segment_ids.shape
    real = float(np.count_nonzero(segment_ids))
    # Routed experts: 6 (forward and backward) x 3 matmuls of d_model x expert_ffn per pair.
    per_pair = 6.0 * 3 * m.d_model * m.expert_ffn_dim * m.num_layers
    routed = per_pair * real * m.top_k
    group = tokens_per_group(config)
    sorted_layout = config.moe.expert_compute in SORTED_EXPERT_COMPUTE
    if config.moe.ragged_buffer_factor == DROPLESS or sorted_layout:
        # the token-sorted grouped matmul runs the routed pairs (fewer where pairs drop; the TPU
        # kernel's row tiles shared by two experts run once per expert, which is not counted)
        executed_experts = routed
    else:
        slots = expert_capacity(group, m.top_k, m.num_experts, config.moe.ragged_buffer_factor)
        executed_experts = per_pair * (rows * seq_len / group) * m.num_experts * slots
    # Full attention: 12 x heads x head_dim per scored (query, key) pair, forward and backward.
    per_score = 12.0 * m.layers_of("full_attention") * m.num_heads * m.head_dim
    causal = per_score * causal_pairs(segment_ids)
    executed_attention = per_score * rows * float(seq_len) ** 2
    model = micro_batch_flops(config, segment_ids, count_remat=False)
    return ExecutedFlops(
        model=model,
        executed=model - routed - causal + executed_experts + executed_attention,
        expert_ratio=executed_experts / routed if routed else 1.0,
        attention_ratio=executed_attention / causal if causal else 0.0,
    )
