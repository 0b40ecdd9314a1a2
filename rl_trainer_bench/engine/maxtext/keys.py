"""The bench's engine config as MaxText keys: one translation table, then the trainer's keys.

MaxText builds its config from `base.yml`, then a model config (`configs/models/<model_name>.yml`),
then overrides given as `key=value` words, later words winning. The adapter starts from the MaxText
model of the bench model's family, so the decoder block, the layer pattern and the MoE recipe are
MaxText's own (`qwen3.5-397b-a17b`: `decoder_block: qwen3_5`, Gated DeltaNet layers, a gated
shared expert, partial rotary, gated full attention), and overrides only what this table
translates from the engine config: the shapes a small cell shrinks, the mesh, the batch, the
optimizer. The words are then, in order:

1. `model_name` and `override_model_config=true` (the model config's keys may be overridden);
2. the table's keys, and the keys derived from the model config for shrunk shapes;
3. the keys the bench holds (where MaxText writes, no profiler, no checkpoints) and the keys the
   host's platform needs (`platform_keys`: no TPU kernel off a TPU): the trainer's keys may not
   replace these, each one it sets is reported as held;
4. the trainer's own MaxText keys (`EngineConfig.trainer_maxtext_keys`), unchanged and last, as
   Tunix applies them: each one that replaces a value the table set is reported.

Every engine-config field has one fate here: translated (`TRANSLATIONS`), not taken by MaxText
(`NOT_TAKEN`, with the reason), or the adapter's own business (`ADAPTER_FIELDS`); a test holds
the three to cover the config exactly. Nothing here imports JAX or MaxText.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_trainer_bench.engine.config import DROPLESS, EngineConfig, leaf_fields

RUN_NAME = "rl_trainer_bench"
# MaxText replays routes (forced routing) only in these decoder blocks (maxtext 0.2.5,
# `check_forced_routing_support` in maxtext/configs/types.py).
FORCED_ROUTING_DECODERS = ("qwen3_5", "mixtral", "gemma4")


class NotTaken(ValueError):
    """A value of a translated field that MaxText cannot express; the message says why."""


@dataclasses.dataclass(frozen=True)
class MaxTextModel:
    """The MaxText model config the adapter starts from, and what it fixes about the decoder."""

    name: str  # configs/models/<name>.yml ("default": base.yml's llama2-style dense decoder)
    decoder_block: str
    gated_attention: bool  # full attention's output times sigmoid(x W_gate), built into the block


QWEN3_5 = MaxTextModel("qwen3.5-397b-a17b", "qwen3_5", gated_attention=True)
DENSE = MaxTextModel("default", "llama2", gated_attention=False)


def maxtext_model(config: EngineConfig) -> MaxTextModel:
    """The MaxText model of the bench model's family, or NotTaken naming what MaxText lacks.

    Gated DeltaNet layers or gated full attention: Qwen3.5 (`qwen3_5`, which replays routes). One
    expert: MaxText's dense default decoder. A routed MoE of full-attention layers only has no
    MaxText decoder here that replays routes and matches the bench's layer (Qwen3's `qwen3_moe`
    does not replay them), so it is refused rather than timed on a different model.
    """
    m = config.model
    if "linear_attention" in m.layer_types or m.attention_output_gate:
        return QWEN3_5
    if m.num_experts == 1:
        return DENSE
    raise NotTaken(
        "a routed MoE of plain full-attention layers has no MaxText 0.2.5 decoder that replays"
        f" routes (forced routing: {', '.join(FORCED_ROUTING_DECODERS)}): time a Qwen3.5-shaped"
        " preset (layer_types with linear_attention) or a dense one"
    )


def _layer_cycle(config: EngineConfig) -> int:
    """`inhomogeneous_layer_cycle_interval`: qwen3_5 makes layer i full attention iff
    (i + 1) % interval == 0, so the bench's pattern must be linear layers then one full one."""
    types = config.model.layer_types
    if types[-1] != "full_attention" or "full_attention" in types[:-1]:
        raise NotTaken(
            f"layer_types={types!r}: MaxText's qwen3_5 decoder repeats linear_attention layers"
            " then one full_attention layer; write the pattern that way"
        )
    return len(types)


