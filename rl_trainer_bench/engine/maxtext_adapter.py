"""MaxText's public training engine behind the bench's engine contract (docs/engine.md).

`MaxTextTrainingEngine` (maxtext 0.2.5, `maxtext/training_engine/`) has the contract's shape but
not its details, and this adapter supplies exactly the difference, nothing else:

- **Payload.** The bench's micro-batch becomes Tunix's `RLTrainerPayload` in the packed layout
  MaxText reads: the whole row in `completion_ids` (zero-width prompt), `segment_ids` and
  `segment_positions` as given, the rollout's routes as `routed_experts` ([B, T, L, K], -1 on
  padding). Masks: the bench's `completion_mask[t]` scores the prediction *of* token t+1 (it is
  input-aligned, `contract.Payload`); MaxText takes a *token* mask and shifts it left by one itself
  (`targets_segmentation[t] = token_mask[t+1]` within a segment). So the adapter hands MaxText the
  completion mask shifted right by one, and MaxText's loss weights are then exactly the bench's
  mask: the loss denominator equals the built-in engine's on the same micro-batch.
- **Loss.** MaxText's own router-replay loss (`make_router_replay_loss_fn` with
  `router_replay_gen_model_input_fn`): token cross-entropy on the completion targets with the
  rollout's expert choices forced. It is not the GRPO surrogate the built-in engine computes;
  the per-token cost differs by a few element-wise ops, the matmuls are the same.
- **Compile.** `compile` returns None, so the adapter times it: JAX's compile events (trace,
  lowering, backend compile) are summed per program the engine compiles, `fwd_bwd`,
  `fwd_bwd_accum`, `update` and `eval` by name, everything else (the eager ops of the input
  mapping) as `eager_ops`.
- **Metrics.** MaxText's on-device `MetricsBuffer` becomes host values under the ruler's keys:
  `loss` = sum of the step's unreduced losses / sum of their denominators (what the update
  divides by), `grad_norm` = `gradient_norm`, `loss_denominator` = the summed denominators,
  `tokens` = real tokens fed. MaxText's router-replay loss reports no dropped or replayed pairs
  and no probability error, so `overflow_count`, `replay_count` and `mult_prob_error_max` read 0
  and `info()` says they are not measured.
- **Staging.** MaxText has no `prepare_fwd_bwd_input` or `wait_for_device`; the adapter builds
  them from the engine's own parts: its input mapping (`router_replay_gen_model_input_fn`), a
  `jax.device_put` onto the input shardings of the `fwd_bwd` program the engine compiled, and a
  block on the staged arrays and on the step's last outputs. A staged micro-batch reaches the
  engine through its input hook unchanged, so it trains exactly what the plain one would.

Converting a Payload is adapter work the production trainer never does (it receives Tunix
payloads), so it is done once per distinct micro-batch and reused: the timed `fwd_bwd` is
MaxText's own call. MaxText (and Tunix, which it imports) are imported when the adapter is built,
never when this module is.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.engine import compile_events
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import ContractError, Payload, PreparedInput

KERNELS = ("fwd_bwd", "fwd_bwd_accum", "update")
_EVAL_KERNEL = "kernel"  # what MaxText's eval program is called in JAX's events
NOT_MEASURED = ("overflow_count", "replay_count", "mult_prob_error_max")
_CONVERTED_CACHE = 64  # distinct micro-batches kept converted (the bench's pool is far smaller)


@dataclasses.dataclass(frozen=True)
class MaxTextApi:
    """The MaxText names the adapter uses, resolved once: the real package or a stand-in."""

    engine_type: type  # MaxTextTrainingEngine(training_config, mesh=None, ...)
    payload_type: type  # Tunix RLTrainerPayload
    gen_model_input_fn: Callable[[Any], dict[str, Any]]  # router_replay_gen_model_input_fn
    make_loss_fn: Callable[..., Callable[..., Any]]  # make_router_replay_loss_fn(config)
    build_config: Callable[[Mapping[str, Any]], Any]  # MaxText keys -> HyperParameters
    build_mesh: Callable[[Any], Any]  # HyperParameters -> jax Mesh (or None)
    version: str


def load_maxtext() -> MaxTextApi:
    """The installed maxtext package's training engine (needs maxtext and Tunix importable)."""
    try:
        from importlib.metadata import version

        from maxtext.configs import pyconfig
        from maxtext.training_engine import abstract_engine, maxtext_engine
        from maxtext.utils import maxtext_utils
    except ImportError as error:
        raise ContractError(
            f"ENGINE=...maxtext_adapter:MaxTextEngine needs maxtext and Tunix importable ({error}):"
            " build the side environment of benchmarks/maxtext_engine.sh"
        ) from error

    def build_mesh(config: Any) -> jax.sharding.Mesh:
        return jax.sharding.Mesh(maxtext_utils.create_device_mesh(config), config.mesh_axes)

    return MaxTextApi(
        engine_type=maxtext_engine.MaxTextTrainingEngine,
        payload_type=abstract_engine.RLTrainerPayload,
        gen_model_input_fn=maxtext_engine.router_replay_gen_model_input_fn,
        make_loss_fn=maxtext_engine.make_router_replay_loss_fn,
        build_config=lambda keys: pyconfig.initialize(None, **keys),
        build_mesh=build_mesh,
        version=version("maxtext"),
    )


