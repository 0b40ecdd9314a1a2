"""A stand-in for maxtext 0.2.5's training engine, so CI tests the MaxText adapter without MaxText.

It keeps the public surface the adapter relies on, with maxtext 0.2.5's signatures and
behaviour: `MaxTextTrainingEngine(training_config, mesh=None, wrap_with_tunix_adapter=False,
tokenizer_pad_id=None)` whose `compile` returns None and installs compiled `fwd_bwd`,
`fwd_bwd_accum`, `update` (and an eval program), whose `fwd_bwd` maps a payload through the
input hook (rebuilding a dataclass payload with empty metadata first), accumulates unreduced
gradients and records the loss as a `WeightedMetric`, whose `update` divides by the summed
denominators, records `learning_rate` and `gradient_norm` and returns the new step, whose
`get_metrics` returns the newest on-device `MetricsBuffer` (id -1 when empty); Tunix's
`RLTrainerPayload` fields; the router-replay input mapping (whole row = prompt then completion,
targets rolled left, the token mask shifted left and cut at segment ends) and a router-replay
loss returning `(loss, aux)` with `xent_sum`, `total_weights` and `has_moe_overflow`, each aux
entry recorded per micro-batch when the loss was set `with_loss_fn(fn, has_aux=True)`.

It checks what maxtext 0.2.5 checks where the adapter's keys could go wrong: its config is built
from `key=value` words over base.yml defaults and a model config (`qwen3.5-397b-a17b`, decoder
`qwen3_5`; a clash needs `override_model_config=true`; an unknown key fails); forced routes are
refused unless the decoder is qwen3_5, mixtral or gemma4; Gated DeltaNet on a context axis needs
`context_parallel_load_balance=false`; Qwen3.5's mrope split must cover the rotated half-head;
the mesh is ici fsdp x context x expert, rows shard over fsdp x expert and the sequence over
context, a dimension an axis does not divide is replicated; with no `base_output_directory`
files go to `./maxtext_output`, TensorBoard events are written at construction, and a real
jax.profiler trace runs over micro steps [1, 6) unless `profiler_steps=0` (as base.yml's
defaults do whatever `profiler` says).

The model is tiny but real (an embedding, one MoE or dense block per layer with forced routes,
an output head), so gradients, shardings and digests are real arrays.

Like maxtext 0.2.5, the engine splits a dict of loss inputs into traced arrays and closed-over
constants, hands the loss a model (here `StandInModel`, with maxtext 0.2.5's Transformer surface:
its call, `decoder` returning hidden states beside the logits, `token_embedder`,
`logits_from_hidden_states_for_vocab_tiling`; in `StandInTunixAdapter` when
`wrap_with_tunix_adapter` wrapped it, whose weights and moments then sit under its one part,
`base`, as NNX keeps a wrapped module's state; `NativeHeadModel` for a MaxText whose call takes
`skip_lm_head`) and takes a Tunix `LossOutput` as a loss's return. Tunix's side, as far as the adapter
drives it: `TrainerWorker` delegating to its trainer (`get_metrics()` without `clear_cache`), the
packed `TrainExample` (`num_segments` static), `GRPOConfig`, and a GRPO loss with Tunix's
token-aligned log-probs, its chunked log-prob pass (`skip_lm_head`, then `compute_final_logits`
on chunks under remat) and token-mean denominator (`STAND_IN_TUNIX_API`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_trainer_bench.engine.maxtext import aot as maxtext_aot
from rl_trainer_bench.engine.maxtext.adapter import MaxTextApi, MaxTextEngine
from rl_trainer_bench.engine.maxtext.tunix_grpo import ReplayingCall, TunixApi

KERNEL_NAMES = ("fwd_bwd", "fwd_bwd_accum", "update")
EMPTY_METRICS_BUFFER_ID = -1

# MaxText keys the stand-in accepts, with maxtext 0.2.5's base.yml defaults where they matter
# (no base_output_directory: MaxText then writes into ./maxtext_output of the caller's folder;
# profiler_steps 5 from step 1, a window MaxText opens whatever `profiler` says).
_DEFAULT_KEYS: dict[str, Any] = {
    "run_name": "",
    "model_name": "default",
    "override_model_config": False,
    "decoder_block": "llama2",
    "vocab_size": 32_000,
    "base_emb_dim": 2048,
    "base_num_decoder_layers": 16,
    "base_num_query_heads": 16,
    "base_num_kv_heads": 16,
    "head_dim": 128,
    "base_mlp_dim": 7168,
    "base_moe_mlp_dim": -1,
    "rope_max_timescale": 10_000,
    "normalization_layer_epsilon": 1e-5,
    "dtype": "bfloat16",
    "weight_dtype": "float32",
    "remat_policy": "full",
    "scan_layers": True,
    "attention": "autoselected",
    "matmul_precision": "default",
    "max_target_length": 2048,
    "per_device_batch_size": 12.0,
    "ici_fsdp_parallelism": -1,
    "ici_context_parallelism": 1,
    "ici_expert_parallelism": 1,
    "context_parallel_load_balance": True,
    "learning_rate": 3e-5,
    "warmup_steps_fraction": 0.1,
    "learning_rate_final_fraction": 0.1,
    "adam_b1": 0.9,
    "adam_b2": 0.95,
    "adam_eps": 1e-8,
    "adam_weight_decay": 0.1,
    "mu_dtype": "",
    "gradient_clipping_threshold": 1.0,
    "optimizer_memory_host_offload": False,
    "init_weights_seed": 0,
    "enable_dropout": True,
    "enable_checkpointing": True,
    "load_parameters_path": "",
    "load_full_state_path": "",
    "skip_step_on_spikes": False,
    "skip_jax_distributed_system": False,
    "jax_cache_dir": "~/jax_cache",
    "base_output_directory": "",
    "enable_tensorboard": True,
    "compile_xla_flags": "",
    "internal_compile": False,
    "internal_compile_num_devices": -1,
    "profiler": "",
    "profiler_steps": 5,
    "skip_first_n_steps_for_profiler": 1,
    "num_experts": 1,
    "num_experts_per_tok": 1,
    "shared_experts": 0,
    "ragged_buffer_factor": -1.0,
    "moe_dropless_fallback": None,
    "use_ring_of_experts": False,
    "megablox": True,
    "sparse_matmul": True,
    "use_tokamax_gmm": False,
    "use_ragged_sort": False,
    "num_moe_token_chunks": 1,
    "inhomogeneous_layer_cycle_interval": 1,
    "gdn_num_key_heads": 16,
    "gdn_num_value_heads": 32,
    "gdn_key_head_dim": 128,
    "gdn_value_head_dim": 128,
    "gdn_conv_kernel_dim": 4,
    "gdn_chunk_size": 64,
    "partial_rotary_factor": 1.0,
    "use_mrope": False,
    "mrope_section": [24, 20, 20],
    "mtp_num_layers": 0,
    "use_multimodal": False,
}
# The shipped model configs the stand-in knows, with the keys maxtext 0.2.5's files set.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3.5-397b-a17b": {
        "decoder_block": "qwen3_5",
        "base_emb_dim": 4096,
        "base_num_decoder_layers": 60,
        "base_num_query_heads": 32,
        "base_num_kv_heads": 2,
        "head_dim": 256,
        "vocab_size": 248_320,
        "normalization_layer_epsilon": 1e-6,
        "base_mlp_dim": 1024,
        "base_moe_mlp_dim": 1024,
        "num_experts": 512,
        "shared_experts": 1,
        "num_experts_per_tok": 10,
        "inhomogeneous_layer_cycle_interval": 4,
        "gdn_conv_kernel_dim": 4,
        "gdn_key_head_dim": 128,
        "gdn_value_head_dim": 128,
        "gdn_num_key_heads": 16,
        "gdn_num_value_heads": 64,
        "gdn_chunk_size": 64,
        "rope_max_timescale": 10_000_000,
        "partial_rotary_factor": 0.25,
        "enable_dropout": False,
        "use_mrope": True,
        "mrope_section": [11, 11, 10],
    },
}
FORCED_ROUTING_DECODERS = ("qwen3_5", "mixtral", "gemma4")


class HyperParameters:
    """pyconfig.HyperParameters: keys read as attributes."""

    def __init__(self, keys: dict[str, Any]):
        self.__dict__.update(keys)


def _parse(text: str) -> Any:
    """One override's value as OmegaConf's command-line grammar reads it."""
    lowered = text.strip().lower()
    if lowered in ("", "null"):
        return None
    if text in ("''", '""'):
        return ""
    if lowered in ("true", "false"):
        return lowered == "true"
    if text.startswith("[") and text.endswith("]"):
        return [_parse(part) for part in text[1:-1].split(",") if part.strip()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def initialize(argv: list[str]) -> HyperParameters:
    """pyconfig's config from `["", "key=value", ...]`: base keys, the model config, then the
    overrides (later words win), checked as MaxText checks them."""
    overrides: dict[str, Any] = {}
    for word in argv[1:]:
        key, equals, text = word.partition("=")
        if not equals:
            raise ValueError(f"not a key=value override: {word!r}")
        overrides[key] = _parse(text)
    unknown = sorted(set(overrides) - set(_DEFAULT_KEYS))
    if unknown:
        raise ValueError(f"unknown MaxText config keys: {unknown}")
    nulls = sorted(
        k for k, v in overrides.items() if v is None and isinstance(_DEFAULT_KEYS[k], str)
    )
    if nulls:
        raise ValueError(f"{nulls}: Input should be a valid string")
    model = MODEL_CONFIGS.get(overrides.get("model_name", "default"), {})
    clash = sorted(k for k in model if k in overrides and model[k] != overrides[k])
    if clash and not overrides.get("override_model_config"):
        raise ValueError(f"keys {clash} are overridden by both model config and overrides")
    keys = {**_DEFAULT_KEYS, **model, **overrides}
    if not keys["base_output_directory"]:
        keys["base_output_directory"] = os.path.abspath("maxtext_output")
    keys["tensorboard_dir"] = os.path.join(
        keys["base_output_directory"], keys["run_name"], "tensorboard"
    )
    _validate(keys)
    return HyperParameters(keys)


def _validate(keys: dict[str, Any]) -> None:
    """The checks of maxtext 0.2.5's config the adapter's keys can trip."""
    gdn = keys["decoder_block"] == "qwen3_5"
    if gdn and keys["ici_context_parallelism"] > 1 and keys["context_parallel_load_balance"]:
        raise ValueError(
            "GatedDeltaNet context parallelism requires context_parallel_load_balance=False"
        )
    if (
        keys["ragged_buffer_factor"] > 0
        and keys["use_ring_of_experts"]
        and not keys["use_ragged_sort"]
    ):
        raise ValueError("Ragged buffer factor with ring of experts needs use_ragged_sort=True")
    if keys["num_moe_token_chunks"] > 1 and not keys["use_ring_of_experts"]:
        raise ValueError("num_moe_token_chunks > 1 requires use_ring_of_experts=True.")
    if keys["use_mrope"]:
        rotary = int(keys["head_dim"] * keys["partial_rotary_factor"])
        if sum(keys["mrope_section"]) != rotary // 2:
            raise ValueError(
                f"mrope_section must describe rotary_dim / 2 frequencies; got"
                f" {keys['mrope_section']} for rotary_dim={rotary}"
            )


@dataclasses.dataclass(frozen=True)
class WeightedMetric:
    unreduced_sum: jax.Array
    denominator: jax.Array
    eps: float | None = None
    min_denom: float | None = None

    def compute(self) -> jax.Array:
        denom = self.denominator
        return jnp.where(denom == 0, 0.0, self.unreduced_sum / jnp.where(denom == 0, 1.0, denom))


jax.tree_util.register_dataclass(
    WeightedMetric, data_fields=["unreduced_sum", "denominator"], meta_fields=["eps", "min_denom"]
)


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """Tunix's `sft.utils.LossOutput` (MaxText's engine takes it as a loss's return)."""

    primary_loss: WeightedMetric
    aux_metrics: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class StandInDecoder:
    """MaxText's NNXDecoder surface: its call returns (logits, hidden states, kv caches); its
    `apply_output_head` projects hidden states to logits."""

    params: dict[str, jax.Array]
    config: Any

    def __call__(
        self,
        shared_embedding,
        decoder_input_tokens,
        decoder_positions,
        decoder_segment_ids=None,
        deterministic=False,
        model_mode="train",
        forced_routed_experts=None,
    ):
        hidden = _hidden(
            self.params,
            self.config,
            decoder_input_tokens,
            decoder_segment_ids,
            forced_routed_experts,
        )
        logits = self.apply_output_head(shared_embedding, hidden, deterministic, model_mode)
        return logits, hidden, None

    def apply_output_head(self, shared_embedding, y, deterministic, model_mode):
        del shared_embedding, deterministic, model_mode  # the stand-in's head is untied
        return y @ self.params["head"]


