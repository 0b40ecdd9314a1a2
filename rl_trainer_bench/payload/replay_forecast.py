"""A routing profile's own forecast of replays at an engine's MoE settings, with no micro-batch
built, so a plan can print it before any work.

The forecast models the buffer of the engine that runs: the built-in engine's capacity per expert
per group of tokens, or MaxText's one buffer per expert-parallel shard
(payload/maxtext_buffer.py). The same factor means a different buffer in each, so a forecast
made for the wrong engine is a forecast of another program.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig, replays_possible, tokens_per_group
from rl_trainer_bench.payload.expert_load import predict_overflow, replay_probability
from rl_trainer_bench.payload.maxtext_buffer import shard_buffer, shard_overflow
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.routing_profile import RoutingProfile, fit_to_model

BUILT_IN_BUFFER = "built-in"
MAXTEXT_BUFFER = "maxtext"


@dataclasses.dataclass(frozen=True)
class ReplayPrediction:
    """The profile's own forecast of replays at an engine's MoE settings (no micro-batch built)."""

    probability: float  # that a micro-batch overflows some buffer of some layer, so replays
    capacity: int  # slots per expert per group (built-in), or rows per shard (MaxText)
    tokens_per_group: int  # the tokens whose pairs fill one set of buffers
    buffer: str  # which buffer, in words

    def describe(self) -> str:
        return f"P(replay)={self.probability:.2f} per micro-batch ({self.buffer})"


def predicted_replay(
    profile: RoutingProfile, engine: EngineConfig, buffer: str = BUILT_IN_BUFFER
) -> ReplayPrediction | None:
    """P(a micro-batch replays) at `engine`'s MoE settings in `buffer`'s engine, from the
    profile's loads (fitted to the engine's model) and its layout's mean real-token fraction
    (padding carries no routed pair); None when the engine never replays. The calibration report
    of a built micro-batch gives the built-in forecast from the loads it achieved; this one costs
    no build, so a plan can print it."""
    if not replays_possible(engine):
        return None
    fitted = fit_to_model(profile, engine.model)
    rows, seq_len = engine.micro_batch_rows, engine.seq_len
    layout = (fitted.layout or PackingLayout(rows, seq_len)).for_shape(rows, seq_len)
    real = (rows - layout.pad_rows) / rows * float(np.mean(layout.real_fraction))
    if buffer == MAXTEXT_BUFFER:
        return _maxtext(fitted, engine, real)
    group = tokens_per_group(engine)
    overflow = predict_overflow(
        fitted.shares,
        tokens=group,
        real_fraction=real,
        top_k=fitted.top_k,
        factor=engine.moe.ragged_buffer_factor,
    )
    probability = replay_probability(overflow.overflow_probability, group, rows * seq_len)
    where = (
        f"the built-in engine's buffer: capacity {overflow.capacity:,} slots per expert per group"
        f" of {group:,} tokens"
    )
    return ReplayPrediction(probability, overflow.capacity, group, where)


def _maxtext(profile: RoutingProfile, engine: EngineConfig, real: float) -> ReplayPrediction | None:
    """MaxText's shard buffers; None where its layer keeps every pair (nothing to replay)."""
    buffer = shard_buffer(engine, profile.top_k)
    if buffer is None:
        return None
    overflow = shard_overflow(profile.shares, buffer, real_fraction=real, top_k=profile.top_k)
    micro_batch = engine.micro_batch_rows * engine.seq_len
    probability = replay_probability(overflow, buffer.pool_tokens, micro_batch)
    return ReplayPrediction(probability, buffer.rows, buffer.pool_tokens, buffer.describe())