def maxtext_keys(config: EngineConfig) -> dict[str, Any]:
    """MaxText config keys for the same model, batch and optimizer as `config`.

    One micro-batch of `micro_batch_rows` rows over all devices of the mesh; the mesh's product
    goes to MaxText's fsdp axis (MaxText shards the batch over it). A model with one expert is
    MaxText's dense decoder; more experts make every layer a routed MoE with replayed routes.
    """
    m, opt = config.model, config.optimizer
    devices = config.mesh.size
    keys: dict[str, Any] = {
        "run_name": "rl_trainer_bench",
        "model_name": "default",
        "vocab_size": m.vocab_size,
        "base_emb_dim": m.d_model,
        "base_num_decoder_layers": m.num_layers,
        "base_num_query_heads": m.num_heads,
        "base_num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "base_mlp_dim": m.expert_ffn_dim,
        "rope_max_timescale": int(m.rope_theta),
        "normalization_layer_epsilon": m.rms_norm_eps,
        "dtype": m.dtype,
        "weight_dtype": "float32",
        "max_target_length": config.seq_len,
        "per_device_batch_size": config.micro_batch_rows / devices,
        "ici_fsdp_parallelism": devices,
        "learning_rate": opt.learning_rate,
        "adam_b1": opt.b1,
        "adam_b2": opt.b2,
        "adam_eps": opt.eps,
        "adam_weight_decay": opt.weight_decay,
        "gradient_clipping_threshold": opt.max_grad_norm,
        "init_weights_seed": config.seed,
        "enable_dropout": False,
        "enable_checkpointing": False,
        "skip_step_on_spikes": False,
        "warmup_steps_fraction": 0.0,  # MaxText warms up over 10 % of 150k steps: no learning here
        # MaxText otherwise turns on JAX's persistent compilation cache for the whole process: the
        # compile seconds would become cache reads and a program loaded in a scored step would
        # slip past the recompile check (which sees compiles, not cache hits).
        "jax_cache_dir": "",
    }
    if m.num_experts > 1:
        keys |= {
            "num_experts": m.num_experts,
            "num_experts_per_tok": m.top_k,
            "base_moe_mlp_dim": m.expert_ffn_dim,
        }
    return keys


@dataclasses.dataclass
class PreparedMaxTextInput:
    """A micro-batch mapped to MaxText's loss inputs and put on the engine's input shardings."""

    name: str
    digests: Mapping[str, str]
    batch: dict[str, Any]
    tokens: int  # real tokens, counted on the host when the micro-batch was converted


@dataclasses.dataclass(frozen=True)
class _ShapesOf:
    """A payload that MaxText's compile should see as shapes only (see `_model_input`)."""

    payload: Any


@dataclasses.dataclass(frozen=True)
class _Converted:
    source: np.ndarray  # the Payload's input_ids: kept so its id() is not reused while cached
    payload: Any  # RLTrainerPayload
    tokens: int


def replay_payload_type(payload_type: type) -> type:
    """`payload_type` with a `routed_experts` field, which Tunix's payload lacks but MaxText reads.

    MaxText reads `routed_experts` off the payload by attribute, and rebuilds the payload with
    `dataclasses.replace` before reading it; a field (not a set attribute) survives that.
    """
    if "routed_experts" in {f.name for f in dataclasses.fields(payload_type)}:
        return payload_type
    return dataclasses.make_dataclass(
        f"Replay{payload_type.__name__}",
        [("routed_experts", Any, dataclasses.field(default=None))],
        bases=(payload_type,),
        kw_only=True,
    )


