"""The engine contract, whole: what the bench may call on a trainer engine and on its module.

An engine author reads this file only. Four parts:

- `CONSTRUCTOR`: how the bench builds an engine, `Class(config)` with the `EngineConfig`; every
  command that builds one (`run`, `ab`, `check-engine`, the pod) checks the class against it
  before building (`constructor_problem`).
- `Engine`: the calls every engine answers. It mirrors the public shape of MaxText's training
  engine (`compile`, `fwd_bwd`, `update`, `get_metrics`, `train_step`) so another engine plugs in
  through a thin adapter.
- `OPTIONAL_METHODS`: the methods an engine may have, each with what it is for. Callers ask
  `optional(engine, name)` (or `missing_methods` for a set of them), never assume one.
- `AotEngineModule`: what the module of an engine needs for the AOT check to lower its programs
  from abstract inputs without building the engine; `AOT_OPTIONAL` what it may add, read with
  `aot_optional(module, name)`.

The Payload lives here, not in `payload/`, because the engine consumes it and `engine/` imports
nothing from the rest of the package.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from rl_trainer_bench.engine.config import EngineConfig

# Every array of a micro-batch, its dtype, and its rank; `ref_logps` and `routed_experts` are optional.
PAYLOAD_FIELDS: Mapping[str, tuple[np.dtype, int]] = {
    "input_ids": (np.dtype(np.int32), 2),
    "segment_ids": (np.dtype(np.int32), 2),
    "positions": (np.dtype(np.int32), 2),
    "completion_mask": (np.dtype(np.int32), 2),
    "advantages": (np.dtype(np.float32), 2),
    "old_logps": (np.dtype(np.float32), 2),
    "ref_logps": (np.dtype(np.float32), 2),
    "routed_experts": (np.dtype(np.int16), 4),
    "extra_host_bytes": (np.dtype(np.uint8), 3),
}
OPTIONAL_PAYLOAD_FIELDS = frozenset({"ref_logps", "routed_experts", "extra_host_bytes"})

# The methods every engine has; with the `train_step` counter, the whole required contract.
REQUIRED_METHODS = ("compile", "fwd_bwd", "update", "get_metrics")
# The methods an engine may have, and what the bench does with each; `optional` reads them.
OPTIONAL_METHODS: Mapping[str, str] = {
    "prepare_fwd_bwd_input": "prepare_fwd_bwd_input(payload) -> PreparedInput: start the "
    "micro-batch's host-to-device copy and return at once; `fwd_bwd` takes the result "
    "(STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE need it)",
    "wait_for_device": "wait_for_device() -> seconds: block until every started copy and "
    "dispatched program is done (the staging pair's second half)",
    "copy_input": "copy_input(payload) -> arrays: the micro-batch copied to the devices as "
    "`fwd_bwd` copies an unstaged input, returned once issued; the bench times it, waited for, "
    "after the compile: the copy the first fwd_bwd after an unstaged boundary waits for "
    "(bench/host_link.py; without it the bench times a plain `device_put` of the arrays)",
    "will_run": "will_run(payloads) -> None: before `compile`, every micro-batch the run will "
    "feed; the engine may compile what only some micro-batches need only if one of these does "
    "(the built-in engine's dropless replay, when a micro-batch's replayed routes drop pairs, "
    "counted while its other programs compile), so no step compiles it",
    "completion_marker": "completion_marker() -> array: an array ready when the last dispatched "
    "program is done; the step ruler's device timeline stamps it",
    "parameter_digest": "parameter_digest() -> str: a digest of the weights, equal when they are "
    "bit-identical; logged at the end of an arm so two runs compare. An A/B calls it after every "
    "turn, so keep the weights on the device (the built-in engine's reads back two words an "
    "array: engine/device_digest.py)",
    "model_flops": "model_flops(payload) -> float: model FLOPs of one fwd_bwd on the payload; "
    "the step ruler's TFLOP/s and MFU",
    "info": "info() -> mapping: what the engine wants the log to say about itself",
    "program_memory": "program_memory() -> {program: {argument, output, alias, temp, code, "
    "beside, peak, and temp_block where read}}: each compiled program's device bytes as XLA gives "
    "them, its HBM temporary block where read (engine/temp_block.py) and the state the engine "
    "keeps beside it; MEASURE_PEAK=on prints their sum (aot's peak) beside the measured one",
    "share_state": "share_state(config) -> Engine: an engine that runs `config`'s programs on "
    "this engine's training state (parameters, gradient sum, optimizer state), holding none of "
    "its own; raises StateMismatch, naming the first part that differs, when `config`'s state "
    "differs in a shape, dtype or sharding. A same-process A/B's arms then hold one state",
    "take_shared_state": "take_shared_state() -> None: the bench calls it, off the clock, before "
    "an engine of a `share_state` family runs steps: the engine takes the state the family's last "
    "stepped engine left, so its next step starts from there, and that engine then holds no "
    "reference to any of the state's arrays (only the engine that steps keeps them alive; "
    "check-engine counts the bytes). An engine with share_state has it",
}
# Engine methods STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE need.
STAGING_METHODS = ("prepare_fwd_bwd_input", "wait_for_device")


@dataclasses.dataclass(frozen=True)
class Payload:
    """One micro-batch on the host: B packed rows of T tokens (numpy arrays, contract dtypes).

    `name` identifies the micro-batch in logs (`bench_<step>_<index>`); `digests` maps each array's
    name to a content digest computed once when the micro-batch was built, so on/off comparisons
    cost nothing in the timed loop.

    `completion_mask` is input-aligned, the one definition every module uses: it is 1 at position
    t when token t+1 is a completion token of the same sequence, because the log-prob at t scores
    token t+1. It runs from the prompt's last token to the sequence's second-to-last token, and is
    0 on a sequence's last token (no target). A mask that is 1 on the completion tokens themselves
    (target-aligned) must be shifted left by one position before it is handed over; `check`
    refuses one that is 1 on a sequence's last token. `old_logps` and `ref_logps` are read only
    where the mask is 1: whatever they hold elsewhere (0, -inf) never reaches the loss.
    """

    input_ids: np.ndarray  # [B, T] int32
    segment_ids: np.ndarray  # [B, T] int32, 0 = padding
    positions: np.ndarray  # [B, T] int32, restart at 0 in each segment
    completion_mask: np.ndarray  # [B, T] int32, input-aligned: 1 where token t+1 is a completion
    advantages: np.ndarray  # [B, T] float32, per sequence, broadcast to its tokens
    old_logps: np.ndarray  # [B, T] float32
    ref_logps: np.ndarray | None = None  # [B, T] float32
    routed_experts: np.ndarray | None = None  # [B, T, L, K] int16, -1 on padding
    # [B, T, k] uint8: `extra_host_bytes`' filler, copied with the micro-batch and read by the
    # programs into a returned sum, never into the loss (engine/payload_shapes.py)
    extra_host_bytes: np.ndarray | None = None
    name: str = "micro_batch"
    digests: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """The present arrays by contract name (optional ones omitted when absent)."""
        out = {}
        for field in PAYLOAD_FIELDS:
            value = getattr(self, field)
            if value is not None:
                out[field] = value
        return out

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T): rows and tokens per row."""
        return tuple(self.input_ids.shape)

    @property
    def nbytes(self) -> int:
        """Host bytes of all present arrays: what a host-to-device copy of this micro-batch moves."""
        return sum(a.nbytes for a in self.arrays().values())


