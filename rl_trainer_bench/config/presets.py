"""Presets: named cells (the engine's shapes and mesh, and the bench's default step shape).

A preset is where a run starts; the trainer argv and engine flags then move it
(`rl_trainer_bench.config.engine_keys`), and the driver knobs shape the step around it
(`rl_trainer_bench.config.knobs`). A preset built from a public model's shapes lists the names the
trainer's flags give that model (`--model_name`, `--maxtext_model_name`, `--model_id`), so a pod
rendered from a launcher's output times the trainer's own model without being told (PRESET
overrides the mapping).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.chips.local_chips import LocalTpu
from rl_trainer_bench.engine.config import (
    DROPLESS,
    EngineConfig,
    LossConfig,
    MeshConfig,
    ModelConfig,
    MoeConfig,
    OptimizerConfig,
    value_at,
    with_value_at,
)
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TrainerDifference:
    """An engine key the preset sets where the trainer keeps another value, and why."""

    path: str  # dotted EngineConfig field, e.g. optimizer.memory_host_offload
    key: str  # the key users set, e.g. optimizer_memory_host_offload
    value: object  # the preset's value
    trainer_value: object  # the trainer's value, where it sets none (its engine's default)
    why: str
    # The engine (`module:Class`) whose program the difference is for ("": every engine's). Any
    # other engine gets the trainer's value: a workaround for one engine's memory never changes
    # the trainer's settings in another engine's program.
    engine: str = ""

    def holds(self, engine: EngineConfig) -> bool:
        """Whether `engine` (the preset with the user's keys applied) still has the value."""
        return value_at(engine, self.path) == self.value

    def describe(self) -> str:
        shown = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"{self.key}={shown}: {self.why}"


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named cell: the engine's shapes and mesh, and the bench's default step shape."""

    name: str
    engine: EngineConfig
    micro_steps: int  # micro-batches per step
    host_devices: int  # CPU devices to force when running on the host platform (0: leave alone)
    purpose: str
    models: tuple[str, ...] = ()  # the trainer's names for this model, lower case
    # The shipped routing profile (rl_trainer_bench/payload/profiles/) its micro-batches follow
    # unless ROUTING_PROFILE names another.
    routing_profile: str = "default.json"
    # Where the preset sets an engine key otherwise than the trainer it stands for, and why: the
    # plan and the render summary print each one that still holds once TRAINER_ARGV and
    # ENGINE_FLAGS are applied, so a cell never differs from the trainer without a word.
    differs_from_trainer: tuple[TrainerDifference, ...] = ()
    # Why the preset sets an engine key otherwise than the engine's default: (key, reason), which
    # the plan prints beside each value the trainer's command leaves to the preset.
    value_reasons: tuple[tuple[str, str], ...] = ()

    def engine_for(self, engine: str) -> EngineConfig:
        """The preset's engine config as the engine `engine` names times it: each difference from
        the trainer that is another engine's set back to the trainer's value."""
        config = self.engine
        for difference in self.differs_from_trainer:
            if difference.engine and difference.engine != engine:
                config = with_value_at(config, difference.path, difference.trainer_value)
        return config


# The report, and its sections, that hold the figures behind the 397B cell's host offload.
_FIT_REPORT = "benchmarks/reports/aot-397b-fit_tpu7x-v5p_2026-12-05.md"
_OWN_KEYS_SECTION = "The preset's own keys on tpu7x:4x4x8"
_PEAK_MODEL_SECTION = "The 397B fit tables under the corrected model of the peak"

# Qwen3.5's repeating block (full_attention_interval=4): three Gated DeltaNet layers, then one
# gated full-attention layer.
_QWEN35_BLOCK = ("linear_attention",) * 3 + ("full_attention",)

# Qwen3.5-397B-A17B's public shapes (model card of Qwen/Qwen3.5-397B-A17B on Hugging Face): 60
# layers as 15 x (3 Gated DeltaNet + 1 gated full attention), hidden 4096; full attention 32 query
# / 2 KV heads of 256; linear attention 16 QK / 64 V heads of 128; 512 experts, 10 routed + 1
# shared, of 1024; vocabulary 248,320. The 4-tap convolution and the attention output gate
# (linear_conv_kernel_dim=4, attn_output_gate=true) are from the public config.json files of the
# Qwen3.5 family (qwen3_5 model type), which this model shares.
_QWEN35_397B = ModelConfig(
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
    # [B, H, chunk, T] float32 logits per device: 2 GiB at 256 for 65,536-token rows, 8 GiB at
    # the engine default of 1024 (benchmarks/reports/aot-397b-fit_tpu7x-v5p_2026-12-05.md).
    attention_chunk_size=256,
)

# A Qwen3.5 block MoE that fills one H200 (gpu-small), and the stem of the one-chip TPU cells.
_GPU_SMALL = EngineConfig(
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
)

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
                    # One Gated DeltaNet layer and one gated full-attention layer, so the tests and
                    # the main job run both mixers; chunks of 32 give each 64-token context
                    # shard two chunks, so the chunk recurrence and the shard hand-over both run.
                    attention_output_gate=True,
                    layer_types=("linear_attention", "full_attention"),
                    linear_num_key_heads=2,
                    linear_num_value_heads=8,
                    linear_key_head_dim=16,
                    linear_value_head_dim=16,
                    linear_chunk_size=32,
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
            purpose="tests and the default main job: seconds on 2 CPU cores, 8 host devices as 2x2x2,"
            " one layer of each mixer",
        ),
        Preset(
            name="cpu-tiny-dense",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=512,
                    d_model=64,
                    num_layers=2,
                    num_heads=4,
                    num_kv_heads=2,
                    head_dim=16,
                    num_experts=1,
                    top_k=1,
                    expert_ffn_dim=128,
                    dtype="float32",
                ),
                mesh=MeshConfig(fsdp=8),
                moe=MoeConfig(ragged_buffer_factor=DROPLESS, router_replay=False),
                micro_batch_rows=8,
                seq_len=128,
            ),
            micro_steps=2,
            host_devices=8,
            purpose="one expert per layer (a dense feed-forward), pure FSDP over 8 host devices:"
            " the shapes another engine's dense model can match, for engine-vs-engine A/Bs",
        ),
        Preset(
            # Qwen3.5's recipe at a size 2 CPU cores run in seconds, for the built-in engine and
            # MaxText's (whose qwen3_5 decoder it maps onto, docs/engine.md): one repeating block
            # of three Gated DeltaNet layers and one gated full-attention layer, a routed MoE with
            # replayed routes and a shared expert as wide as a routed one, Qwen3.5's rope base.
            # head_dim 32 leaves partial rotary (a quarter of each head) 4 frequency pairs to
            # split. The buffer is dropless: MaxText's ring of experts, which its MoE takes on a
            # CPU, has no finite buffer there, so both engines run the same MoE.
            name="cpu-tiny-qwen3.5",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=512,
                    d_model=64,
                    num_layers=4,
                    num_heads=4,
                    num_kv_heads=2,
                    head_dim=32,
                    num_experts=8,
                    top_k=2,
                    expert_ffn_dim=64,
                    shared_expert_ffn_dim=64,
                    rope_theta=10_000_000.0,
                    dtype="float32",
                    attention_output_gate=True,
                    layer_types=_QWEN35_BLOCK,
                    linear_num_key_heads=2,
                    linear_num_value_heads=4,
                    linear_key_head_dim=16,
                    linear_value_head_dim=16,
                    linear_chunk_size=32,
                ),
                mesh=MeshConfig(fsdp=2, context=2, expert=2),
                moe=MoeConfig(ragged_buffer_factor=DROPLESS),
                micro_batch_rows=4,
                seq_len=128,
            ),
            micro_steps=2,
            host_devices=8,
            purpose="a Qwen3.5 block (3 Gated DeltaNet + 1 gated attention, shared expert, router"
            " replay) on 8 host devices as 2x2x2: the MoE cell both engines run, for"
            " engine-vs-engine A/Bs",
        ),
        Preset(
            name="gpu-small",
            engine=_GPU_SMALL,
            micro_steps=4,
            host_devices=0,
            purpose="fills one H200 for about a second per micro-batch",
        ),
        Preset(
            # gpu-small cut to one TPU v5e chip: the cell that ran `run` and `ab` there for
            # minutes on 2026-12-05 (602M parameters;
            # benchmarks/reports/chip-round-0_tpu-v5e_2026-12-05.md), now with the production's
            # MoE buffers, a shared expert and Adam's first moment in bfloat16, sized by aot's
            # corrected peak.
            name="tpu-v5e-1",
            engine=dataclasses.replace(
                _GPU_SMALL,
                # attention through Pallas' splash kernel, as the trainer's MaxText runs its flash
                model=dataclasses.replace(
                    _GPU_SMALL.model,
                    num_layers=4,
                    num_experts=16,
                    shared_expert_ffn_dim=1024,
                    attention="splash",
                    # each chunk's triangular inverse in VMEM (4.0% faster than XLA's:
                    # benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md)
                    linear_chunk_inverse="pallas",
                    # the gated delta rule's chunks in Pallas kernels, forward and backward
                    # (9.7% faster than the XLA path with that inverse, the loss within 3e-5:
                    # benchmarks/reports/chip-round-6_tpu-v5e_2026-12-07.md)
                    linear_chunk_kernel="pallas",
                    # 4 value heads a kernel program (0.9% faster than 2, the same loss:
                    # benchmarks/reports/chip-round-7_tpu-v5e_2026-12-07.md)
                    linear_chunk_kernel_heads=4,
                    # the rule's forward results kept, not computed again for the backward pass
                    # (0.6% faster with the layers scanned, 0.86 GiB more of the peak:
                    # benchmarks/reports/chip-round-12_tpu-v5e_2026-12-07.md)
                    keep_delta_rule_outputs=True,
                    # the short convolutions and SiLU in Pallas kernels (2.8% faster than XLA's,
                    # the loss within 6e-5: benchmarks/reports/chip-round-9_tpu-v5e_2026-12-07.md)
                    linear_conv_kernel="pallas",
                    # each layer keeps its matmuls' outputs for the backward pass (1.3% faster
                    # than full: benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md)
                    remat_policy="minimal",
                    # the 4 layers one after another, not scanned: what each keeps is its own
                    # buffer, not copied into and out of stacks (4.3% faster, 0.34 GiB less of
                    # aot's peak: benchmarks/reports/chip-round-12_tpu-v5e_2026-12-07.md)
                    scan_layers=False,
                    # half as many chunk steps, each [C, C] term as wide as the TPU's 128 lanes
                    # (0.8% faster than 64: the same report)
                    linear_chunk_size=128,
                ),
                # what the gradient summed in place frees (1.6 GiB) buys: the chip's peak
                # 13.41-13.47 GiB, 25.0 us a token against 25.7 at 5 rows (2.6% less; MFU 32.8%
                # against 31.9%: benchmarks/reports/chip-round-11_tpu-v5e_2026-12-07.md)
                micro_batch_rows=6,
                seq_len=4096,
                # The seeds' run: factor 2.75 over 2 token groups, 0 drops and 0 replays there;
                # the kept pairs sorted through the TPU grouped-matmul kernel, not 2.75x the work
                moe=MoeConfig(
                    ragged_buffer_factor=2.75, token_chunks=2, expert_compute="sorted_gmm"
                ),
                # the head's gradient formed in the forward pass: three of its matmuls, not four
                # (2.4% faster than saved_lse, the loss within 5e-6: benchmarks/reports/
                # chip-round-10_tpu-v5e_2026-12-07.md)
                loss=LossConfig(logps_gradient="in_forward"),
                # Adam's first moment in bfloat16, as the public tpu7x recipe's mu_dtype
                optimizer=OptimizerConfig(mu_dtype="bfloat16"),
            ),
            micro_steps=4,
            host_devices=0,
            purpose="one TPU v5e chip (15.75 GiB): gpu-small's Qwen3.5 block cut to 4 layers (one"
            " block), 16 experts (top 4) with a shared expert 1,024 wide, and 6 rows of 4,096"
            " tokens, hidden 2048 (the 397B cell's 4096 does not fit one chip beside its Adam"
            " state); the seeds' MoE buffers (factor 2.75 over 2 token groups: no replay), their"
            " kept pairs sorted through the TPU grouped-matmul kernel (expert_compute=sorted_gmm,"
            " the trainer's MaxText runs its own), attention through Pallas' splash kernel"
            " (attention=splash), the Gated DeltaNet's chunks in Pallas kernels"
            " (linear_chunk_kernel=pallas, 4 heads a program: linear_chunk_kernel_heads=4) of 128"
            " tokens (linear_chunk_size=128), their forward's results kept for the backward pass"
            " (keep_delta_rule_outputs), and their short convolutions in Pallas kernels"
            " (linear_conv_kernel=pallas), each layer's matmul outputs kept for the backward"
            " pass (remat_policy=minimal), the layers one after another (scan_layers=false), the"
            " head's gradient formed in the forward pass"
            " (logps_gradient=in_forward), and Adam's mu in bfloat16, as the tpu7x recipe's; aot's"
            " peak 13.87 GiB (11.9% free)",
        ),
        Preset(
            # The 397B cell's shapes cut to one TPU v6e chip: one Qwen3.5 block, its hidden size
            # and head shapes, 6 of its experts with the shared one, a 32,768-token vocabulary
            # (its 248,320 would be 2 billion parameters of embedding and head alone). At 8
            # experts and 4 rows `aot --target v6e:1x1` gave a peak of 37.1 GiB, at 2 rows 32.36.
            name="tpu-v6e-1",
            engine=EngineConfig(
                model=dataclasses.replace(
                    _QWEN35_397B,
                    vocab_size=32_768,
                    num_layers=4,
                    num_experts=6,
                    top_k=2,
                    attention="splash",
                ),
                mesh=MeshConfig(),
                micro_batch_rows=2,
                seq_len=4096,
                # The seeds' MoE buffers, their kept pairs through the TPU grouped-matmul kernel
                moe=MoeConfig(
                    ragged_buffer_factor=2.75, token_chunks=2, expert_compute="sorted_gmm"
                ),
                # Adam's first moment in bfloat16, as the public tpu7x recipe's mu_dtype
                optimizer=OptimizerConfig(mu_dtype="bfloat16"),
            ),
            micro_steps=4,
            host_devices=0,
            purpose="one TPU v6e chip (32 GiB): the 397B cell's hidden size, head shapes and"
            " shared expert in one Qwen3.5 block (4 layers), cut to 6 experts (top 2), a"
            " 32,768-token vocabulary and 2 rows of 4,096 tokens; the seeds' MoE buffers (factor"
            " 2.75 over 2 token groups) with their kept pairs through the TPU grouped-matmul"
            " kernel, attention through Pallas' splash kernel, Adam's mu in bfloat16 as the tpu7x"
            " recipe's; aot's peak 23.80 GiB (25.6% free) from a CPU host, not yet run on a v6e"
            " chip",
        ),
        Preset(
            # Qwen3.5-397B-A17B's public shapes (_QWEN35_397B) on the public tpu7x recipe's mesh.
            name="qwen3.5-397b-cell",
            engine=EngineConfig(
                model=_QWEN35_397B,
                mesh=MeshConfig(fsdp=32, context=4, expert=2),
                micro_batch_rows=64,
                seq_len=65_536,
                # The measured public run's MoE buffers: factor 2.75 over 2 token groups per
                # device, with dropless retry (0 drops and 0 replays there).
                moe=MoeConfig(ragged_buffer_factor=2.75, token_chunks=2),
                # Adam's first moment in bfloat16, as the public tpu7x recipe's mu_dtype; the
                # state in host memory between updates, where the trainer keeps it on the device
                # (`differs_from_trainer` below says why).
                optimizer=OptimizerConfig(mu_dtype="bfloat16", memory_host_offload=True),
            ),
            micro_steps=9,
            host_devices=0,
            purpose="the production cell's shapes on 256 devices: for AOT and payload building, not for running here",
            models=("qwen3.5-397b-a17b",),
            # Fitted to the measured run's 0 replays at factor 2.75 with 2 token chunks, not
            # derived from routing data (benchmarks/payload/routing_profile_397b.py,
            # benchmarks/reports/routing-profile-397b_cpu_2026-12-03.md).
            routing_profile="qwen3.5-397b.json",
            value_reasons=(
                ("ragged_buffer_factor", "the measured public run's, with 0 drops and 0 replays"),
                ("num_moe_token_chunks", "the measured public run's"),
                ("mu_dtype", "the public tpu7x recipe's"),
                (
                    "optimizer_memory_host_offload",
                    "the trainer keeps the state on the device: see 'preset differs from the"
                    " trainer'",
                ),
                (
                    "attention_chunk_size",
                    "2 GiB of float32 logits per device for 65,536-token rows, 8 GiB at 1024:"
                    " benchmarks/reports/aot-397b-fit_tpu7x-v5p_2026-12-05.md",
                ),
                ("mesh_fsdp", "the public tpu7x recipe's mesh"),
                ("mesh_context", "the public tpu7x recipe's mesh"),
                ("mesh_expert", "the public tpu7x recipe's mesh"),
                ("train_micro_batch_size", "the public tpu7x recipe's rows"),
            ),
            # Why, without the figures: those are of one slice and one engine version, and stay in
            # the fit report's tables (aot on tpu7x:4x4x8, full depth), which the reason cites.
            differs_from_trainer=(
                TrainerDifference(
                    path="optimizer.memory_host_offload",
                    key="optimizer_memory_host_offload",
                    value=True,
                    trainer_value=False,
                    engine=BUILT_IN,
                    why=(
                        "the trainer keeps its optimizer state in device memory; there, compiled"
                        " for tpu7x:4x4x8, the built-in engine's fwd_bwd at the measured run's MoE"
                        " settings fits with room only by aot's model that counts XLA's HBM"
                        " temporary block, which no chip has confirmed yet (by XLA's temp_size"
                        f" it did not fit; {_FIT_REPORT}, "
                        f'"{_OWN_KEYS_SECTION}" and "{_PEAK_MODEL_SECTION}"; `aot` on the'
                        " TRAINER_SLICE gives its own figures); optimizer_memory_host_offload=false"
                        " in ENGINE_FLAGS times the trainer's placement"
                    ),
                ),
            ),
        ),
        Preset(
            # Qwen3-30B-A3B's public shapes: 48 layers, 128 experts, top-8, no shared expert.
            name="qwen3-30b-a3b-cell",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=151_936,
                    d_model=2048,
                    num_layers=48,
                    num_heads=32,
                    num_kv_heads=4,
                    head_dim=128,
                    num_experts=128,
                    top_k=8,
                    expert_ffn_dim=768,
                ),
                mesh=MeshConfig(fsdp=8),
                micro_batch_rows=8,
                seq_len=8192,
            ),
            micro_steps=4,
            host_devices=0,
            purpose="a mid-size public MoE on 8 devices: for AOT, payloads and small slices",
            models=("qwen3-30b-a3b",),
        ),
    )
}

# The preset of a host with one TPU chip of each kind (the chip table's names): what `run` and
# `ab` time there when no preset is named (`default_preset`).
ONE_CHIP_PRESETS: Mapping[str, str] = {"v5e": "tpu-v5e-1", "v6e": "tpu-v6e-1"}

# The preset a command runs when nothing names one, on a host without a chip of ONE_CHIP_PRESETS.
HOST_DEFAULT = "cpu-tiny"


def one_chip_preset(tpu: LocalTpu | None) -> Preset | None:
    """The preset of `tpu` (the chips a process can open) where it is one chip of a kind with a
    one-chip preset; None for no chip, several, or a kind without one."""
    if tpu is not None and tpu.chips == 1 and tpu.kind in ONE_CHIP_PRESETS:
        return PRESETS[ONE_CHIP_PRESETS[tpu.kind]]
    return None


def default_preset(tpu: LocalTpu | None) -> tuple[Preset, str]:
    """The preset of a command on this host that names none, and why: with one TPU chip JAX may
    use (`local_chips.usable_tpu`) of a kind with a one-chip preset, that preset, so the main
    job times the chip; else HOST_DEFAULT, on the host's CPU."""
    chips_own = one_chip_preset(tpu)
    if tpu is not None and chips_own is not None:
        return chips_own, f"default: {tpu.describe()}"
    if tpu is not None:
        return PRESETS[HOST_DEFAULT], (
            f"default: {tpu.describe()}, and no preset for them: the host's CPU; give PRESET"
            " (--preset) and a mesh for the chips"
        )
    return PRESETS[HOST_DEFAULT], "default"


# The trainer flags that name the model, in the order they are trusted.
MODEL_FLAGS = ("model_name", "maxtext_model_name", "model_id")


def preset(name: str) -> Preset:
    """The preset called `name`; an unknown name raises ConfigError listing the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"PRESET={name!r} is unknown: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def _model_key(name: str) -> str:
    """`Qwen/Qwen3.5-397B-A17B` and `qwen3.5-397b-a17b` name the same model."""
    return name.strip().rpartition("/")[2].lower()


def preset_for_model(flags: Mapping[str, str]) -> tuple[Preset, str] | None:
    """The preset of the model the trainer's flags name, and the flag that named it.

    None when no model flag is given. A named model without a preset, or flags naming models of
    different presets, raise ConfigError naming PRESET, which chooses the preset instead.
    """
    named = [(flag, flags[flag]) for flag in MODEL_FLAGS if flags.get(flag)]
    if not named:
        return None
    by_model = {model: p for p in PRESETS.values() for model in p.models}
    found = {flag: by_model.get(_model_key(value)) for flag, value in named}
    unknown = [f"--{flag}={value}" for flag, value in named if found[flag] is None]
    if len(unknown) == len(named):
        known = ", ".join(f"{m} ({p.name})" for m, p in by_model.items())
        raise ConfigError(
            f"the trainer's {unknown[0]} is not a model the bench has a preset for (known: "
            f"{known}): set PRESET to the preset to time"
        )
    presets = {p.name for p in found.values() if p is not None}
    if len(presets) > 1:
        raise ConfigError(
            f"the trainer's model flags name different presets ({', '.join(sorted(presets))}): "
            "set PRESET to the preset to time"
        )
    flag, value = next((f, v) for f, v in named if found[f] is not None)
    return found[flag], f"--{flag}={value}"
