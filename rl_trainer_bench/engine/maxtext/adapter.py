"""MaxText's public training engine behind the bench's engine contract (docs/maxtext.md).

`MaxTextTrainingEngine` (maxtext 0.2.5, `maxtext/training_engine/`) has the contract's shape but
not its details, and this adapter supplies exactly the difference, nothing else:

- **Config.** MaxText's own model config for the bench model's family (Qwen3.5: `qwen3.5-397b-a17b`,
  decoder `qwen3_5`), with the engine config's shapes, mesh, batch and optimizer translated by one
  table (`maxtext.keys`), then the trainer's own MaxText keys unchanged and last, as Tunix applies
  them. What MaxText does not take, what the trainer's keys replaced and which of them the bench
  held is in `info()`, which the bench logs before the compile.
- **Mesh.** The engine config's fsdp x context x expert are MaxText's `ici_*` axes; MaxText then
  splits rows over fsdp x expert and the sequence over context, as the built-in engine does. A
  micro-batch MaxText's mesh cannot split is refused before the compile (MaxText would replicate
  it, doing the work once per device of the axis).
- **Payload** (the adapter's own calls). The bench's micro-batch becomes Tunix's
  `RLTrainerPayload` in the packed layout MaxText reads: the whole row in `completion_ids`
  (zero-width prompt), `segment_ids` and `segment_positions` as given, the rollout's routes as
  `routed_experts` ([B, T, L, K], -1 on padding). Masks: the bench's `completion_mask[t]`
  scores the prediction *of* token t+1 (it is input-aligned, `contract.Payload`); MaxText takes a
  *token* mask and shifts it left by one itself (`targets_segmentation[t] = token_mask[t+1]`
  within a segment). So the adapter hands MaxText the completion mask shifted right by one, and
  MaxText's loss weights are then exactly the bench's mask: the loss denominator equals the
  built-in engine's on the same micro-batch.
- **Driver and loss** (`MAXTEXT_DRIVER`, `tunix_grpo`). Where Tunix's `TrainerWorker` and GRPO
  loss import, the engine is built inside Tunix's worker with Tunix's `grpo_loss_fn`, as a Tunix
  trainer runs it, and the bench's calls go through the worker (`calls`); the micro-batch is
  Tunix's packed `TrainExample` instead of the payload above, and the model's call replays the
  routes. Otherwise the adapter calls the engine itself with MaxText's own router-replay loss
  (`make_router_replay_loss_fn` with `router_replay_gen_model_input_fn`): token cross-entropy on
  the completion targets with the rollout's expert choices forced, not the GRPO surrogate; the
  per-token cost differs by a few element-wise ops, the matmuls are the same. Both divide by the
  bench's count of completion targets.
- **Compile.** `compile` returns None, so the adapter times it: JAX's compile events (trace,
  lowering, backend compile) are summed per program the engine compiles, `fwd_bwd`,
  `fwd_bwd_accum`, `update` and `eval` by name, everything else (the eager ops of the input
  mapping) as `eager_ops`.
- **Metrics.** MaxText's on-device `MetricsBuffer` becomes host values under the ruler's keys
  (`maxtext.metrics`). Drops are counted only where MaxText measures them; replays and the
  probability error never are, and read None (not measured), never 0.
- **Files.** MaxText's profiler is off (PROFILE_STEPS traces through the bench's own window,
  which records MaxText's programs too) and everything MaxText writes (TensorBoard events) goes
  under the engine config's `output_dir`, inside the run's results folder, never the caller's
  working directory (an engine built without one writes into a temporary folder it removes).
- **Staging.** MaxText has no `prepare_fwd_bwd_input` or `wait_for_device`; the adapter builds
  them from the engine's own parts: its input hook (`router_replay_gen_model_input_fn`, or the
  Tunix loss's arguments), a `jax.device_put` onto the input shardings of the `fwd_bwd` program
  the engine compiled, and a block on the staged arrays and on the step's last outputs. A staged
  micro-batch reaches the engine through its input hook unchanged, so it trains exactly what the
  plain one would.

Converting a Payload is adapter work the production trainer never does (it receives Tunix
payloads), so it is done once per distinct micro-batch and reused: the timed `fwd_bwd` is
MaxText's own call. MaxText (and Tunix, which it imports) are imported when the adapter is built,
never when this module is.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.engine import compile_events
from rl_trainer_bench.engine.builtin import flops
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import ContractError, Payload, PreparedInput, StateMismatch
from rl_trainer_bench.engine.maxtext import aot as maxtext_aot
from rl_trainer_bench.engine.maxtext import config as maxtext_config
from rl_trainer_bench.engine.maxtext import cpu_lowerings, state_layout, tunix_grpo
from rl_trainer_bench.engine.maxtext import head as maxtext_head
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.engine.maxtext import metrics as maxtext_metrics
from rl_trainer_bench.engine.maxtext import payload as maxtext_payload
from rl_trainer_bench.engine.shared_state import StateFamily, first_difference

KERNELS = ("fwd_bwd", "fwd_bwd_accum", "update")
# MaxText's own loss (the adapter's own calls) takes the model's logits whole.
OWN_LOSS_LOGITS = (
    "MaxText's router-replay cross-entropy takes the model's full [B, T, V] logits (MaxText's"
    " num_vocab_tiling key tiles them); Tunix's chunked pass runs only under MAXTEXT_DRIVER=tunix"
)
_EVAL_KERNEL = "kernel"  # what MaxText's eval program is called in JAX's events
_CONVERTED_CACHE = 64  # distinct micro-batches kept converted (the bench's pool is far smaller)


@dataclasses.dataclass(frozen=True)
class MaxTextApi:
    """The MaxText names the adapter uses, resolved once: the real package or a stand-in."""

    engine_type: type  # MaxTextTrainingEngine(training_config, mesh=None, ...)
    payload_type: type  # Tunix RLTrainerPayload
    gen_model_input_fn: Callable[[Any], dict[str, Any]]  # router_replay_gen_model_input_fn
    make_loss_fn: Callable[..., Callable[..., Any]]  # make_router_replay_loss_fn(config)
    model_config: Callable[[str], Mapping[str, Any]]  # configs/models/<name>.yml as a mapping
    build_config: Callable[[Sequence[str]], Any]  # key=value words -> HyperParameters
    build_mesh: Callable[[Any, Sequence[Any]], Any]  # (HyperParameters, devices) -> jax Mesh
    input_spec: Callable[[Any, Any], tuple[Any, ...]]  # (config, mesh) -> [rows, seq] spec
    # model name -> whether MaxText's TunixMaxTextAdapter can wrap it (it needs the model's HF
    # config, which MaxText's dense `default` model has none of)
    tunix_adapter_wraps: Callable[[str], bool]
    version: str
    # For `aot` (maxtext_aot): the engine with shapes for weights, AbstractMaxTextEngine(config,
    # mesh); its parameters and optimizer state as sharded ShapeDtypeStructs; the XLA options
    # MaxText compiles with.
    abstract_engine_type: type
    state_avals: Callable[[Any], tuple[Any, Any]]
    xla_options: Callable[[Any], dict[str, str]]
    # (engine) -> its whole training state (model and optimizer) as a pytree, in its model's
    # layout, and (engine, state) setting it to `state`'s leaves (no copy, its own dropped):
    # what `MaxTextEngine.take_shared_state` moves from one engine to another (`state_layout`).
    train_state: Callable[[Any], Any]
    set_train_state: Callable[[Any, Any], None]
    # (engine) whose state another engine adopted: each of its state's leaves becomes its shape,
    # so the engine that took the state is the only holder of its arrays.
    release_state: Callable[[Any], None]
    # MaxText's engine, called as `engine_type`, with its training state built as shapes (no
    # weights or moments allocated): it runs once `set_train_state` has given it arrays.
    shapes_engine_type: type


def load_maxtext() -> MaxTextApi:
    """The installed maxtext package's training engine (needs maxtext and Tunix importable)."""
    try:
        # maxtext prints its optional dependencies' stubs on import: to stderr, not into a report
        # on stdout (`aot --json`).
        with contextlib.redirect_stdout(sys.stderr):
            # optional: maxtext is installed in MaxText's own environment alone
            from maxtext.checkpoint_conversion.utils.hf_model_configs import HF_MODEL_CONFIGS
            from maxtext.training_engine import (
                abstract_engine,
                maxtext_engine,
                maxtext_engine_compile,
            )
            from maxtext.utils import max_utils, maxtext_utils, sharding
    except ImportError as error:
        raise ContractError(
            f"ENGINE=...maxtext.adapter:MaxTextEngine needs maxtext and Tunix importable ({error}):"
            " build the side environment of benchmarks/maxtext/maxtext_engine.sh"
        ) from error

    def build_mesh(config: Any, devices: Sequence[Any]) -> jax.sharding.Mesh:
        return jax.sharding.Mesh(
            maxtext_utils.create_device_mesh(config, devices), config.mesh_axes
        )

    return MaxTextApi(
        engine_type=maxtext_engine.MaxTextTrainingEngine,
        payload_type=abstract_engine.RLTrainerPayload,
        gen_model_input_fn=maxtext_engine.router_replay_gen_model_input_fn,
        make_loss_fn=maxtext_engine.make_router_replay_loss_fn,
        model_config=maxtext_config.shipped_model_config,
        build_config=_build_config,
        build_mesh=build_mesh,
        input_spec=lambda config, mesh: tuple(sharding.get_input_data_sharding(config, mesh).spec),
        tunix_adapter_wraps=lambda name: name in HF_MODEL_CONFIGS,
        version=maxtext_config.installed_version(),
        abstract_engine_type=maxtext_engine_compile.AbstractMaxTextEngine,
        state_avals=_nnx_state_avals,
        xla_options=lambda config: max_utils.parse_libtpu_flags_to_dict(config.compile_xla_flags),
        train_state=_nnx_train_state,
        set_train_state=_set_nnx_train_state,
        release_state=_release_nnx_state,
        shapes_engine_type=_shapes_engine_type(
            maxtext_engine.MaxTextTrainingEngine, maxtext_engine_compile.AbstractMaxTextEngine
        ),
    )