def completion_token_mask(completion_mask: np.ndarray) -> np.ndarray:
    """The bench's input-aligned mask as MaxText's token mask: shifted right by one position.

    A segment's last position never scores (no next token), so the shift never carries a 1 into
    the next segment's first position.
    """
    shifted = np.zeros_like(completion_mask)
    shifted[:, 1:] = completion_mask[:, :-1]
    return shifted


def to_maxtext_payload(payload: Payload, payload_type: type) -> Any:
    """The bench's micro-batch as MaxText's packed RLTrainerPayload (module docstring: masks)."""
    rows = payload.shape[0]
    mask = completion_token_mask(payload.completion_mask)
    empty = np.zeros((rows, 0), np.int32)
    return payload_type(
        token_ids=payload.input_ids,
        token_mask=(payload.segment_ids != 0).astype(np.int32),
        segment_ids=payload.segment_ids,
        segment_positions=payload.positions,
        advantages=payload.advantages,
        loss_mask=payload.completion_mask,
        prompt_ids=empty,
        prompt_mask=empty,
        completion_ids=payload.input_ids,
        completion_mask=mask,
        old_per_token_logps=payload.old_logps,
        ref_per_token_logps=payload.ref_logps,
        routed_experts=payload.routed_experts,
    )


class _CompileTimes:
    """Seconds JAX spent tracing, lowering and compiling, per program name, while installed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in compile_events.ALL:
            name = str(kwargs.get("fun_name", "?"))
            if name.startswith("jit(") and name.endswith(")"):
                name = name[4:-1]
            self.seconds[name] += duration

    @contextlib.contextmanager
    def installed(self) -> Iterator[_CompileTimes]:
        with compile_events.listening(self._listen):
            yield self

    def per_program(self) -> dict[str, float]:
        """The engine's kernels by name, its eval program as `eval`, the rest as `eager_ops`."""
        out = {name: self.seconds.get(name, 0.0) for name in KERNELS}
        if _EVAL_KERNEL in self.seconds:
            out["eval"] = self.seconds[_EVAL_KERNEL]
        named = (*KERNELS, _EVAL_KERNEL)
        out["eager_ops"] = sum(s for name, s in self.seconds.items() if name not in named)
        return out