@dataclasses.dataclass(frozen=True)
class StandInModel:
    """What the engine hands a loss: maxtext 0.2.5's Transformer surface over the tiny model's
    weights (its call, `decoder`, `token_embedder`, `logits_from_hidden_states_for_vocab_tiling`)."""

    params: dict[str, jax.Array]
    config: Any

    @property
    def decoder(self) -> StandInDecoder:
        return StandInDecoder(self.params, self.config)

    @property
    def token_embedder(self) -> jax.Array:
        return self.params["embed"]

    def logits_from_hidden_states_for_vocab_tiling(self, hidden_states, deterministic, model_mode):
        return self.decoder.apply_output_head(
            self.token_embedder, hidden_states, deterministic, model_mode
        )

    def __call__(
        self,
        decoder_input_tokens,
        decoder_positions,
        decoder_segment_ids=None,
        forced_routed_experts=None,
    ):
        return self.decoder(
            self.token_embedder,
            decoder_input_tokens,
            decoder_positions,
            decoder_segment_ids,
            forced_routed_experts=forced_routed_experts,
        )[0]


@dataclasses.dataclass(frozen=True)
class StandInTunixAdapter:
    """maxtext 0.2.5's TunixMaxTextAdapter over the model (`wrap_with_tunix_adapter`)."""

    base: StandInModel

    @property
    def params(self) -> dict[str, jax.Array]:
        return self.base.params

    def __call__(
        self,
        input_tokens,
        positions,
        cache,
        attention_mask,
        decoder_segment_ids=None,
        output_hidden_states=False,
        forced_routed_experts=None,
        segment_ids=None,
    ):
        del cache, attention_mask, output_hidden_states
        segments = decoder_segment_ids if segment_ids is None else segment_ids
        logits = self.base(
            decoder_input_tokens=input_tokens,
            decoder_positions=positions,
            decoder_segment_ids=segments,
            forced_routed_experts=forced_routed_experts,
        )
        return logits, None


