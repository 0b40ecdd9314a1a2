"""Presets: named cells (the engine's shapes and mesh, and the bench's default step shape).

A preset is where a run starts; the trainer argv and engine flags then move it
(`rl_trainer_bench.config.engine_keys`), and the driver knobs shape the step around it
(`rl_trainer_bench.config.knobs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.engine.config import (
    EngineConfig,
    MeshConfig,
    ModelConfig,
    MoeConfig,
)
from rl_trainer_bench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named cell: the engine's shapes and mesh, and the bench's default step shape."""

    name: str
    engine: EngineConfig
    micro_steps: int  # micro-batches per step
    host_devices: int  # CPU devices to force when running on the host platform (0: leave alone)
    purpose: str


# Qwen3.5's repeating block (full_attention_interval=4): three Gated DeltaNet layers, then one
# gated full-attention layer.
_QWEN35_BLOCK = ("linear_attention",) * 3 + ("full_attention",)

PRESETS: Mapping[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="cpu-tiny",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=512,
                    d_model=64,
                    num_layers=2,
                    num_heads=4,
                    num_kv_heads=2,
                    head_dim=16,
                    num_experts=8,
                    top_k=2,
                    expert_ffn_dim=64,
                    shared_expert_ffn_dim=64,
                    dtype="float32",
                ),
                mesh=MeshConfig(fsdp=2, context=2, expert=2),
                # Expert groups here hold only 64 tokens, so the synthetic profile's skew overflows
                # a 1.25 buffer on almost every micro-batch; 2.0 keeps replays occasional, as in
                # production, where groups hold thousands of tokens.
                moe=MoeConfig(ragged_buffer_factor=2.0),
                micro_batch_rows=4,
                seq_len=128,
            ),
            micro_steps=2,
            host_devices=8,
            purpose="tests and the default main job: seconds on 2 CPU cores, 8 host devices as 2x2x2",
        ),
        Preset(
            name="gpu-small",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=32_768,
                    d_model=2048,
                    num_layers=12,
                    num_heads=16,
                    num_kv_heads=4,
                    head_dim=128,
                    num_experts=64,
                    top_k=4,
                    expert_ffn_dim=1024,
                    shared_expert_ffn_dim=0,
                    attention_output_gate=True,
                    layer_types=_QWEN35_BLOCK,
                    linear_num_key_heads=8,
                    linear_num_value_heads=16,
                    linear_key_head_dim=128,
                    linear_value_head_dim=128,
                ),
                mesh=MeshConfig(),
                micro_batch_rows=8,
                seq_len=8192,
            ),
            micro_steps=4,
            host_devices=0,
            purpose="fills one H200 for about a second per micro-batch",
        ),
        Preset(
            # Qwen3.5-397B-A17B's public shapes (model card of Qwen/Qwen3.5-397B-A17B on Hugging
            # Face): 60 layers as 15 x (3 Gated DeltaNet + 1 gated full attention), hidden 4096;
            # full attention 32 query / 2 KV heads of 256; linear attention 16 QK / 64 V heads of
            # 128; 512 experts, 10 routed + 1 shared, of 1024; vocabulary 248,320. The 4-tap
            # convolution and the attention output gate (linear_conv_kernel_dim=4,
            # attn_output_gate=true) are from the public config.json files of the Qwen3.5 family
            # (qwen3_5 model type), which this model shares.
            name="qwen3.5-397b-cell",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=248_320,
                    d_model=4096,
                    num_layers=60,
                    num_heads=32,
                    num_kv_heads=2,
                    head_dim=256,
                    num_experts=512,
                    top_k=10,
                    expert_ffn_dim=1024,
                    shared_expert_ffn_dim=1024,
                    attention_output_gate=True,
                    layer_types=_QWEN35_BLOCK,
                    linear_num_key_heads=16,
                    linear_num_value_heads=64,
                    linear_key_head_dim=128,
                    linear_value_head_dim=128,
                    linear_conv_kernel_dim=4,
                ),
                mesh=MeshConfig(fsdp=32, context=4, expert=2),
                micro_batch_rows=64,
                seq_len=65_536,
            ),
            micro_steps=9,
            host_devices=0,
            purpose="the production cell's shapes on 256 devices: for AOT and payload building, not for running here",
        ),
    )
}


def preset(name: str) -> Preset:
    """The preset called `name`; an unknown name raises ConfigError listing the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"PRESET={name!r} is unknown: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
