"""Did the built micro-batch load the experts as the profile says? Target versus achieved loads.

The tolerance is stated (a relative part plus standard errors of sampling noise), so a miss is a
refusal naming the worst layer, not a silent difference.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig, tokens_per_group
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload import expert_load
from rl_trainer_bench.payload.routing_profile import RoutingProfile

CALIBRATION_REL_TOL = 0.05  # achieved max-load ratio within 5% of target ...


CALIBRATION_BASE_SIGMAS = 3.0  # ... plus (3 + sqrt(2 ln E)) standard errors of sampling noise


class CalibrationError(UserError):
    """The built micro-batch's expert loads miss the profile by more than the stated tolerance."""


@dataclasses.dataclass(frozen=True)
class CalibrationReport:
    """Target versus achieved expert loads of one micro-batch, and what the buffers will do."""

    target_max_load: np.ndarray  # [L] hottest expert / mean expert
    achieved_max_load: np.ndarray  # [L]
    tolerance: np.ndarray  # [L] allowed |achieved - target|
    target_shard_load: np.ndarray  # [L] hottest expert-parallel shard / mean shard
    achieved_shard_load: np.ndarray  # [L]
    expert_shards: int
    factor: float  # ragged_buffer_factor
    overflow: expert_load.OverflowPrediction  # from the achieved loads
    tokens_per_group: int
    fitted_from: str
    synthetic: bool

    @property
    def missed_layers(self) -> list[int]:
        miss = np.abs(self.achieved_max_load - self.target_max_load) > self.tolerance
        return [int(i) for i in np.flatnonzero(miss)]

    def format(self) -> str:
        """A short table, one line per layer, under a header saying what the figures mean."""
        fitted = f", rescaled from {self.fitted_from}" if self.fitted_from else ""
        kind = "synthetic" if self.synthetic else "measured"
        lines = [
            f"routing calibration ({kind} profile{fitted}): max-load = hottest expert / mean; "
            f"shard = hottest of {self.expert_shards} expert shards / mean; overflow predicted at "
            f"ragged_buffer_factor={self.factor:g} (capacity {self.overflow.capacity} pairs per "
            f"expert, {self.tokens_per_group} tokens per expert group)",
            "layer  max-load target  achieved  tol    shard target  achieved  drop%    P(overflow)",
        ]
        for layer in range(self.target_max_load.size):
            lines.append(
                f"{layer:5d}  {self.target_max_load[layer]:15.3f}  {self.achieved_max_load[layer]:8.3f}"
                f"  {self.tolerance[layer]:5.3f}  {self.target_shard_load[layer]:12.3f}"
                f"  {self.achieved_shard_load[layer]:8.3f}"
                f"  {100 * self.overflow.drop_fraction[layer]:6.3f}  {self.overflow.overflow_probability[layer]:11.3f}"
                + ("  MISSED" if layer in self.missed_layers else "")
            )
        return "\n".join(lines)


def calibrate(
    engine: EngineConfig, profile: RoutingProfile, counts: np.ndarray, real_tokens: int
) -> CalibrationReport:
    achieved = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    num_experts, top_k = profile.num_experts, profile.top_k
    target_max = profile.max_load_ratio
    hottest = np.clip(profile.shares.max(axis=1) * top_k, 0, 1)  # inclusion probability
    standard_error = num_experts * np.sqrt(hottest * (1 - hottest) / max(real_tokens, 1)) / top_k
    sigmas = CALIBRATION_BASE_SIGMAS + math.sqrt(2 * math.log(num_experts))
    group = tokens_per_group(engine)
    shards = engine.mesh.expert
    return CalibrationReport(
        target_max_load=target_max,
        achieved_max_load=expert_load.max_load_ratio(achieved),
        tolerance=CALIBRATION_REL_TOL * target_max + sigmas * standard_error,
        target_shard_load=expert_load.shard_max_load_ratio(profile.shares, shards),
        achieved_shard_load=expert_load.shard_max_load_ratio(achieved, shards),
        expert_shards=shards,
        factor=engine.moe.ragged_buffer_factor,
        overflow=expert_load.predict_overflow(
            achieved,
            tokens=group,
            real_fraction=real_tokens / (engine.micro_batch_rows * engine.seq_len),
            top_k=top_k,
            factor=engine.moe.ragged_buffer_factor,
        ),
        tokens_per_group=group,
        fitted_from=profile.fitted_from,
        synthetic=profile.synthetic,
    )