@dataclasses.dataclass(frozen=True)
class NativeHeadModel(StandInModel):
    """A Transformer whose own call takes `skip_lm_head` and which has `compute_final_logits`
    (a MaxText that added them)."""

    def __call__(
        self,
        decoder_input_tokens,
        decoder_positions,
        decoder_segment_ids=None,
        forced_routed_experts=None,
        skip_lm_head=False,
    ):
        logits, hidden, _ = self.decoder(
            self.token_embedder,
            decoder_input_tokens,
            decoder_positions,
            decoder_segment_ids,
            forced_routed_experts=forced_routed_experts,
        )
        return hidden if skip_lm_head else logits

    def compute_final_logits(self, hidden):
        return self.logits_from_hidden_states_for_vocab_tiling(hidden, False, "train")


@dataclasses.dataclass
class MetricsBuffer:
    id: Any
    weighted_metrics: dict[str, WeightedMetric] = dataclasses.field(default_factory=dict)
    scalar_metrics: dict[str, jax.Array] = dataclasses.field(default_factory=dict)
    aggregation_fns: dict[str, Callable[[jax.Array], Any]] = dataclasses.field(default_factory=dict)
    mode: str = "train"


@dataclasses.dataclass(kw_only=True)
class TrainerPayload:
    token_ids: Any
    token_mask: Any
    segment_ids: Any = None
    segment_positions: Any = None


@dataclasses.dataclass(kw_only=True)
class RLTrainerPayload(TrainerPayload):
    advantages: Any
    loss_mask: Any
    action_mask: Any = None
    prompt_ids: Any = None
    prompt_mask: Any = None
    completion_ids: Any = None
    completion_mask: Any = None
    ref_per_token_logps: Any = None
    old_per_token_logps: Any = None
    sampler_is_weights: Any = None
    returns: Any = None
    old_values: Any = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def router_replay_gen_model_input_fn(payload: RLTrainerPayload) -> dict[str, Any]:
    """The whole row (prompt then completion) as the router-replay loss's keyword arguments."""
    parts = [jnp.asarray(payload.prompt_ids), jnp.asarray(payload.completion_ids)]
    masks = [
        jnp.ones_like(part) if mask is None else jnp.asarray(mask).astype(jnp.int32)
        for part, mask in zip(parts, (payload.prompt_mask, payload.completion_mask), strict=True)
    ]
    ids, mask = jnp.concatenate(parts, axis=-1), jnp.concatenate(masks, axis=-1)
    segments = mask if payload.segment_ids is None else jnp.asarray(payload.segment_ids)
    if payload.segment_positions is None:
        raise NotImplementedError("the stand-in takes packed payloads with segment_positions")
    weights = jnp.roll(mask, -1, axis=-1).at[:, -1].set(0)
    same = (segments[:, :-1] == segments[:, 1:]).astype(weights.dtype)
    weights = weights.at[:, :-1].multiply(same)
    kwargs = {
        "inputs": ids,
        "inputs_position": jnp.asarray(payload.segment_positions).astype(jnp.int32),
        "inputs_segmentation": segments,
        "targets": jnp.roll(ids, -1, axis=-1),
        "targets_segmentation": weights,
    }
    routed = getattr(payload, "routed_experts", None)
    if routed is not None:
        kwargs["forced_routed_experts"] = jnp.asarray(routed)
    return kwargs


def _forward(params, config, inputs, inputs_segmentation, forced_routed_experts):
    hidden = _hidden(params, config, inputs, inputs_segmentation, forced_routed_experts)
    return hidden @ params["head"]


