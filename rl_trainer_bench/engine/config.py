"""The built-in engine's configuration: model shapes, mesh, loss, MoE buffers and optimizer.

Plain frozen data so it can be built from presets, a trainer argv or `key=value` engine flags at the
edge (`rl_trainer_bench.config`) and trusted everywhere past it. It lives inside `engine/` because
the engine imports nothing from the rest of the package.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder shapes. Each layer mixes tokens by grouped-query full attention or Gated DeltaNet
    (`layer_types`) and feeds forward through a routed MoE."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    expert_ffn_dim: int
    shared_expert_ffn_dim: int = 0  # 0: no shared expert
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    dtype: str = "bfloat16"  # activations and matmul inputs; parameters are kept in float32
    remat_policy: str = "full"  # full | minimal | none
    attention: str = "auto"  # auto | xla | cudnn (auto: cudnn on GPU, query-chunked XLA elsewhere)
    attention_chunk_size: int = 1024  # query tokens per chunk on the XLA path
    attention_output_gate: bool = False  # full attention's output times sigmoid(x W_gate)
    # The mixer of each layer of a block that repeats num_layers / len(layer_types) times.
    layer_types: tuple[str, ...] = ("full_attention",)  # full_attention | linear_attention
    # Gated DeltaNet shapes (linear_attention layers; docs/engine.md, "Gated DeltaNet").
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    linear_chunk_size: int = 64  # tokens per chunk of the chunked gated delta rule

    def layers_of(self, kind: str) -> int:
        """How many of the num_layers layers are of mixer `kind`."""
        return self.num_layers // len(self.layer_types) * self.layer_types.count(kind)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh axes (fsdp, context, expert); their product must equal the device count."""

    fsdp: int = 1
    context: int = 1
    expert: int = 1

    @property
    def size(self) -> int:
        return self.fsdp * self.context * self.expert


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """GRPO clipped surrogate and k3 KL (docs/engine.md)."""

    epsilon: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0
    compute_logps_chunk_size: int = 512
    logits_dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Expert buffers, drops, replay and the expert-compute layout."""

    ragged_buffer_factor: float = 1.25  # -1: capacity = local tokens, never drops
    retry_when_tokens_dropped: bool = True
    expert_compute: str = "auto"  # auto | einsum | ragged_dot
    # The dropless program's layout: capacity (E x N slots) | ragged_dot | gmm (token-sorted pairs
    # and a grouped matmul; gmm on TPU only) | auto (gmm on TPU, ragged_dot elsewhere)
    dropless_compute: str = "auto"
    router_replay: bool = True  # micro-batches carry routed_experts (what AOT lowering assumes)


def expert_capacity(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Slots per expert for a group of `tokens` tokens: ceil(factor x N x K / E), at least one.

    Factor -1 is dropless: every token fits. The payload builder's overflow prediction uses this
    same formula, which is why it lives here, free of JAX (docs/engine.md, capacity and drops).
    """
    if factor == -1:
        return tokens
    return max(1, math.ceil(factor * tokens * top_k / num_experts))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and a schedule, as the trainer argv's `--optimizer_*` sets it."""

    learning_rate: float = 1e-6
    schedule: str = "constant"  # constant | warmup_cosine_decay_schedule
    init_value: float = 0.0
    peak_value: float = 1e-6
    end_value: float = 0.0
    warmup_steps: int = 0
    decay_steps: int = 1
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the built-in engine needs to build, shard and train its programs."""

    model: ModelConfig
    mesh: MeshConfig = MeshConfig()
    loss: LossConfig = LossConfig()
    moe: MoeConfig = MoeConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    micro_batch_rows: int = 8  # B
    seq_len: int = 128  # T
    matmul_precision: str = "default"  # default | high | highest
    seed: int = 0
