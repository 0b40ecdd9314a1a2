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
from typing import Any, Protocol, runtime_checkable

import numpy as np

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
    """

    input_ids: np.ndarray  # [B, T] int32
    segment_ids: np.ndarray  # [B, T] int32, 0 = padding
    positions: np.ndarray  # [B, T] int32, restart at 0 in each segment
    completion_mask: np.ndarray  # [B, T] int32, 1 on completion tokens
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