def _hidden(params, config, inputs, inputs_segmentation, forced_routed_experts):
    if forced_routed_experts is not None and config.decoder_block not in FORCED_ROUTING_DECODERS:
        raise NotImplementedError(
            "Forced routing (router replay) is only supported for decoder_block in"
            f" {FORCED_ROUTING_DECODERS}; got decoder_block={config.decoder_block!r}."
        )
    hidden = params["embed"][inputs] * (inputs_segmentation != 0)[..., None]
    for layer in range(config.base_num_decoder_layers):
        if config.num_experts > 1:
            if forced_routed_experts is None:
                gate = hidden @ params["gate"][layer]
                _, routes = jax.lax.top_k(gate, config.num_experts_per_tok)
            else:
                routes = forced_routed_experts[:, :, layer, :].astype(jnp.int32)
            chosen = jax.nn.one_hot(routes, config.num_experts).sum(-2)  # -1 rows are all zero
            update = jnp.einsum("bte,btd,edf->btf", chosen, hidden, params["experts"][layer])
        else:
            update = hidden @ params["mlp"][layer]
        hidden = hidden + jnp.tanh(update)
    return hidden


def make_router_replay_loss_fn(config: HyperParameters, dropout_rng: jax.Array | None = None):
    if config.enable_dropout and dropout_rng is None:
        raise ValueError("make_router_replay_loss_fn requires a dropout_rng with dropout on")

    def router_replay_loss_fn(
        model,
        inputs,
        inputs_position,
        inputs_segmentation,
        targets,
        targets_segmentation,
        forced_routed_experts=None,
    ):
        del inputs_position  # the stand-in's model has no positional encoding
        logits = _forward(model.params, config, inputs, inputs_segmentation, forced_routed_experts)
        xent = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
            logits, targets[..., None], -1
        ).squeeze(-1)
        weights = targets_segmentation != 0
        xent_sum = jnp.sum(xent * weights)
        total_weights = jnp.sum(weights)
        return xent_sum / (total_weights + 1e-8), {
            "xent_sum": xent_sum,
            "total_weights": total_weights,
            "has_moe_overflow": _has_overflow(config, forced_routed_experts),
        }

    return router_replay_loss_fn