def _nnx_state_avals(engine: Any) -> tuple[Any, Any]:
    """An NNX MaxText engine's parameters and optimizer state as its programs take them (read
    through its public `model` and `optimizer`): each leaf a ShapeDtypeStruct on the sharding
    MaxText commits it to before it compiles (its `_mesh_sharding`: a leaf off its mesh, such
    as the optimizer's step count allocated under no mesh, goes replicated onto it)."""
    from flax import nnx  # MaxText's dependency: absent where MaxText is

    def as_taken(leaf: Any) -> Any:
        if not hasattr(leaf, "shape"):
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=engine._mesh_sharding(leaf))

    return jax.tree.map(as_taken, (nnx.state(engine.model, nnx.Param), nnx.state(engine.optimizer)))


def _nnx_train_state(engine: Any) -> Any:
    """An NNX MaxText engine's train state (model and optimizer), read through its public `state`."""
    from flax import nnx  # MaxText's dependency: absent where MaxText is

    return nnx.state(engine.state)


def _set_nnx_train_state(engine: Any, state: Any) -> None:
    """The engine's NNX train state set to `state` through its public `state`, then its cached
    pure copy of it re-read: MaxText keeps that cache across steps and offers no public way to
    refresh it short of its setters, which drop the compiled kernels (so the next step would
    compile), hence the one private call `_refresh_pure_state`."""
    from flax import nnx  # MaxText's dependency: absent where MaxText is

    nnx.update(engine.state, state)
    engine._refresh_pure_state()