@runtime_checkable
class PreparedInput(Protocol):
    """A micro-batch whose host-to-device copy has been started by `prepare_fwd_bwd_input`.

    Engine-defined; the driver only reads `name` and `digests` (to log and check what was staged)
    and passes the object back to `fwd_bwd`.
    """

    name: str
    digests: Mapping[str, str]


class ContractError(ValueError):
    """A payload or engine that breaks the contract; the message names the field and the fix."""


class StateMismatch(ContractError):
    """`share_state(config)` refused: `config`'s training state is not the one the engine holds
    (the message names the first part that differs, and how)."""


# How the bench builds an engine: the class the ENGINE knob names, called with the EngineConfig
# as its one positional argument (more parameters are fine when they have defaults).
CONSTRUCTOR = "def __init__(self, config)"


def constructor_problem(engine_type: type) -> str | None:
    """Why `engine_type(config)` cannot be called as the bench calls it, or None.

    Checked before the engine is built (and before JAX starts), so a class whose `__init__` takes
    no config, or more than one required argument, is named as the author's to fix instead of
    failing inside the bench's call with a TypeError that names neither.
    """
    try:
        signature = inspect.signature(engine_type)
    except (TypeError, ValueError):  # no signature to read (a type written in C): the call tells
        return None
    try:
        signature.bind(object())
    except TypeError as error:
        return f"{engine_type.__name__}{signature} cannot be called with one config ({error})"
    return None


