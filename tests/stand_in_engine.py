"""A stand-in engine and micro-batch pool for driver and A/B tests.

The stand-in engine records every call the driver makes, in order, and trains by hashing the
micro-batches it consumed into its "parameters", so tests see exactly which micro-batches were
trained, in which order, through which kind of input, and when the optimizer ran.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from rl_trainer_bench.engine.contract import Payload


def stand_in_pool(count: int) -> list[Payload]:
    """`count` distinct two-row micro-batches, each with per-array digests as the builder makes."""
    pool = []
    for i in range(count):
        ids = np.full((2, 4), i + 1, np.int32)
        segments = np.ones((2, 4), np.int32)
        segments[1, 3] = 0
        arrays = {
            "input_ids": ids,
            "segment_ids": segments,
            "positions": np.tile(np.arange(4, dtype=np.int32), (2, 1)),
            "completion_mask": segments.copy(),
            "advantages": np.full((2, 4), 0.5, np.float32),
            "old_logps": np.zeros((2, 4), np.float32),
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

    def prepare_fwd_bwd_input(self, payload):
        self.calls.append(("prepare", payload.name))
        return StandInPrepared(payload.name, dict(payload.digests), payload)

    def wait_for_device(self):
        self.calls.append(("wait",))
        return 0.0
