"""A routing profile's own forecast of replays at an engine's MoE settings, with no micro-batch
built, so a plan can print it before any work."""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig, replays_possible, tokens_per_group
from rl_trainer_bench.payload.expert_load import predict_overflow, replay_probability
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.routing_profile import RoutingProfile, fit_to_model


@dataclasses.dataclass(frozen=True)
class ReplayPrediction:
    """The profile's own forecast of replays at an engine's MoE settings (no micro-batch built)."""

    probability: float  # that a micro-batch overflows some group of some layer, so replays
    capacity: int  # slots per expert per group
    tokens_per_group: int

    def describe(self) -> str:
        return (
            f"P(replay)={self.probability:.2f} per micro-batch (capacity {self.capacity:,} slots"
            f" per expert per group of {self.tokens_per_group:,} tokens)"
        )


def predicted_replay(profile: RoutingProfile, engine: EngineConfig) -> ReplayPrediction | None:
    """P(a micro-batch replays) at `engine`'s buffer factor and token chunks, from the profile's
    loads (fitted to the engine's model) and its layout's mean real-token fraction; None when the
    engine never replays. The calibration report of a built micro-batch gives the same forecast
    from the loads it achieved; this one costs no build, so a plan can print it."""
    if not replays_possible(engine):
        return None
    fitted = fit_to_model(profile, engine.model)
    rows, seq_len = engine.micro_batch_rows, engine.seq_len
    layout = (fitted.layout or PackingLayout(rows, seq_len)).for_shape(rows, seq_len)
    real = (rows - layout.pad_rows) / rows * float(np.mean(layout.real_fraction))
    group = tokens_per_group(engine)
    overflow = predict_overflow(
        fitted.shares,
        tokens=group,
        real_fraction=real,
        top_k=fitted.top_k,
        factor=engine.moe.ragged_buffer_factor,
    )
    probability = replay_probability(overflow.overflow_probability, group, rows * seq_len)
    return ReplayPrediction(probability, overflow.capacity, group)