@runtime_checkable
class Engine(Protocol):
    """The calls the driver makes on every engine; the optional ones are in OPTIONAL_METHODS."""

    @property
    def train_step(self) -> int:
        """Number of optimizer updates applied so far; moves only in `update`."""
        ...

    def compile(self, example: Payload) -> Mapping[str, float]:
        """Compile every program for micro-batches shaped like `example`; returns seconds per program."""
        ...

    def fwd_bwd(self, batch: Payload | PreparedInput) -> None:
        """Dispatch forward and backward of one micro-batch and accumulate its gradient."""
        ...

    def update(self) -> int:
        """Apply the step's accumulated gradient; return the new train step."""
        ...

    def get_metrics(self, clear_cache: bool = True) -> Mapping[str, Any]:
        """Host values of the last step: loss, grad_norm, loss_denominator, overflow and replay counts."""
        ...


def missing_requirements(engine: object) -> list[str]:
    """What `engine` lacks of the contract's required methods and its `train_step` counter."""
    missing = missing_methods(engine, REQUIRED_METHODS)
    return missing if hasattr(engine, "train_step") else [*missing, "train_step"]


def missing_methods(engine: object, names: tuple[str, ...]) -> list[str]:
    """The methods among `names` that `engine` lacks (optional methods are probed, not assumed)."""
    return [name for name in names if not callable(getattr(engine, name, None))]


def optional(engine: object, name: str) -> Callable[..., Any] | None:
    """The engine's optional method `name` (a key of OPTIONAL_METHODS), or None when it has none.

    Asking for a name that is not in the table is a bug in the caller, not an engine without it.
    """
    if name not in OPTIONAL_METHODS:
        raise KeyError(f"{name!r} is not an optional engine method: {', '.join(OPTIONAL_METHODS)}")
    method = getattr(engine, name, None)
    return method if callable(method) else None


# ----------------------------------------------------------------------------------------------
# The engine's module: lowering ahead of time, without building the engine
# ----------------------------------------------------------------------------------------------


class AotEngineModule(Protocol):
    """What `aot` needs in the module of an engine to compile its programs without building it
    (building would allocate the weights). The built-in engine's module (`jax_engine`) has it.

    `config` is the EngineConfig, `mesh` the jax Mesh the programs are compiled for.
    """

    def lower_programs(self, config: EngineConfig, mesh: Any) -> Mapping[str, Any]:
        """Every program lowered from abstract inputs: {name: jax Lowered}, in compile order."""
        ...

    def abstract_state(self, config: EngineConfig, mesh: Any) -> Mapping[str, Any]:
        """The training state as `jax.ShapeDtypeStruct`s with their shardings (nothing allocated)."""
        ...

    def payload_spec(self, config: EngineConfig) -> Mapping[str, Any]:
        """One micro-batch as `jax.ShapeDtypeStruct`s by contract array name."""
        ...


# The functions AotEngineModule requires.
AOT_FUNCTIONS = ("lower_programs", "abstract_state", "payload_spec")
# What an engine's module may add for `aot`, and what each changes; `aot_optional` reads them.
AOT_OPTIONAL: Mapping[str, str] = {
    "compile_reservations": "compile_reservations(config, mesh) -> {program: bytes}: the device "
    "bytes the state beside each program holds, which the engine tells XLA to leave free when it "
    "compiles; aot compiles with the same options, so it checks the programs the pod runs",
    "BESIDE": "BESIDE: {program: residency.STATE_PARTS in device memory beside it}; required when "
    "the programs are not named as the built-in engine's (fwd_bwd, fwd_bwd_dropless, update)",
    "compiler_options": "compiler_options(config, mesh) -> {program: XLA options}: the options "
    "the engine compiles each program with, when they are not the built-in engine's reservations "
    "(compile_reservations is then not read)",
    "trainer_keys_refused": "trainer_keys_refused(config, platform) -> {key=value: why}: the "
    "trainer's engine keys (EngineConfig.trainer_maxtext_keys) this engine refuses; aot compiles "
    "without them and its report lists them",
}