def _shared_experts(config: EngineConfig) -> int:
    m = config.model
    if m.shared_expert_ffn_dim in (0, m.expert_ffn_dim):
        return int(m.shared_expert_ffn_dim > 0)
    raise NotTaken(
        f"shared_expert_ffn_dim={m.shared_expert_ffn_dim}: MaxText's shared expert is as wide as"
        f" a routed one (expert_ffn_dim={m.expert_ffn_dim})"
    )


def _gate(config: EngineConfig) -> None:
    """The output gate is part of MaxText's decoder block: no key, but it must agree."""
    if config.model.attention_output_gate != maxtext_model(config).gated_attention:
        raise NotTaken(
            f"attention_output_gate={config.model.attention_output_gate}: MaxText's"
            f" {maxtext_model(config).decoder_block} decoder has it"
            f" {'always' if maxtext_model(config).gated_attention else 'never'}"
        )


def _remat(config: EngineConfig) -> str:
    policy = config.model.remat_policy
    if policy == "none":
        raise NotTaken("remat_policy=none: MaxText 0.2.5 has no policy that keeps everything")
    return policy  # full and minimal are MaxText's names too


def _constant_schedule(config: EngineConfig) -> dict[str, Any]:
    """A constant rate: no warm-up and a cosine decay to the same rate (MaxText's schedule)."""
    if config.optimizer.schedule != "constant":
        raise NotTaken(
            "optimizer_schedule_type=warmup_cosine_decay_schedule: MaxText's cosine schedule is"
            " set by fractions of its step count, not by these steps"
        )
    return {"warmup_steps_fraction": 0.0, "learning_rate_final_fraction": 1.0}


@dataclasses.dataclass(frozen=True)
class Translation:
    """One engine-config field as MaxText keys: `to_keys(config)` -> {MaxText key: value}."""

    field: str  # dotted EngineConfig path
    to_keys: Callable[[EngineConfig], Mapping[str, Any]]


def _same(field: str, key: str) -> Translation:
    def to_keys(config: EngineConfig) -> dict[str, Any]:
        value: Any = config
        for part in field.split("."):
            value = getattr(value, part)
        return {key: value}

    return Translation(field, to_keys)


def _by(field: str, build: Callable[[EngineConfig], Mapping[str, Any]]) -> Translation:
    return Translation(field, build)


# MaxText's `flash` on a TPU is the same Pallas splash kernel
_ATTENTION = {
    "auto": "autoselected",
    "xla": "dot_product",
    "cudnn": "cudnn_flash_te",
    "splash": "flash",
}

