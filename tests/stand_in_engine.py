"""A stand-in engine and micro-batch pool for driver and A/B tests.

The stand-in engine records every call the driver makes, in order, and trains by hashing the
micro-batches it consumed into its "parameters", so tests see exactly which micro-batches were
trained, in which order, through which kind of input, and when the optimizer ran. `TimedEngine`
adds time to each call: a drift the A/B must not mistake for an effect, or a known effect (a delay
on the first call after a boundary when that call's input was not staged) it must find.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from rl_trainer_bench.engine.contract import Payload


def stand_in_pool(count: int) -> list[Payload]:
    """`count` distinct micro-batches of four rows of four tokens (they divide cpu-tiny's mesh, as
    the builder's do, so they go to its devices as the engine's input goes), each with per-array
    digests as the builder makes."""
    pool = []
    for i in range(count):
        ids = np.full((4, 4), i + 1, np.int32)
        segments = np.ones((4, 4), np.int32)
        segments[1, 3] = 0
        arrays = {
            "input_ids": ids,
            "segment_ids": segments,
            "positions": np.tile(np.arange(4, dtype=np.int32), (4, 1)),
            "completion_mask": segments.copy(),
            "advantages": np.full((4, 4), 0.5, np.float32),
            "old_logps": np.zeros((4, 4), np.float32),
        }
        digests = {k: hashlib.sha256(v.tobytes()).hexdigest()[:12] for k, v in arrays.items()}
        pool.append(Payload(**arrays, name=f"pool_{i}", digests=digests))
    return pool


@dataclasses.dataclass(frozen=True)
class StandInPrepared:
    name: str
    digests: dict
    payload: Payload


class Ready:
    """A completion marker that is always ready."""

    def block_until_ready(self):
        return self


class StandInEngine:
    """Records the driver's calls; trains by chaining the consumed micro-batches into a digest."""

    def __init__(self, staging: bool = True, replay_every: int = 0):
        self.calls: list[tuple] = []
        self.trained: list[str] = []  # input_ids digest of each fwd_bwd, in order
        self._train_step = 0
        self._params = "init"
        self._family = [self]  # the engines over this one's state; the last one holds it
        self._pending: list[str] = []
        self._tokens = 0
        self.replay_every = replay_every
        if not staging:
            self.prepare_fwd_bwd_input = None
            self.wait_for_device = None

    @property
    def train_step(self) -> int:
        return self._train_step

    def compile(self, example):
        self.calls.append(("compile",))
        return {"fwd_bwd": 0.01, "update": 0.01}

    def fwd_bwd(self, batch):
        payload = batch.payload if isinstance(batch, StandInPrepared) else batch
        kind = "prepared" if isinstance(batch, StandInPrepared) else "payload"
        self.calls.append(("fwd_bwd", payload.name, kind))
        self.trained.append(payload.digests["input_ids"])
        self._pending.append(payload.digests["input_ids"])
        self._tokens += int(payload.completion_mask.sum())

    def update(self):
        self.calls.append(("update",))
        self._params = hashlib.sha256((self._params + "|".join(self._pending)).encode()).hexdigest()
        self._pending = []
        self._train_step += 1
        return self._train_step

    def get_metrics(self, clear_cache=True):
        self.calls.append(("metrics",))
        replays = 1 if self.replay_every and self._train_step % self.replay_every == 0 else 0
        loss = int(self._params[:8], 16) / 2**32
        out = {"loss": loss, "grad_norm": 1.0 + loss, "loss_denominator": float(self._tokens)}
        out |= {"overflow_count": replays, "replay_count": replays}
        self._tokens = 0
        return out

    def completion_marker(self):
        return Ready()

    def parameter_digest(self):
        return self._params

    def share_state(self, config):
        """A sibling over this engine's state (the contract's share_state): its own call log,
        the family's parameters and update count, taken when it first steps."""
        sibling = type(self).__new__(type(self))
        sibling.__dict__.update(self.__dict__, calls=[], trained=[], _pending=[], _tokens=0)
        sibling.config = config
        return sibling

    def take_shared_state(self):
        holder = self._family[-1]
        if holder is not self:
            self.calls.append(("take_state",))
            self._params, self._train_step = holder._params, holder._train_step
            self._family.append(self)

    def prepare_fwd_bwd_input(self, payload):
        self.calls.append(("prepare", payload.name))
        return StandInPrepared(payload.name, dict(payload.digests), payload)

    def wait_for_device(self):
        self.calls.append(("wait",))
        return 0.0


class TimedEngine(StandInEngine):
    """A stand-in whose calls take time: `call_work(n)` runs inside the n-th fwd_bwd (from 0), and
    the first fwd_bwd after an update pays `boundary_delay_s` more unless its input was staged."""

    def __init__(self, call_work: Callable[[int], None], boundary_delay_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.call_work = call_work
        self.boundary_delay_s = boundary_delay_s
        self._calls = 0
        self._after_update = False

    def fwd_bwd(self, batch):
        if self._after_update and self.boundary_delay_s and not isinstance(batch, StandInPrepared):
            time.sleep(self.boundary_delay_s)
        self._after_update = False
        self.call_work(self._calls)
        self._calls += 1
        super().fwd_bwd(batch)

    def update(self):
        self._after_update = True
        return super().update()


def drifting_sleep(first_s: float, change_per_call_s: float) -> Callable[[int], None]:
    """Call work that sleeps `first_s`, then `change_per_call_s` more (or less) on each later call."""

    def work(call: int) -> None:
        time.sleep(max(0.0, first_s + change_per_call_s * call))

    return work


class ConfiguredStandInEngine(StandInEngine):
    """The stand-in as the ENGINE knob builds an engine: `Class(engine_config)`."""

    built_with: ClassVar[list] = []  # every engine config this class was built with, in order

    def __init__(self, config):
        super().__init__()
        ConfiguredStandInEngine.built_with.append(config)


class StagelessStandInEngine(StandInEngine):
    """An engine, named by ENGINE, that lacks the staging methods."""

    def __init__(self, config):
        super().__init__(staging=False)