def _has_overflow(config: HyperParameters, routes: jax.Array | None) -> jax.Array:
    """MaxText's step-fallback flag: some layer's expert shard got more routed pairs than its
    ragged buffer (balanced share x ragged_buffer_factor) holds; a constant false otherwise."""
    if config.moe_dropless_fallback != "step" or routes is None:
        return jnp.bool_(False)
    shards = config.ici_expert_parallelism
    tokens = routes.shape[0] * routes.shape[1]
    buffer = int((tokens // shards) * config.num_experts_per_tok * config.ragged_buffer_factor)
    per_expert = jax.nn.one_hot(routes.astype(jnp.int32), config.num_experts).sum((0, 1, 3))
    per_shard = per_expert.reshape(per_expert.shape[0], shards, -1).sum(-1)  # [layers, shards]
    return jnp.any(per_shard > buffer)


def _init_params(config: HyperParameters) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(config.init_weights_seed), 4)
    d, v, layers, e = (
        config.base_emb_dim,
        config.vocab_size,
        config.base_num_decoder_layers,
        config.num_experts,
    )
    params = {
        "embed": jax.random.normal(keys[0], (v, d)) * 0.1,
        "head": jax.random.normal(keys[1], (d, v)) * 0.1,
    }
    if e > 1:
        params["gate"] = jax.random.normal(keys[2], (layers, d, e)) * 0.1
        params["experts"] = jax.random.normal(keys[3], (layers, e, d, d)) * 0.1
    else:
        params["mlp"] = jax.random.normal(keys[3], (layers, d, d)) * 0.1
    return params


class MaxTextTrainingEngine:
    """maxtext 0.2.5's MaxTextTrainingEngine surface over the tiny model above."""

    model_type: type = StandInModel  # the Transformer class MaxText builds

    def __init__(
        self,
        training_config: HyperParameters,
        mesh: jax.sharding.Mesh | None = None,
        wrap_with_tunix_adapter: bool = False,
        tokenizer_pad_id: int | None = None,
    ) -> None:
        if not isinstance(training_config, HyperParameters):
            raise TypeError("MaxTextTrainingEngine requires a pyconfig.HyperParameters instance")
        if wrap_with_tunix_adapter and (tokenizer_pad_id is None or mesh is None):
            raise ValueError("wrap_with_tunix_adapter=True requires tokenizer_pad_id and a mesh")
        self._config = training_config
        self._mesh = mesh
        self._loss_fn: Callable[..., Any] | None = None
        self._has_aux = True
        self._gen_model_input_fn: Callable[[Any], dict[str, Any]] | None = None
        self._static: dict[str, Any] = {}  # the loss inputs closed over (not traced)
        self._tunix_adapter = wrap_with_tunix_adapter
        self._compiled = False
        self._compile_requested = False
        self._compiled_signature: Any = None
        self._replicated = (
            None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        )
        self._rest: dict[str, Any] = {}  # the model's non-parameter state (none here)
        self._tx = optax.chain(
            optax.clip_by_global_norm(training_config.gradient_clipping_threshold),
            optax.adamw(
                training_config.learning_rate,
                b1=training_config.adam_b1,
                b2=training_config.adam_b2,
                eps=training_config.adam_eps,
                weight_decay=training_config.adam_weight_decay,
            ),
        )
        self._params, self._opt_state = self._build_state()
        self._accumulated_grads: Any = None
        self._accumulated_denominator: Any = None
        self._train_step = 0
        self._total_micro_steps = 0
        self._metrics: list[MetricsBuffer] = []
        self._profile_active = False
        if training_config.enable_tensorboard:  # MaxText's MetricsLogger opens its writer here
            os.makedirs(training_config.tensorboard_dir, exist_ok=True)
            with open(os.path.join(training_config.tensorboard_dir, "events.out.tfevents"), "wb"):
                pass

    def _build_state(self) -> tuple[Any, Any]:
        """The weights and the optimizer state, on the mesh replicated."""
        params = self._in_layout(_init_params(self._config))
        state = (params, self._tx.init(params))
        return state if self._replicated is None else jax.device_put(state, self._replicated)

    @property
    def train_step(self) -> int:
        return self._train_step

    @train_step.setter
    def train_step(self, step: int) -> None:
        self._train_step = step

    @property
    def model(self) -> Any:
        """The model the loss is handed (MaxText's public `model`), at the current weights."""
        return self._model_of(self._params)

    def _in_layout(self, params: dict[str, jax.Array]) -> dict[str, Any]:
        """The Transformer's weights where the engine keeps them: under TunixMaxTextAdapter's one
        part, `base`, when it wraps the model (as NNX keeps a module's state where the module
        keeps its parts; the moments, built from the weights, mirror them)."""
        return {"base": params} if self._tunix_adapter else params

    def _model_of(self, params) -> Any:
        if self._tunix_adapter:
            return StandInTunixAdapter(self.model_type(params["base"], self._config))
        return self.model_type(params, self._config)

    def with_loss_fn(self, customized_fn, has_aux: bool = False) -> MaxTextTrainingEngine:
        self._loss_fn, self._has_aux = customized_fn, has_aux
        return self

    def with_gen_model_input_fn(self, gen_model_input_fn) -> MaxTextTrainingEngine:
        self._gen_model_input_fn = gen_model_input_fn
        return self

    # -- programs ------------------------------------------------------------------------------

    def _fwd_bwd_kernel(self, params, rest, batch, acc_grads=None, acc_denom=None):
        def loss_of(p):
            model = self._model_of(p)
            out = self._loss_fn(model, **batch, **self._static)
            metric, aux = _normalize_loss_output(out, self._has_aux)
            return metric.unreduced_sum, (metric, aux)  # MaxText differentiates the sum, as here

        (_, (metric, aux)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        denominator = metric.denominator.astype(jnp.float32)
        if acc_grads is None:
            return metric, aux, grads, denominator
        return metric, aux, jax.tree.map(jnp.add, acc_grads, grads), acc_denom + denominator

    def _update_kernel(self, params, opt_state, grads, denominator):
        safe = jnp.where(denominator > 0, denominator, 1.0)
        grads = jax.tree.map(lambda g: jnp.where(denominator > 0, g / safe, 0.0), grads)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self._tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grad_norm

    def _batch_shardings(self, batch):
        """As MaxText: rows over its batch axes, the sequence over context; a dimension an axis
        does not divide is replicated over it."""
        if self._mesh is None:
            return None
        spec = input_spec(self._config, self._mesh)

        def place(leaf):
            axes = []
            for dim, names in zip(leaf.shape, spec[: leaf.ndim], strict=False):
                size = int(np.prod([self._mesh.shape[n] for n in _names(names)]))
                axes.append(names if dim % size == 0 else None)
            return jax.sharding.NamedSharding(self._mesh, jax.sharding.PartitionSpec(*axes))

        return jax.tree.map(place, batch)

    def _compile_for_batch(self, batch) -> None:
        def fwd_bwd(params, rest, batch):
            return self._fwd_bwd_kernel(params, rest, batch)

        def fwd_bwd_accum(params, rest, batch, acc_grads, acc_denom):
            return self._fwd_bwd_kernel(params, rest, batch, acc_grads, acc_denom)

        def update(params, opt_state, grads, denominator):
            return self._update_kernel(params, opt_state, grads, denominator)

        def kernel(params, rest, batch):  # the eval program, named as MaxText's is
            model = self._model_of(params)
            return _normalize_loss_output(self._loss_fn(model, **batch, **self._static), True)

        shardings = self._batch_shardings(batch)
        replicated = self._replicated
        # As MaxText: the gradient sum and its denominator leave on the parameters' shardings.
        sums = (None, None, replicated, replicated)
        self._jitted = {
            "fwd_bwd": jax.jit(
                fwd_bwd, in_shardings=(replicated, replicated, shardings), out_shardings=sums
            ),
            "fwd_bwd_accum": jax.jit(
                fwd_bwd_accum,
                in_shardings=(replicated, replicated, shardings, replicated, replicated),
                out_shardings=sums,
            ),
            "update": jax.jit(update, in_shardings=replicated, out_shardings=replicated),
            "eval": jax.jit(kernel, in_shardings=(replicated, replicated, shardings)),
        }
        self._compiled_fwd_bwd = self._jitted["fwd_bwd"]
        self._compiled_fwd_bwd_accum = self._jitted["fwd_bwd_accum"]
        self._compiled_update = self._jitted["update"]
        self._compiled_signature = _signature(batch, self._static)
        self._compiled = True

    def compile_kernels(self, dummy_data, compiler_options=None) -> dict[str, Any]:
        lowered = self._lower_kernels(dummy_data)
        return {name: lowered[name].compile(compiler_options) for name in KERNEL_NAMES}

    def _lower_kernels(self, dummy_data) -> dict[str, Any]:
        """As maxtext 0.2.5: every kernel lowered through `_compile_for_batch`, on avals."""
        batch = self._prepare_batch(dummy_data)
        self._compile_for_batch(batch)
        avals = jax.tree.map(_to_aval, batch)
        params = jax.tree.map(_to_aval, self._params)
        opt = jax.tree.map(_to_aval, self._opt_state)
        fwd_bwd = self._jitted["fwd_bwd"].lower(params, self._rest, avals)
        _, _, grads, denominator = fwd_bwd.out_info
        return {
            "fwd_bwd": fwd_bwd,
            "fwd_bwd_accum": self._jitted["fwd_bwd_accum"].lower(
                params, self._rest, avals, grads, denominator
            ),
            "update": self._jitted["update"].lower(params, opt, grads, denominator),
        }

    def compile(self, dummy_data, compiler_options=None) -> None:
        self._compile_requested = True
        if self._compiled or dummy_data is None:
            return
        compiled = self.compile_kernels(dummy_data, compiler_options)
        self._compiled_fwd_bwd = compiled["fwd_bwd"]
        self._compiled_fwd_bwd_accum = compiled["fwd_bwd_accum"]
        self._compiled_update = compiled["update"]
        batch = self._prepare_batch(dummy_data)
        avals = jax.tree.map(_to_aval, batch)
        params = jax.tree.map(_to_aval, self._params)
        self._compiled_eval = (
            self._jitted["eval"].lower(params, self._rest, avals).compile(compiler_options)
        )

    # -- steps ---------------------------------------------------------------------------------

    def _prepare_batch(self, payload):
        """The loss inputs' traced half; the rest (`self._static`) is closed over, as MaxText's
        `_split_static_and_dynamic` does."""
        if self._gen_model_input_fn is not None:
            if dataclasses.is_dataclass(payload) and "metadata" in payload.__dataclass_fields__:
                payload = dataclasses.replace(payload, metadata={})
            payload = self._gen_model_input_fn(payload)
        batch, self._static = _split_static_and_dynamic(payload)
        return batch

    def fwd_bwd(self, payload, **kwargs: Any) -> None:
        self._maybe_profile(start=True)
        batch = self._prepare_batch(payload)
        if self._compile_requested:
            if not self._compiled or _signature(batch, self._static) != self._compiled_signature:
                self._compile_for_batch(batch)
            if self._accumulated_grads is None:
                metric, aux, grads, denom = self._compiled_fwd_bwd(self._params, self._rest, batch)
            else:
                metric, aux, grads, denom = self._compiled_fwd_bwd_accum(
                    self._params,
                    self._rest,
                    batch,
                    self._accumulated_grads,
                    self._accumulated_denominator,
                )
        else:
            metric, aux, grads, denom = self._fwd_bwd_kernel(
                self._params,
                self._rest,
                batch,
                self._accumulated_grads,
                self._accumulated_denominator,
            )
        self._record("loss", metric)
        for name, value in aux.items():
            self._record(name, value)
        self._accumulated_grads, self._accumulated_denominator = grads, denom
        self._total_micro_steps += 1
        self._maybe_profile(start=False)

    def _maybe_profile(self, start: bool) -> None:
        """MaxText's MicroStepProfiler: a jax.profiler trace over micro steps
        [skip_first_n_steps_for_profiler, + profiler_steps), into tensorboard_dir, whenever
        profiler_steps is not 0 (it does not look at `profiler`)."""
        config = self._config
        first = config.skip_first_n_steps_for_profiler
        last = first + config.profiler_steps - 1
        if config.profiler_steps == 0:
            return
        if start and not self._profile_active and self._total_micro_steps == first:
            jax.profiler.start_trace(config.tensorboard_dir)
            self._profile_active = True
        elif not start and self._profile_active and self._total_micro_steps - 1 == last:
            jax.profiler.stop_trace()
            self._profile_active = False

    def update(self, **kwargs: Any) -> int:
        if self._accumulated_grads is None:
            return self.train_step
        self._record("learning_rate", jnp.asarray(self._config.learning_rate))
        run = self._compiled_update if self._compiled else self._update_kernel
        self._params, self._opt_state, grad_norm = run(
            self._params, self._opt_state, self._accumulated_grads, self._accumulated_denominator
        )
        self._record("gradient_norm", grad_norm)
        self._accumulated_grads = self._accumulated_denominator = None
        self._train_step += 1
        return self.train_step

    def _record(self, name: str, metric: Any) -> None:
        if not self._metrics or self._metrics[-1].id != self._train_step:
            self._metrics.append(MetricsBuffer(id=self._train_step))
        buffer = self._metrics[-1]
        if isinstance(metric, WeightedMetric):
            old = buffer.weighted_metrics.get(name)
            buffer.weighted_metrics[name] = (
                WeightedMetric(
                    jnp.atleast_1d(metric.unreduced_sum), jnp.atleast_1d(metric.denominator)
                )
                if old is None
                else WeightedMetric(
                    jnp.append(old.unreduced_sum, metric.unreduced_sum),
                    jnp.append(old.denominator, metric.denominator),
                )
            )
        else:
            old = buffer.scalar_metrics.get(name)
            buffer.scalar_metrics[name] = (
                jnp.atleast_1d(metric) if old is None else jnp.append(old, metric)
            )

    def get_metrics(self, clear_cache: bool = True) -> MetricsBuffer:
        history = self._metrics
        if clear_cache:
            self._metrics = []
        return history[-1] if history else MetricsBuffer(id=EMPTY_METRICS_BUFFER_ID)

    def parameters(self) -> dict[str, np.ndarray]:
        """Host copies of the Transformer's weights, wrapped or not (the stand-in's own accessor,
        for tests)."""
        return jax.device_get(self._params["base"] if self._tunix_adapter else self._params)

    def close(self) -> None:
        if self._profile_active:
            jax.profiler.stop_trace()
            self._profile_active = False
        self._metrics = []


class AbstractMaxTextEngine(MaxTextTrainingEngine):
    """maxtext 0.2.5's `maxtext_engine_compile.AbstractMaxTextEngine`: weights and moments are
    shapes on the mesh, nothing is allocated, nothing can run; it only lowers."""

    def __init__(self, training_config: HyperParameters, mesh: jax.sharding.Mesh) -> None:
        if mesh is None:
            raise ValueError("AbstractMaxTextEngine requires a mesh")
        # maxtext 0.2.5 prints notices on stdout as its modules load (optional dependencies'
        # stubs); this is the first of the stand-in's code `aot` runs.
        print("[NO-OP] gcs_storage dependency missing; using stubs.")
        super().__init__(training_config, mesh=mesh)

    def _build_state(self) -> tuple[Any, Any]:
        return _traced_state(self)

    def fwd_bwd(self, payload, **kwargs: Any) -> None:
        raise RuntimeError("AbstractMaxTextEngine.fwd_bwd() needs real weights")

    def update(self, **kwargs: Any) -> int:
        raise RuntimeError("AbstractMaxTextEngine.update() needs real weights")


def _traced_state(engine: MaxTextTrainingEngine) -> tuple[Any, Any]:
    """As AbstractMaxTextEngine traces it: the weights and moments as shapes on the mesh."""

    def state():
        params = engine._in_layout(_init_params(engine._config))
        return params, engine._tx.init(params)

    return jax.tree.map(
        lambda aval: jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=engine._replicated),
        jax.eval_shape(state),
    )


class ShapesBuiltTrainingEngine(MaxTextTrainingEngine):
    """The adapter's `shapes_engine_type` over the stand-in: the state traced, as the abstract
    engine's, and everything else the running engine's."""

    _build_state = _traced_state


def _state_avals(engine: MaxTextTrainingEngine) -> tuple[Any, Any]:
    return engine._params, engine._opt_state


def _train_state(engine: MaxTextTrainingEngine) -> tuple[Any, Any]:
    """As the adapter's `train_state` over maxtext 0.2.5: the weights and moments, in the
    engine's layout."""
    return engine._params, engine._opt_state


def _set_train_state(engine: MaxTextTrainingEngine, state: tuple[Any, Any]) -> None:
    """As the adapter's `set_train_state`: the engine's weights and moments become `state`'s
    arrays (its own dropped)."""
    engine._params, engine._opt_state = state


def _release_state(engine: MaxTextTrainingEngine) -> None:
    """As the adapter's `release_state`: the engine's weights and moments become their shapes."""
    engine._params, engine._opt_state = jax.tree.map(_to_aval, (engine._params, engine._opt_state))


def _xla_options(config: HyperParameters) -> dict[str, str]:
    """max_utils.parse_libtpu_flags_to_dict of `compile_xla_flags`: --key=value words."""
    words = config.compile_xla_flags.split()
    return dict(word.removeprefix("--").split("=", 1) for word in words)


def _to_aval(value) -> Any:
    """As MaxText lowers: the shape, dtype and the sharding the value carries (an eagerly mapped
    array carries a single-device one, which then clashes with sharded input shardings)."""
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=getattr(value, "sharding", None))