def _release_nnx_state(engine: Any) -> None:
    """Every variable of the engine's NNX train state set to its shape, then its cached pure copy
    re-read (`_refresh_pure_state`, as in `_set_nnx_train_state`): neither keeps an array alive.
    Without this the engine that gave its state away keeps its variables and its cache pointing
    at the arrays it handed over; the taker's `update` donates only what aliases an output, so
    the rest (a parameter-sized tree on the CPU) outlives the step that replaced it."""
    from flax import nnx  # MaxText's dependency: absent where MaxText is

    nnx.update(engine.state, jax.tree.map(_shape_of, nnx.state(engine.state)))
    engine._refresh_pure_state()


def _shape_of(leaf: Any) -> Any:
    if not isinstance(leaf, jax.Array):
        return leaf
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def _shapes_engine_type(engine_type: type, abstract_type: type) -> type:
    """`engine_type` with its model and train state built as `abstract_type` (MaxText's
    AbstractMaxTextEngine) builds them, traced rather than allocated, and everything else,
    running included, as `engine_type`'s: an engine built to take another's state never holds
    a state of its own, so building it adds no state to the device. Wrapped in Tunix's adapter
    when asked, as `from_pretrained` wraps the model it loads."""

    def build_model(self: Any, wrap_with_tunix_adapter: bool, tokenizer_pad_id: int | None) -> Any:
        model = abstract_type._build_model(self, False, None)
        if not wrap_with_tunix_adapter:
            return model
        from maxtext.integration.tunix.tunix_adapter import (
            TunixMaxTextAdapter,
        )  # the trainer image's MaxText: optional

        with self._mesh:
            wrapped = TunixMaxTextAdapter(
                base_model=model,
                use_no_op_mappings="maxtext_config" in self._config.vllm_additional_config,
                pad_id=tokenizer_pad_id,
            )
        wrapped.config = None
        return wrapped

    return type(
        f"ShapesBuilt{engine_type.__name__}",
        (engine_type,),
        {
            "_build_model": build_model,
            "_build_optimizer": abstract_type._build_optimizer,
            "_trace_train_state": abstract_type._trace_train_state,
        },
    )


