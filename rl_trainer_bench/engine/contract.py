"""The engine contract: what the bench's driver may call on a trainer engine, and nothing more.

It mirrors the public shape of MaxText's training engine (`compile`, `fwd_bwd`, `update`,
`get_metrics`, `train_step`) so another engine plugs in through a thin adapter. The two methods
STAGE_BEFORE_UPDATE needs, and the ones the step ruler uses for its device timeline, are optional:
callers probe them with `missing_methods`, never assume them.

The Payload lives here, not in `payload.py`, because the engine consumes it and `engine/` imports
nothing from the rest of the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
}
OPTIONAL_PAYLOAD_FIELDS = frozenset({"ref_logps", "routed_experts"})

# Engine methods STAGE_BEFORE_UPDATE needs; probed, never assumed.
STAGING_METHODS = ("prepare_fwd_bwd_input", "wait_for_device")
# Engine methods the step ruler's device timeline and bit-identity checks use when present.
TIMELINE_METHODS = ("completion_marker",)


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


@runtime_checkable
class Engine(Protocol):
    """The calls the driver makes. Optional methods: STAGING_METHODS and TIMELINE_METHODS."""

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


def missing_methods(engine: object, names: tuple[str, ...]) -> list[str]:
    """The methods among `names` that `engine` lacks (optional methods are probed, not assumed)."""
    return [name for name in names if not callable(getattr(engine, name, None))]


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
    `payload.py`; this one only has to be valid.
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


def check_engine(engine: object, payloads: list[Payload]) -> list[str]:
    """Run the contract on `engine` with two or more same-shaped micro-batches; the failures found.

    Checks: the required methods exist; compile returns seconds per program; fwd_bwd returns None
    and leaves train_step alone; update returns train_step + 1; get_metrics carries METRIC_KEYS
    with finite numbers; and, where the engine has the staging methods, a prepared micro-batch
    trains exactly like the plain one (same metrics; same parameters where the engine exposes a
    parameter digest, compared against a second engine is the caller's business).
    """
    failures: list[str] = []
    required = ("compile", "fwd_bwd", "update", "get_metrics")
    missing = missing_methods(engine, required)
    if missing or not hasattr(engine, "train_step"):
        return [f"missing required methods: {', '.join(missing or ['train_step'])}"]
    compiled = engine.compile(payloads[0])
    if not isinstance(compiled, Mapping) or not all(
        isinstance(k, str) and isinstance(v, float) for k, v in compiled.items()
    ):
        failures.append(f"compile must return {{program: seconds}}, got {compiled!r}")
    start = engine.train_step
    for payload in payloads:
        if engine.fwd_bwd(payload) is not None:
            failures.append("fwd_bwd must return None")
    if engine.train_step != start:
        failures.append(f"train_step moved in fwd_bwd: {start} -> {engine.train_step}")
    new_step = engine.update()
    if new_step != start + 1 or engine.train_step != start + 1:
        failures.append(f"update must return train_step + 1 = {start + 1}, got {new_step}")
    metrics = engine.get_metrics()
    failures += _metric_failures(metrics)
    if not missing_methods(engine, STAGING_METHODS):
        prepared = engine.prepare_fwd_bwd_input(payloads[0])
        if not isinstance(prepared, PreparedInput):
            failures.append("prepare_fwd_bwd_input must return a PreparedInput (name, digests)")
        engine.fwd_bwd(prepared)
        for payload in payloads[1:]:
            engine.fwd_bwd(payload)
        waited = engine.wait_for_device()
        if not isinstance(waited, float) or waited < 0:
            failures.append(f"wait_for_device must return seconds >= 0, got {waited!r}")
        engine.update()
        staged = engine.get_metrics()
        failures += _metric_failures(staged)
        if not failures and staged["loss_denominator"] != metrics["loss_denominator"]:
            failures.append(
                "a prepared micro-batch trained different tokens: loss_denominator "
                f"{staged['loss_denominator']} != {metrics['loss_denominator']}"
            )
    return failures


def _metric_failures(metrics: Mapping[str, Any]) -> list[str]:
    missing = [k for k in METRIC_KEYS if k not in metrics]
    if missing:
        return [f"get_metrics lacks {', '.join(missing)}"]
    bad = [
        k
        for k in METRIC_KEYS
        if not (metrics[k] is None and k in MAY_BE_UNMEASURED)
        and not np.isfinite(float(metrics[k]))
    ]
    return [f"get_metrics has non-finite {', '.join(bad)}"] if bad else []