def _signature(batch, static) -> Any:
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves), static


def _split_static_and_dynamic(batch: Any) -> tuple[Any, dict[str, Any]]:
    """As MaxText: a dict's entries with an array leaf (or none at all) are traced, the rest
    (Python scalars, config objects) closed over."""
    if not isinstance(batch, dict):
        return batch, {}
    arrays = (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)

    def dynamic(value):
        leaves = jax.tree.leaves(value)
        return not leaves or any(isinstance(leaf, arrays) for leaf in leaves)

    static = {
        key: value
        for key, value in batch.items()
        if isinstance(value, (int, float, bool)) or not dynamic(value)
    }
    return {key: value for key, value in batch.items() if key not in static}, static


def _normalize_loss_output(out: Any, has_aux: bool) -> tuple[WeightedMetric, dict[str, Any]]:
    """As MaxText: a LossOutput as it is; a `(loss, aux)` pair's metric from `xent_sum` and
    `total_weights`, its aux entries recorded only with has_aux."""
    if isinstance(out, LossOutput):
        return out.primary_loss, dict(out.aux_metrics)
    _, aux = out
    return WeightedMetric(aux["xent_sum"], aux["total_weights"]), aux if has_aux else {}


MESH_AXES = ("fsdp", "context", "expert")  # the ones of MaxText's axes the adapter sets