def aot_optional(module: object, name: str) -> Any:
    """The module's optional AOT entry `name` (a key of AOT_OPTIONAL), or None when it has none."""
    if name not in AOT_OPTIONAL:
        raise KeyError(f"{name!r} is not an optional AOT entry: {', '.join(AOT_OPTIONAL)}")
    return getattr(module, name, None)


# ----------------------------------------------------------------------------------------------
# Conformance: what any engine must do, checked on the smallest valid micro-batches
# ----------------------------------------------------------------------------------------------

METRIC_KEYS = (
    "loss",
    "grad_norm",
    "loss_denominator",
    "overflow_count",
    "replay_count",
    "mult_prob_error_max",
    "tokens",
)
# MoE counters an engine may not measure: it reports None for them (shown as "-"), never a 0 it
# did not count.
MAY_BE_UNMEASURED = ("overflow_count", "replay_count", "mult_prob_error_max")


def example_payload(
    rows: int,
    seq_len: int,
    vocab_size: int,
    *,
    num_layers: int = 0,
    top_k: int = 0,
    num_experts: int = 0,
    segment_len: int = 0,
    seed: int = 0,
    name: str = "example",
) -> Payload:
    """A valid micro-batch of random tokens packed in equal segments, for checks and tests.

    Each segment is a prompt half and a completion half; the row's tail past the last whole
    segment is padding. With `num_layers`, `top_k` and `num_experts` it carries uniformly random
    replay routes (distinct experts per token, -1 on padding). Realistic payloads come from
    `payload/build.py`; this one only has to be valid.
    """
    rng = np.random.default_rng(seed)
    segment_len = segment_len or max(2, seq_len // 2)
    segments_per_row = seq_len // segment_len
    index = np.arange(seq_len)
    segment = np.where(index < segments_per_row * segment_len, index // segment_len + 1, 0)
    segment_ids = np.broadcast_to(segment, (rows, seq_len)).astype(np.int32)
    positions = np.where(segment_ids != 0, index % segment_len, 0).astype(np.int32)
    completion = (
        (positions >= segment_len // 2) & (positions < segment_len - 1) & (segment_ids != 0)
    )
    advantages = rng.standard_normal((rows, segments_per_row + 1)).astype(np.float32)
    routed = None
    if num_layers:
        scores = rng.random((rows, seq_len, num_layers, num_experts))
        routed = np.argsort(scores, axis=-1)[..., :top_k].astype(np.int16)
        routed[segment_ids == 0] = -1
    return Payload(
        input_ids=rng.integers(0, vocab_size, (rows, seq_len), dtype=np.int32),
        segment_ids=np.ascontiguousarray(segment_ids),
        positions=positions,
        completion_mask=completion.astype(np.int32),
        advantages=np.take_along_axis(advantages, segment_ids, axis=1) * (segment_ids != 0),
        old_logps=(-rng.random((rows, seq_len)) * 8).astype(np.float32),
        routed_experts=routed,
        name=name,
        digests={"seed": str(seed)},
    )


def example_payloads_for(
    config: EngineConfig, count: int, *, segment_len: int = 0, prefix: str = "example"
) -> list[Payload]:
    """`count` distinct example micro-batches shaped for `config` (routes when it replays them)."""
    m = config.model
    return [
        example_payload(
            config.micro_batch_rows,
            config.seq_len,
            m.vocab_size,
            num_layers=m.num_layers if config.moe.router_replay else 0,
            top_k=m.top_k,
            num_experts=m.num_experts,
            segment_len=segment_len,
            seed=seed,
            name=f"{prefix}_{seed}",
        )
        for seed in range(count)
    ]