TRANSLATIONS: tuple[Translation, ...] = (
    _same("model.vocab_size", "vocab_size"),
    _same("model.d_model", "base_emb_dim"),
    _same("model.num_layers", "base_num_decoder_layers"),
    _same("model.num_heads", "base_num_query_heads"),
    _same("model.num_kv_heads", "base_num_kv_heads"),
    _same("model.head_dim", "head_dim"),
    _same("model.num_experts", "num_experts"),
    _same("model.top_k", "num_experts_per_tok"),
    # MaxText requires base_mlp_dim == base_moe_mlp_dim for a model whose every layer is MoE.
    _by("model.expert_ffn_dim", lambda c: dict.fromkeys(("base_mlp_dim", "base_moe_mlp_dim"), c.model.expert_ffn_dim)),
    _by("model.shared_expert_ffn_dim", lambda c: {"shared_experts": _shared_experts(c)}),
    _by("model.rope_theta", lambda c: {"rope_max_timescale": int(c.model.rope_theta)}),
    _same("model.rms_norm_eps", "normalization_layer_epsilon"),
    _same("model.dtype", "dtype"),
    _same("model.scan_layers", "scan_layers"),
    _by("model.remat_policy", lambda c: {"remat_policy": _remat(c)}),
    _by("model.attention", lambda c: {"attention": _ATTENTION[c.model.attention]}),
    _by("model.attention_output_gate", lambda c: _gate(c) or {}),
    _by("model.layer_types", lambda c: {"inhomogeneous_layer_cycle_interval": _layer_cycle(c)} if maxtext_model(c) is QWEN3_5 else {}),
    _same("model.linear_num_key_heads", "gdn_num_key_heads"),
    _same("model.linear_num_value_heads", "gdn_num_value_heads"),
    _same("model.linear_key_head_dim", "gdn_key_head_dim"),
    _same("model.linear_value_head_dim", "gdn_value_head_dim"),
    _same("model.linear_conv_kernel_dim", "gdn_conv_kernel_dim"),
    _same("model.linear_chunk_size", "gdn_chunk_size"),
    _same("mesh.fsdp", "ici_fsdp_parallelism"),
    _same("mesh.context", "ici_context_parallelism"),
    _same("mesh.expert", "ici_expert_parallelism"),
    _same("moe.ragged_buffer_factor", "ragged_buffer_factor"),
    _same("moe.token_chunks", "num_moe_token_chunks"),
    _same("optimizer.learning_rate", "learning_rate"),
    _by("optimizer.schedule", _constant_schedule),
    _same("optimizer.b1", "adam_b1"),
    _same("optimizer.b2", "adam_b2"),
    _same("optimizer.eps", "adam_eps"),
    _same("optimizer.mu_dtype", "mu_dtype"),
    _same("optimizer.weight_decay", "adam_weight_decay"),
    _same("optimizer.max_grad_norm", "gradient_clipping_threshold"),
    _same("optimizer.memory_host_offload", "optimizer_memory_host_offload"),
    # MaxText's global batch is per_device_batch_size x devices; it splits rows over its batch
    # axes (fsdp x expert) and the sequence over context, as the built-in engine does.
    _by("micro_batch_rows", lambda c: {"per_device_batch_size": c.micro_batch_rows / c.mesh.size}),
    _same("seq_len", "max_target_length"),
    _same("matmul_precision", "matmul_precision"),
    _same("seed", "init_weights_seed"),
)  # fmt: skip