def _mesh(config: HyperParameters, devices) -> jax.sharding.Mesh:
    shape = [getattr(config, f"ici_{axis}_parallelism") for axis in MESH_AXES]
    assert int(np.prod(shape)) == len(devices), (  # as create_device_mesh asserts
        f"Number of devices per slice {len(devices)} does not match the product of the ICI"
        f" parallelism {int(np.prod(shape))}"
    )
    return jax.sharding.Mesh(np.array(devices).reshape(shape), MESH_AXES)


def input_spec(config: HyperParameters, mesh: jax.sharding.Mesh) -> tuple[Any, ...]:
    """sharding.get_input_data_sharding's [batch, sequence] spec for these axes."""
    del config, mesh
    return (("fsdp", "expert"), "context")


def _names(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


# -- Tunix: its TrainerWorker, packed TrainExample, GRPOConfig and GRPO loss, as far as the adapter
# drives them (tunix/experimental/worker/trainer_worker.py, tunix/rl/common.py, algo_core.py).


@dataclasses.dataclass(frozen=True)
class TrainExample:
    prompt_ids: Any
    prompt_mask: Any
    completion_ids: Any
    completion_mask: Any
    advantages: Any
    ref_per_token_logps: Any
    old_per_token_logps: Any
    segment_ids: Any = None
    segment_positions: Any = None
    num_segments: int | None = None  # static, as Tunix's flax.struct field


jax.tree_util.register_dataclass(
    TrainExample,
    data_fields=[f.name for f in dataclasses.fields(TrainExample) if f.name != "num_segments"],
    meta_fields=["num_segments"],
)


@dataclasses.dataclass
class GRPOConfig:
    """Tunix's GRPOConfig fields the loss reads (epsilon_high and temperature are set on it)."""

    num_generations: int = 2
    beta: float = 0.04
    epsilon: float = 0.2
    loss_algo: str = "grpo"
    loss_agg_mode: str = "sequence-mean-token-mean"
    kl_loss_mode: str = "kl"


class TrainerWorker:
    """Tunix's TrainerWorker: builds its trainer from the factory and delegates to it."""

    def __init__(self, trainer_factory, *, worker_id: str = "trainer_worker"):
        self._trainer = trainer_factory()
        self.worker_id = worker_id

    def with_loss_fn(self, loss_fn, has_aux: bool = False) -> dict[str, Any]:
        self._trainer.with_loss_fn(loss_fn, has_aux)
        return {"loss_fn_configured": True}

    def with_gen_model_input_fn(self, gen_model_input_fn) -> dict[str, Any]:
        self._trainer.with_gen_model_input_fn(gen_model_input_fn)
        return {"gen_model_input_fn_configured": True}

    def compile(self, dummy_data=None) -> dict[str, Any]:
        self._trainer.compile(dummy_data)
        return {"compiled": True}

    def fwd_bwd(self, payload, **kwargs: Any) -> dict[str, Any]:
        self._trainer.fwd_bwd(payload, **kwargs)
        return {"queued": True}

    def update(self, **kwargs: Any) -> int:
        return self._trainer.update(**kwargs)

    def get_metrics(self) -> Any:
        return self._trainer.get_metrics()


def grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    """Tunix's packed GRPO loss: token-aligned log-probs (logp[t] scores token t, 0 first), the
    clipped surrogate, token-mean over the completion mask (the only mode the bench asks for)."""
    del pad_id, eos_id  # read on unpacked rows only
    if algo_config.loss_agg_mode != "token-mean" or train_example.num_segments is None:
        raise NotImplementedError("the stand-in aggregates packed rows by token-mean only")
    example = train_example
    logps = per_token_logps(
        model,
        example.completion_ids,
        example.segment_positions,
        example.segment_ids,
        kwargs.get("compute_logps_chunk_size", 0),
    )
    ratio = jnp.exp(jnp.clip(logps - example.old_per_token_logps, -20.0, 20.0))
    high = getattr(algo_config, "epsilon_high", algo_config.epsilon)
    clipped = jnp.clip(ratio, 1 - algo_config.epsilon, 1 + high)
    per_token = jnp.maximum(-example.advantages * ratio, -example.advantages * clipped)
    mask = example.completion_mask
    tokens = jnp.sum(mask)
    return LossOutput(
        WeightedMetric(jnp.sum(per_token * mask), tokens, min_denom=1.0),
        {"pg_clipfrac": WeightedMetric(jnp.sum((clipped != ratio) * mask), tokens)},
    )


def per_token_logps(model, ids, positions, segment_ids, chunk_size: int) -> jax.Array:
    """Tunix's packed per-token log-probs (`rl/common.py compute_per_token_logps`): token-aligned,
    0 first; with `chunk_size` > 0 its chunked pass: the model called with `skip_lm_head=True`
    (refused, as Tunix refuses it, where the call takes none or `compute_final_logits` is
    missing), then the head on `chunk_size` tokens at a time, each chunk rematerialized."""
    call = {"positions": positions, "cache": None, "attention_mask": None}
    if not chunk_size:
        logits, _ = model(ids, **call, segment_ids=segment_ids)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), ids[:, 1:, None], -1)
        return jnp.pad(picked[..., 0], ((0, 0), (1, 0)))
    if "skip_lm_head" not in inspect.signature(model.__call__).parameters:
        raise ValueError("Model __call__ must accept skip_lm_head.")
    if not callable(getattr(model, "compute_final_logits", None)):
        raise ValueError("Model must contain a function called compute_final_logits.")
    hidden, _ = model(ids, **call, segment_ids=segment_ids, skip_lm_head=True)
    hidden, targets = hidden[:, :-1], ids[:, 1:]
    rows, length, width = hidden.shape
    pad = -length % chunk_size
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    chunks = (length + pad) // chunk_size

    @jax.checkpoint
    def step(carry, xs):
        h, t = xs
        logits = model.compute_final_logits(h).astype(jnp.float32)
        return carry, jnp.take_along_axis(jax.nn.log_softmax(logits), t[..., None], -1)[..., 0]

    xs = (
        jnp.swapaxes(hidden.reshape(rows, chunks, chunk_size, width), 0, 1),
        jnp.swapaxes(targets.reshape(rows, chunks, chunk_size), 0, 1),
    )
    _, picked = jax.lax.scan(step, None, xs)
    picked = jnp.swapaxes(picked, 0, 1).reshape(rows, length + pad)[:, :length]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def replaying(model, routes, wrapped: bool, split: str):
    """The adapter's own route-replaying Tunix call (`tunix_grpo.ReplayingCall`, the plain class
    under its nnx module) over the stand-in's model."""
    if isinstance(model, StandInTunixAdapter) != wrapped:  # the adapter and Transformer differ
        raise TypeError(f"wrapped={wrapped} for a {type(model).__name__}")
    return ReplayingCall(model, routes, wrapped, split)