def _build_config(words: Sequence[str]) -> Any:
    """MaxText's config (`maxtext_config.build_config`); a refusal is the engine's one line."""
    try:
        return maxtext_config.build_config(words)
    except maxtext_config.MaxTextRefused as error:
        raise ContractError(f"{maxtext_config.REFUSED_PREFIX}{error}") from error


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


def _text(value: Any) -> str:
    """A MaxText config value as its config file spells it (its choices are string enums)."""
    return str(getattr(value, "value", value))


def host_keys(config: EngineConfig) -> dict[str, Any]:
    """MaxText keys this host's platform needs (`maxtext_keys.platform_keys`), said in `info()`."""
    return maxtext_keys.platform_keys(config, jax.default_backend())


class MaxTextEngine:
    """MaxText's `MaxTextTrainingEngine` as a bench engine: `MaxTextEngine(engine_config)`.

    `load_api` and `load_tunix` say where MaxText and Tunix come from; a subclass may point them
    at stand-ins. `calls` is what the bench's compile/fwd_bwd/update/get_metrics go through:
    Tunix's TrainerWorker around `engine`, or `engine` itself (`tunix_grpo.choose`).
    """

    load_api: Callable[[], MaxTextApi] = staticmethod(load_maxtext)
    load_tunix: Callable[[], tunix_grpo.TunixApi] = staticmethod(tunix_grpo.load_tunix)

    def __init__(self, config: EngineConfig, family: StateFamily | None = None):
        """`family`: the engines whose training state this one trains (`share_state` passes it);
        MaxText's engine is then built with its state as shapes, and takes the family's arrays
        (`take_shared_state`) instead of allocating its own."""
        self.config = config
        self.api = type(self).load_api()
        self._family = StateFamily(self) if family is None else family
        self._engine_type = self.api.engine_type if family is None else self.api.shapes_engine_type
        # MaxText's Gated DeltaNet hangs in jaxlib's CPU LAPACK solve; see cpu_lowerings.
        self.host_lowerings = (
            cpu_lowerings.use_xla_triangular_solve() if jax.default_backend() == "cpu" else "-"
        )
        self.output_dir = config.output_dir or self._own_folder()
        self.args = maxtext_aot.maxtext_args(
            self.api, config, self.output_dir, jax.default_backend()
        )
        self.maxtext_config = self.api.build_config(self.args.words)
        try:
            self.mesh = self.api.build_mesh(self.maxtext_config, jax.devices())
        except (AssertionError, ValueError) as error:  # MaxText asserts its axes cover the devices
            raise ContractError(
                f"MaxText cannot lay out its mesh ({' '.join(str(error).split())}): make mesh_fsdp"
                f" x mesh_context x mesh_expert equal the {jax.device_count()} devices"
            ) from error
        maxtext_aot.refuse_unsplit_batch(self.api, self.config, self.maxtext_config, self.mesh)
        self._payload_type = maxtext_payload.replay_payload_type(self.api.payload_type)
        self.tunix, self.driver_reason = tunix_grpo.choose(
            config.maxtext_driver, type(self).load_tunix
        )
        # Tunix's driver hands Tunix the model in MaxText's TunixMaxTextAdapter where it can wrap
        # it, which moves the state one level down (`state_layout`).
        self.wrapped = self.tunix is not None and self.api.tunix_adapter_wraps(
            self.maxtext_config.model_name
        )
        # Tunix's loss returns no overflow flags: drops are MaxText's to count on its own path only.
        self._dropless_fallback = None if self.tunix else self.maxtext_config.moe_dropless_fallback
        self.engine, self.calls = self._driven_by_tunix() if self.tunix else self._driven_here()
        self._converted: collections.OrderedDict[int, _Converted] = collections.OrderedDict()
        self._batch_shardings: Mapping[str, Any] | None = None
        self._compiled = False
        self._staged: list[PreparedMaxTextInput] = []
        self._tokens = 0

    def _own_folder(self) -> str:
        """A folder for MaxText's files when the caller gave none (an engine built outside the
        driver, which gives one inside RESULTS_DIR): removed with the engine, or at exit, so
        nothing is left behind in the temporary folder."""
        folder = tempfile.mkdtemp(prefix="rl-trainer-bench-maxtext-")
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        return folder

    # -- the contract --------------------------------------------------------------------------

    @property
    def train_step(self) -> int:
        return self.engine.train_step

    def compile(self, example: Payload) -> dict[str, float]:
        """Compile MaxText's kernels for micro-batches shaped like `example`; seconds per program.

        MaxText compiles against the arrays it holds (it first commits each leaf to its mesh),
        so an engine of a `share_state` family takes the family's state before it compiles.
        """
        self.take_shared_state()
        times = _CompileTimes()
        with times.installed():
            self.calls.compile(_ShapesOf(self._convert(example).payload))
        self._batch_shardings = self._fwd_bwd_batch_shardings()
        self._compiled = True
        return times.per_program()

    def fwd_bwd(self, batch: Payload | PreparedInput) -> None:
        self._family.check_holds(self)
        if isinstance(batch, PreparedMaxTextInput):
            self._tokens += batch.tokens
            self.calls.fwd_bwd(batch)
            return
        converted = self._convert(batch)
        self._tokens += converted.tokens
        self.calls.fwd_bwd(converted.payload)

    def update(self) -> int:
        return self.calls.update()

    def get_metrics(self, clear_cache: bool = True) -> dict[str, Any]:
        """The last step's metrics on the host under the ruler's keys ({} before the first)."""
        # Tunix's worker clears what it returns; a look that keeps the buffer asks the engine.
        buffer = self.calls.get_metrics() if clear_cache else self.engine.get_metrics(False)
        out = maxtext_metrics.step_metrics(buffer, self._tokens, self._dropless_fallback)
        if out and clear_cache:
            self._tokens = 0
        return out

    # -- one state for several engines ---------------------------------------------------------

    def share_state(self, config: EngineConfig) -> MaxTextEngine:
        """An adapter over another MaxText engine, built for `config`, training this one's state.

        The new MaxText engine is built with its weights and Adam moments as shapes (nothing
        allocated, `shapes_engine_type`); they are compared with the holder's leaf for leaf
        (shape, dtype, sharding: StateMismatch naming the first difference), then the new
        engine takes the holder's arrays, before anything compiles: one state on the device
        throughout. The two are compared in the Transformer's layout (`state_layout`): an engine
        driven by Tunix holds the same state one level down, in Tunix's model adapter.
        """
        sibling = type(self)(config, family=self._family)
        holder = self._family.holder
        difference = first_difference(
            state_layout.model_layout(self.api.state_avals(holder.engine), holder.wrapped),
            state_layout.model_layout(sibling.api.state_avals(sibling.engine), sibling.wrapped),
        )
        if difference is not None:
            raise StateMismatch(difference)
        sibling.take_shared_state()
        return sibling

    def take_shared_state(self) -> None:
        """Take the training state from the engine of the family that stepped last, which then
        holds none of it (`release_state`): only the engine that steps holds the arrays."""
        holder = self._family.holder
        if holder is not self:
            state = state_layout.moved(
                self.api.train_state(holder.engine),
                holder.wrapped,
                self.api.train_state(self.engine),
                self.wrapped,
            )
            self.api.set_train_state(self.engine, state)
            self.engine.train_step = holder.engine.train_step
            self.api.release_state(holder.engine)
            self._family.holder = self

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
        batch = self._input_fn(converted.payload)
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

    def model_flops(self, payload: Payload) -> float:
        """Model FLOPs of one micro-batch, the built-in engine's count (docs/engine.md): real
        tokens only, of the model the engine config describes. The adapter's keys hand MaxText
        every model field that the count reads (those it leaves out, attention_chunk_size,
        linear_chunk_inverse and linear_chunk_kernel, say how the work is done, not what is
        computed), so one count serves
        both engines and the step ruler's MFU compares their tokens per second on one scale."""
        return flops.micro_batch_flops(self.config, payload.segment_ids, count_remat=False)

    def wait_for_device(self) -> float:
        """Block until the staged copies and the step's dispatched programs are done; seconds."""
        start = time.perf_counter()
        outputs = self.engine.get_metrics(clear_cache=False)
        jax.block_until_ready(([p.batch for p in self._staged], outputs.weighted_metrics))
        self._staged.clear()
        return time.perf_counter() - start

    def info(self) -> dict[str, Any]:
        """What runs, and what of the engine config and the trainer's keys MaxText does not see."""
        args, mesh = self.args, self.mesh
        return {
            "engine": f"maxtext.MaxTextTrainingEngine {self.api.version}",
            "model": f"{args.model.name}(decoder={_text(self.maxtext_config.decoder_block)})",
            "mesh": ",".join(f"{axis}={size}" for axis, size in mesh.shape.items() if size > 1)
            or "one device",
            **self._driver_info(),
            "not_measured": ",".join(maxtext_metrics.not_measured(self._dropless_fallback)),
            "not_taken": ",".join(
                field
                for field in maxtext_keys.not_taken(self.config)
                if not (self.tunix and field in self._taken_loss_fields())
            ),
            "host_keys": " ".join(
                maxtext_keys.word(k, v) for k, v in host_keys(self.config).items()
            )
            or "-",
            "host_lowerings": self.host_lowerings,
            "interpreted_kernels": self._interpreted_kernels(),
            "trainer_keys_replacing": " ".join(args.replaced) or "-",
            "trainer_keys_held": " ".join(args.held) or "-",
            "output_dir": self.output_dir,
            "devices": int(mesh.devices.size),
        }

    # -- internals -----------------------------------------------------------------------------

    def _driven_here(self) -> tuple[Any, Any]:
        """MaxText's engine with its router-replay loss, called by the adapter itself."""
        self._input_fn = self.api.gen_model_input_fn
        engine = maxtext_payload.with_router_replay(
            self._engine_type(self.maxtext_config, mesh=self.mesh),
            self.api,
            self.maxtext_config,
            input_fn=self._model_input,
        )
        return engine, engine

    def _driven_by_tunix(self) -> tuple[Any, Any]:
        """MaxText's engine inside Tunix's TrainerWorker with Tunix's GRPO loss, set as Tunix's
        distributed GRPO sets it (`with_loss_fn(loss, has_aux=True)`, the input hook); the model
        in MaxText's TunixMaxTextAdapter where MaxText can wrap it."""
        self._input_fn = tunix_grpo.model_input(
            tunix_grpo.grpo_config(self.tunix, self.config.loss)
        )
        engine = self._engine_type(
            self.maxtext_config,
            mesh=self.mesh,
            wrap_with_tunix_adapter=self.wrapped,
            tokenizer_pad_id=tunix_grpo.PAD_ID if self.wrapped else None,
        )
        split = maxtext_head.head_split(engine.model, self.wrapped)
        self._chunked = tunix_grpo.chunked_pass(split, self.config.loss.compute_logps_chunk_size)
        worker = self.tunix.worker_type(lambda: engine, worker_id="rl-trainer-bench")
        loss = tunix_grpo.grpo_loss(self.tunix, self.wrapped, split.kind, self._chunked)
        worker.with_loss_fn(loss, has_aux=True)
        worker.with_gen_model_input_fn(self._model_input)
        return engine, worker

    def _driver_info(self) -> dict[str, str]:
        """What drives MaxText's engine with which loss, and why (`info()`)."""
        if self.tunix is None:
            return {
                "driver": f"the adapter's own calls ({self.driver_reason})",
                "loss": "maxtext router-replay cross-entropy",
                "chunked_logps": f"not applied: {OWN_LOSS_LOGITS}",
            }
        return {
            "driver": f"tunix TrainerWorker ({self.driver_reason})",
            "loss": f"tunix algo_core.grpo_loss_fn ({tunix_grpo.LOSS_AGG_MODE}, routes replayed)",
            "model_call": "MaxText's TunixMaxTextAdapter"
            if self.wrapped
            else f"MaxText's Transformer through the bench's Tunix call (TunixMaxTextAdapter"
            f" needs an HF config, which MaxText's {self.maxtext_config.model_name!r} model lacks)",
            "chunked_logps": self._chunked.describe(),
            "logps_sharded_head": tunix_grpo.sharded_head(self._chunked),
        }

    def _taken_loss_fields(self) -> tuple[str, ...]:
        """The engine config's loss fields Tunix's loss takes here: its GRPO config's, and the
        chunk of its log-prob pass where that pass runs."""
        chunk = ("loss.compute_logps_chunk_size",) if self._chunked.chunk_size else ()
        return (*tunix_grpo.TAKEN_LOSS_FIELDS, *chunk)

    def _interpreted_kernels(self) -> str:
        """The Pallas kernels MaxText will interpret on this host, said because they dominate the
        step (`maxtext_keys.platform_keys`); '-' on a TPU or when none runs."""
        hyper = self.maxtext_config
        if jax.default_backend() == "tpu" or not (hyper.sparse_matmul and hyper.megablox):
            return "-"
        return "megablox grouped matmul (off a TPU MaxText interprets it: it dominates the step)"

    def _model_input(self, payload: Any) -> dict[str, Any]:
        """The engine's input hook: a staged micro-batch is already mapped and placed; the compile
        example is mapped to shapes only, so MaxText lowers against its own input shardings (an
        eagerly mapped array carries a single-device sharding that MaxText's lowering would
        keep and then find at odds with its sharded inputs)."""
        if isinstance(payload, PreparedMaxTextInput):
            return payload.batch
        if isinstance(payload, _ShapesOf):
            return jax.tree.map(
                lambda value: (
                    jax.ShapeDtypeStruct(value.shape, value.dtype)
                    if hasattr(value, "shape")
                    else value
                ),
                self._input_fn(payload.payload),
            )
        return self._input_fn(payload)

    def _convert(self, payload: Payload) -> _Converted:
        key = id(payload.input_ids)
        cached = self._converted.get(key)
        if cached is not None and cached.source is payload.input_ids:
            self._converted.move_to_end(key)
            return cached
        converted = _Converted(
            source=payload.input_ids,
            payload=tunix_grpo.to_train_example(payload, self.tunix)
            if self.tunix
            else maxtext_payload.to_maxtext_payload(payload, self._payload_type),
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


# The AOT functions (contract.AotEngineModule) over the installed MaxText: `aot` finds them in the
# module of the engine class it is given.
_AOT = maxtext_aot.MaxTextAot(load_maxtext)
lower_programs, abstract_state, payload_spec, compiler_options, trainer_keys_refused = (
    _AOT.functions()
)
BESIDE = maxtext_aot.BESIDE