_OWN_GATED_DELTANET = (
    "MaxText runs its own Gated DeltaNet (its use_gdn_kernel key picks the kernel)"
)
_GRPO = "MaxText's router-replay loss is token cross-entropy, not the GRPO surrogate"
_SCHEDULE = "MaxText's schedule is set by learning_rate and fractions of its step count"
NOT_TAKEN: Mapping[str, str] = {
    "model.attention_chunk_size": "MaxText's dot-product attention does not chunk queries",
    "model.linear_chunk_inverse": _OWN_GATED_DELTANET,
    "model.linear_chunk_kernel": _OWN_GATED_DELTANET,
    "model.linear_chunk_kernel_heads": _OWN_GATED_DELTANET,
    "model.keep_delta_rule_outputs": _OWN_GATED_DELTANET,
    "model.linear_conv_kernel": _OWN_GATED_DELTANET,
    "loss.epsilon": _GRPO,
    "loss.epsilon_high": _GRPO,
    "loss.beta": _GRPO,
    "loss.compute_logps_chunk_size": _GRPO + "; its logits are tiled by num_vocab_tiling",
    "loss.logits_dtype": _GRPO,
    "loss.logps_gradient": _GRPO,
    "moe.retry_when_tokens_dropped": (
        "MaxText 0.2.5's training engine never re-runs a micro-batch; moe_dropless_fallback"
        " (a trainer key) replays a step only in its pre-training loop, or a layer in place"
    ),
    "moe.expert_compute": "MaxText picks its own expert kernels (sparse_matmul, megablox)",
    "moe.dropless_compute": "MaxText picks its own expert kernels (sparse_matmul, megablox)",
    "moe.pair_ranking": "MaxText sorts its routed pairs itself",
    "moe.prefuse_moe_weights": (
        "MaxText gets it as the trainer's own key (--prefuse_moe_weights), as Tunix passes it;"
        " unset there, MaxText runs its own default"
    ),
    "moe.keep_moe_gate_up": (
        "MaxText keeps or recomputes its MoE layer's activations by its own remat policy"
        " (remat_policy, and the per-tensor names of remat_policy=custom)"
    ),
    "optimizer.init_value": _SCHEDULE,
    "optimizer.peak_value": _SCHEDULE,
    "optimizer.end_value": _SCHEDULE,
    "optimizer.warmup_steps": _SCHEDULE,
    "optimizer.decay_steps": _SCHEDULE,
    "extra_device_work": "the built-in engine's own matmuls, refused with another engine",
    "extra_host_bytes": "the built-in engine's own filler bytes, refused with another engine",
}
# Training policy, not the model: where the trainer's command sets none of these, its MaxText runs
# its own default (whatever the image's release has), so the adapter passes no key for them and a
# preset's value (the 397B cell's mu_dtype=bfloat16, its MoE buffers) never changes the trainer's
# program. The model's shapes, mesh and batch stay the preset's: they are the cell being timed.
DEFAULTED_IN_MAXTEXT = (
    "optimizer.b1",
    "optimizer.b2",
    "optimizer.eps",
    "optimizer.mu_dtype",
    "optimizer.weight_decay",
    "optimizer.max_grad_norm",
    "optimizer.memory_host_offload",
    "moe.ragged_buffer_factor",
    "moe.token_chunks",
    "model.remat_policy",
    "model.scan_layers",
    "matmul_precision",
)
# Fields the adapter acts on itself rather than through a MaxText key.
ADAPTER_FIELDS: Mapping[str, str] = {
    "moe.router_replay": "routes reach MaxText as forced_routed_experts",
    "trainer_maxtext_keys": "passed to MaxText unchanged, last",
    "output_dir": "MaxText's base_output_directory, held",
    "dump_buffer_assignment": "unused: the adapter reports no program_memory",
    "maxtext_driver": "chooses what drives MaxText's engine (engine/maxtext/tunix_grpo.py)",
    "maxtext_defaults": "the fields left to MaxText's own defaults (DEFAULTED_IN_MAXTEXT)",
}

# Keys the bench holds whatever the trainer sets: where MaxText writes, what it loads and traces.
# The trainer's value of one of these would write into its bucket, load its checkpoint or open a
# second profiler inside the bench's timed steps.
HELD_KEYS = (
    "run_name",
    "base_output_directory",
    "enable_checkpointing",
    "load_parameters_path",
    "load_full_state_path",
    "profiler",
    "profiler_steps",
    "jax_cache_dir",
    "skip_jax_distributed_system",
)


def platform_keys(config: EngineConfig, platform: str) -> dict[str, Any]:
    """MaxText keys a `platform` host needs beyond the table's (the adapter says them in `info()`).

    They are held over the trainer's keys on that host (`maxtext_args`): a TPU kernel the trainer
    asks for cannot run natively anywhere else, and the bench must time a program that can.

    - Grouped matmul: MaxText runs its megablox Pallas kernel natively only when the mesh's devices
      are TPUs and *interprets* it everywhere else (maxtext 0.2.5, `megablox_interpret` in
      `layers/moe.py`); tokamax's kernels are TPU-only. Interpreted, a grid step is a conditional
      with copies of every block: ~98% of MaxText's step on the one-device MoE cell
      (benchmarks/reports/maxtext-engine_cpu_2026-12-03.md). Off a TPU, tokamax is off, and with one
      expert shard megablox too: MaxText's sparse path then takes `jax.lax.ragged_dot`, XLA's own
      grouped matmul, the same per-expert products. With expert shards it cannot: that path takes no
      group offset (a shard's experts are a slice of the groups), so megablox stays, interpreted.
    - Expert exchange: XLA:CPU has no `ragged-all-to-all`, which MaxText's expert-parallel MoE
      sends tokens with (compiling it fails: "HLO opcode `ragged-all-to-all` is not supported by
      XLA:CPU"); its ring of experts (`use_ring_of_experts`) moves them by all-gather and
      reduce-scatter, which the CPU runs. A ring takes a finite ragged buffer only with its Pallas
      ragged sort, which does not run there, so on the CPU the buffer is MaxText's dropless one.

    A TPU gets nothing: the trainer's keys run as written.
    """
    if platform == "tpu":
        return {}
    keys: dict[str, Any] = {}
    if config.model.num_experts > 1:
        keys["use_tokamax_gmm"] = False
        if config.mesh.expert == 1:
            keys["megablox"] = False
    if platform == "cpu" and config.mesh.expert > 1:
        keys.update(  # as MaxText spells them
            use_ring_of_experts=True, use_ragged_sort=False, ragged_buffer_factor=float(DROPLESS)
        )
    return keys