STAND_IN_TUNIX_API = TunixApi(
    worker_type=TrainerWorker,
    grpo_loss_fn=grpo_loss_fn,
    train_example_type=TrainExample,
    grpo_config_type=GRPOConfig,
    replaying=replaying,
)


def tunix_absent() -> TunixApi:
    raise ImportError("No module named 'tunix' (the stand-in's engine has none)")


STAND_IN_API = MaxTextApi(
    engine_type=MaxTextTrainingEngine,
    payload_type=RLTrainerPayload,
    gen_model_input_fn=router_replay_gen_model_input_fn,
    make_loss_fn=make_router_replay_loss_fn,
    model_config=lambda name: MODEL_CONFIGS.get(name, {}),
    build_config=lambda words: initialize(["", *words]),
    build_mesh=_mesh,
    input_spec=input_spec,
    tunix_adapter_wraps=lambda name: name == "qwen3.5-397b-a17b",  # MaxText has its HF config
    version="0.2.5-stand-in",
    abstract_engine_type=AbstractMaxTextEngine,
    state_avals=_state_avals,
    xla_options=_xla_options,
    train_state=_train_state,
    set_train_state=_set_train_state,
    release_state=_release_state,
    shapes_engine_type=ShapesBuiltTrainingEngine,
)


class StandInMaxTextEngine(MaxTextEngine):
    """The adapter over the stand-in: nameable as ENGINE=maxtext_stand_in:StandInMaxTextEngine (tests/ on the path)."""

    load_api = staticmethod(lambda: STAND_IN_API)
    load_tunix = staticmethod(tunix_absent)


class StandInTunixMaxTextEngine(StandInMaxTextEngine):
    """The adapter over the stand-ins of MaxText and Tunix: Tunix's driver where asked or auto."""

    load_tunix = staticmethod(lambda: STAND_IN_TUNIX_API)


class NativeHeadTrainingEngine(MaxTextTrainingEngine):
    """The engine of a MaxText whose Transformer takes `skip_lm_head` itself."""

    model_type = NativeHeadModel


class NativeHeadTunixMaxTextEngine(StandInTunixMaxTextEngine):
    """The adapter over that MaxText, driven by Tunix."""

    load_api = staticmethod(
        lambda: dataclasses.replace(STAND_IN_API, engine_type=NativeHeadTrainingEngine)
    )


# The adapter's AOT functions over the stand-in: `aot` finds them in the engine class's module.
_AOT = maxtext_aot.MaxTextAot(lambda: STAND_IN_API)
lower_programs, abstract_state, payload_spec, compiler_options, trainer_keys_refused = (
    _AOT.functions()
)
BESIDE = maxtext_aot.BESIDE