class MaxTextEngine:
    """MaxText's `MaxTextTrainingEngine` as a bench engine: `MaxTextEngine(engine_config)`.

    `load_api` says where MaxText comes from; a subclass may point it at a stand-in.
    """

    load_api: Callable[[], MaxTextApi] = staticmethod(load_maxtext)

    def __init__(self, config: EngineConfig):
        self.config = config
        self.api = type(self).load_api()
        self.maxtext_config = self.api.build_config(maxtext_keys(config))
        self.mesh = self.api.build_mesh(self.maxtext_config)
        self._payload_type = replay_payload_type(self.api.payload_type)
        self.engine = (
            self.api.engine_type(self.maxtext_config, mesh=self.mesh)
            .with_loss_fn(self.api.make_loss_fn(self.maxtext_config))
            .with_gen_model_input_fn(self._model_input)
        )
        self._converted: collections.OrderedDict[int, _Converted] = collections.OrderedDict()
        self._batch_shardings: Mapping[str, Any] | None = None
        self._compiled = False
        self._staged: list[PreparedMaxTextInput] = []
        self._tokens = 0

    # -- the contract --------------------------------------------------------------------------

    @property
    def train_step(self) -> int:
        return self.engine.train_step

    def compile(self, example: Payload) -> dict[str, float]:
        """Compile MaxText's kernels for micro-batches shaped like `example`; seconds per program."""
        times = _CompileTimes()
        with times.installed():
            self.engine.compile(_ShapesOf(self._convert(example).payload))
        self._batch_shardings = self._fwd_bwd_batch_shardings()
        self._compiled = True
        return times.per_program()

    def fwd_bwd(self, batch: Payload | PreparedInput) -> None:
        if isinstance(batch, PreparedMaxTextInput):
            self._tokens += batch.tokens
            self.engine.fwd_bwd(batch)
            return
        converted = self._convert(batch)
        self._tokens += converted.tokens
        self.engine.fwd_bwd(converted.payload)

    def update(self) -> int:
        return self.engine.update()

    def get_metrics(self, clear_cache: bool = True) -> dict[str, Any]:
        """The last step's metrics on the host under the ruler's keys ({} before the first)."""
        buffer = self.engine.get_metrics(clear_cache=clear_cache)
        loss = buffer.weighted_metrics.get("loss")
        if loss is None:
            return {}
        total, denominator, scalars = jax.device_get(
            (loss.unreduced_sum, loss.denominator, dict(buffer.scalar_metrics))
        )
        loss_denominator = float(np.sum(denominator))
        out: dict[str, Any] = {
            "loss": float(np.sum(total)) / max(loss_denominator, 1.0),
            "grad_norm": float(np.asarray(scalars["gradient_norm"]).reshape(-1)[-1]),
            "loss_denominator": loss_denominator,
            "tokens": self._tokens,
            "train_step": int(buffer.id) + 1,
            **dict.fromkeys(NOT_MEASURED, 0),
        }
        if "learning_rate" in scalars:
            out["learning_rate"] = float(np.asarray(scalars["learning_rate"]).reshape(-1)[-1])
        if clear_cache:
            self._tokens = 0
        return out

    # -- staging (MaxText has none; built from the engine's own input mapping) -----------------

    def prepare_fwd_bwd_input(self, payload: Payload) -> PreparedMaxTextInput:
        """Map `payload` to MaxText's loss inputs and start their copy onto the input shardings."""
        if not self._compiled:
            raise ContractError("prepare_fwd_bwd_input before compile(example): compile first")
        if self._batch_shardings is None:
            raise ContractError(
                "this MaxText engine keeps no compiled fwd_bwd after compile(): the adapter cannot"
                " read its input shardings, so it cannot stage: set STAGE_BEFORE_UPDATE=off"
            )
        converted = self._convert(payload)
        batch = self.api.gen_model_input_fn(converted.payload)
        # An input the program does not read has no sharding (XLA pruned it): it stays as mapped.
        placed = {
            key: value
            if self._batch_shardings.get(key) is None
            else jax.device_put(value, self._batch_shardings[key])
            for key, value in batch.items()
        }
        prepared = PreparedMaxTextInput(
            name=payload.name, digests=dict(payload.digests), batch=placed, tokens=converted.tokens
        )
        self._staged.append(prepared)
        return prepared

    def wait_for_device(self) -> float:
        """Block until the staged copies and the step's dispatched programs are done; seconds."""
        start = time.perf_counter()
        outputs = self.engine.get_metrics(clear_cache=False)
        jax.block_until_ready(([p.batch for p in self._staged], outputs.weighted_metrics))
        self._staged.clear()
        return time.perf_counter() - start

    def info(self) -> dict[str, Any]:
        return {
            "engine": f"maxtext.MaxTextTrainingEngine {self.api.version}",
            "loss": "maxtext router-replay cross-entropy",
            "not_measured": ",".join(NOT_MEASURED),
            "devices": int(self.mesh.devices.size) if self.mesh is not None else 1,
        }

    # -- internals -----------------------------------------------------------------------------

    def _model_input(self, payload: Any) -> dict[str, Any]:
        """The engine's input hook: a staged micro-batch is already mapped and placed; the compile
        example is mapped to shapes only, so MaxText lowers against its own input shardings (an
        eagerly mapped array carries a single-device sharding that MaxText's lowering would
        keep and then find at odds with its sharded inputs)."""
        if isinstance(payload, PreparedMaxTextInput):
            return payload.batch
        if isinstance(payload, _ShapesOf):
            mapped = self.api.gen_model_input_fn(payload.payload)
            return {
                key: jax.ShapeDtypeStruct(value.shape, value.dtype)
                if hasattr(value, "shape")
                else value
                for key, value in mapped.items()
            }
        return self.api.gen_model_input_fn(payload)

    def _convert(self, payload: Payload) -> _Converted:
        key = id(payload.input_ids)
        cached = self._converted.get(key)
        if cached is not None and cached.source is payload.input_ids:
            self._converted.move_to_end(key)
            return cached
        converted = _Converted(
            source=payload.input_ids,
            payload=to_maxtext_payload(payload, self._payload_type),
            tokens=int(np.count_nonzero(payload.segment_ids)),
        )
        self._converted[key] = converted
        if len(self._converted) > _CONVERTED_CACHE:
            self._converted.popitem(last=False)
        return converted

    def _fwd_bwd_batch_shardings(self) -> dict[str, Any] | None:
        """Where MaxText's compiled `fwd_bwd(params, rest, batch)` takes each loss input.

        Read off the executable `compile()` installed (`_compiled_fwd_bwd`, the one private name
        the adapter reads: MaxText exposes no public accessor), so a staged copy lands exactly
        where the program expects it and the call does no further transfer. None when absent.
        """
        compiled = getattr(self.engine, "_compiled_fwd_bwd", None)
        shardings = getattr(compiled, "input_shardings", None)
        return None if shardings is None else dict(shardings[0][2])