def held_keys(output_dir: str) -> dict[str, Any]:
    """The bench's values of HELD_KEYS.

    No MaxText profiler (PROFILE_STEPS traces through the bench's own window, which sees
    MaxText's programs too), no checkpoints, no persistent compilation cache (compile seconds
    would become cache reads and a program loaded in a scored step would slip past the
    recompile check), and every file MaxText writes under `output_dir`. The bench's runtime
    starts JAX's distributed system itself.
    """
    return {
        "run_name": RUN_NAME,
        "base_output_directory": output_dir,
        "enable_checkpointing": False,
        "load_parameters_path": "",
        "load_full_state_path": "",
        "profiler": "",
        "profiler_steps": 0,
        "jax_cache_dir": "",
        "skip_jax_distributed_system": True,
    }


def translated_keys(config: EngineConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The table's MaxText keys for `config`, and {field: why} for each value MaxText cannot take;
    the fields in `config.maxtext_defaults` give no key (MaxText's own default applies)."""
    keys: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for row in TRANSLATIONS:
        if row.field in config.maxtext_defaults:
            continue
        try:
            keys.update(row.to_keys(config))
        except NotTaken as why:
            refused[row.field] = str(why)
    return keys, refused


def replaced_by_trainer(config: EngineConfig, field: str) -> list[str]:
    """`key=value` of each trainer MaxText key that replaces what the table makes of `field` (the
    trainer's keys come last, so MaxText runs the trainer's value, as `maxtext_args` reports)."""
    trainer = dict(config.trainer_maxtext_keys)  # a key set twice: the later wins
    replaced = []
    for row in TRANSLATIONS:
        if row.field != field or field in config.maxtext_defaults:
            continue
        try:
            keys = row.to_keys(config)
        except NotTaken:
            continue
        replaced += [
            f"{key}={trainer[key]}"
            for key, value in keys.items()
            if key in trainer and word(key, value) != f"{key}={trainer[key]}"
        ]
    return replaced


def derived_keys(config: EngineConfig, model_config: Mapping[str, Any]) -> dict[str, Any]:
    """Keys that follow from the model config once the table has shrunk its shapes.

    - `mrope_section` (Qwen3.5's multimodal rotary): it must split exactly the rotated half of a
      head, head_dim x partial_rotary_factor / 2 frequencies; a smaller head_dim gets the model
      config's split scaled to it (largest remainders keep the total).
    - `context_parallel_load_balance=false` with Gated DeltaNet layers on a context axis:
      their recurrence needs shards in sequence order, as the built-in engine lays them out.
    - `weight_dtype=float32`: the bench keeps parameters in float32.
    - `enable_dropout=false`, `skip_step_on_spikes=false`: the bench's model has no dropout and
      every step updates (base.yml turns both the other way for pre-training).
    """
    keys: dict[str, Any] = {
        "weight_dtype": "float32",
        "enable_dropout": False,
        "skip_step_on_spikes": False,
    }
    section = model_config.get("mrope_section")
    if model_config.get("use_mrope") and section:
        rotary = config.model.head_dim * float(model_config.get("partial_rotary_factor", 1.0))
        keys["mrope_section"] = scaled_split(list(section), int(rotary) // 2)
    if config.mesh.context > 1 and "linear_attention" in config.model.layer_types:
        keys["context_parallel_load_balance"] = False
    return keys


def known_keys(config: EngineConfig) -> frozenset[str]:
    """Every MaxText key this module's tables name for `config`: the ones the adapter writes
    (the table's, the derived, the held and any host's platform keys). A key outside them may
    still be MaxText's; only the MaxText that runs can say (the A/B's summary says which)."""
    translated, _ = translated_keys(config)
    return frozenset(
        {
            "model_name",
            "override_model_config",
            *translated,
            *derived_keys(config, {}),
            *HELD_KEYS,
            *platform_keys(config, "cpu"),
        }
    )


def scaled_split(parts: Sequence[int], total: int) -> list[int]:
    """`parts` scaled to sum to `total`, by largest remainder (ties to the earlier part)."""
    whole = sum(parts)
    exact = [p * total / whole for p in parts]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: (out[i] - exact[i], i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def not_taken(config: EngineConfig) -> dict[str, str]:
    """{field: why} for every engine-config field MaxText does not take with this config."""
    _, refused = translated_keys(config)
    return {**NOT_TAKEN, **refused}


def covered_fields() -> set[str]:
    """Every field the table, NOT_TAKEN and ADAPTER_FIELDS give a fate (a test compares with the config)."""
    return {row.field for row in TRANSLATIONS} | set(NOT_TAKEN) | set(ADAPTER_FIELDS)


def config_fields() -> set[str]:
    return {path for path, _, _ in leaf_fields()}


def word(key: str, value: Any) -> str:
    """One `key=value` override as MaxText's command line reads it (OmegaConf's CLI grammar)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value == "":
        text = "''"  # a bare `key=` reads as null, which MaxText refuses for a text key
    elif isinstance(value, (list, tuple)):
        text = "[" + ",".join(str(v) for v in value) + "]"
    else:
        text = str(value)
    return f"{key}={text}"


@dataclasses.dataclass(frozen=True)
class MaxTextArgs:
    """The words MaxText's config is built from, and what the bench says about them."""

    model: MaxTextModel
    words: tuple[str, ...]  # key=value, in the order MaxText applies them
    replaced: tuple[
        str, ...
    ]  # trainer keys that replaced a value the table set: key=bench->trainer
    held: tuple[str, ...]  # trainer keys the bench did not pass: key=value
    trainer_words: tuple[str, ...] = ()  # the trainer's keys passed, the last of `words`


def maxtext_args(
    config: EngineConfig,
    model_config: Mapping[str, Any],
    output_dir: str,
    platform_keys: Mapping[str, Any] = (),
) -> MaxTextArgs:
    """The whole override list for `config` (module docstring: the order and why).

    `platform_keys` are keys the host needs (`platform_keys`), held with the bench's own.
    NotTaken when the model family or the layer pattern has no MaxText equivalent.
    """
    model = maxtext_model(config)
    translated, refused = translated_keys(config)
    if "model.layer_types" in refused:
        raise NotTaken(refused["model.layer_types"])
    ours = {
        "model_name": model.name,
        "override_model_config": True,
        **translated,
        **derived_keys(config, model_config),
    }
    held = {**held_keys(output_dir), **dict(platform_keys)}
    replaced, kept = [], []
    trainer_words = []
    for key, text in config.trainer_maxtext_keys:
        if key in held:
            kept.append(f"{key}={text}")
            continue
        if key in ours and word(key, ours[key]) != f"{key}={text}":
            replaced.append(f"{key}={word(key, ours[key]).partition('=')[2]}->{text}")
        trainer_words.append(f"{key}={text}")
    words = [word(k, v) for k, v in ours.items()] + [word(k, v) for k, v in held.items()]
    return MaxTextArgs(
        model, (*words, *trainer_words), tuple(replaced), tuple(kept), tuple(trainer_words)
    )
