"""TrainerWorker: the trainer-side API the driver calls, as an RL run's trainer exposes it.

An RL trainer either applies the optimizer in a separate `update()` call or fuses it into the last
`fwd_bwd` of a step (`apply_optimizer=True`). The bench offers both, so it times the program the
production run dispatches. A fused worker has no separate update to stage the next micro-batch
before; the plan refuses STAGE_BEFORE_UPDATE with WORKER=fused (`bench/plan.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl_trainer_bench.engine import returns
from rl_trainer_bench.engine.contract import optional

if TYPE_CHECKING:
    from rl_trainer_bench.engine.contract import Engine, Payload, PreparedInput


class TrainerWorker:
    """Forwards micro-batches to an engine and applies the optimizer, separately or fused.

    `fused=False`: `fwd_bwd` only accumulates; `update()` applies the step's gradient.
    `fused=True`: the `fwd_bwd` called with `apply_optimizer=True` applies it right after
    accumulating, and `update()` then has nothing left to do and returns the train step.
    """

    def __init__(self, engine: Engine, *, fused: bool = False):
        self.engine = engine
        self.fused = fused

    @property
    def train_step(self) -> int:
        return self.engine.train_step

    def fwd_bwd(self, request: Payload | PreparedInput, apply_optimizer: bool) -> None:
        """Dispatch one micro-batch; a fused worker also applies the optimizer when asked."""
        self.engine.fwd_bwd(request)
        if self.fused and apply_optimizer:
            returns.train_step(self.engine.update())

    def update(self) -> int:
        """Apply the step's gradient (separate worker) and return the train step; an engine whose
        `update` returns anything but an int breaks the contract (ContractError)."""
        if self.fused:
            return self.engine.train_step
        return returns.train_step(self.engine.update())

    def get_metrics(self) -> Mapping[str, Any]:
        """The engine's metrics, checked against the contract (ContractError naming the problem)."""
        return returns.metrics(self.engine.get_metrics(clear_cache=True))

    def info(self) -> dict[str, Any]:
        """What the worker runs: its update mode and, where the engine describes itself, the engine."""
        describe = optional(self.engine, "info")
        engine_info = dict(describe()) if describe is not None else {}
        return {"worker": "fused" if self.fused else "separate", **engine_info}
