"""Expert-load statistics of routing shares: what a routing does to the MoE buffers.

The builder's calibration report, the profile and the plan's replay forecast speak in the same
figures: the hottest expert's load over the mean (max-load ratio), the hottest expert-parallel
shard's load over the mean shard's (the expert-parallel slowdown routing causes), and the drops
and overflow chance a group of tokens meets at a buffer factor.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rl_trainer_bench.engine.config import expert_capacity


def max_load_ratio(shares: np.ndarray) -> np.ndarray:
    """Hottest expert's load over the mean load, per layer (`shares`: [..., E], rows sum to 1)."""
    return shares.max(axis=-1) * shares.shape[-1]


def shard_max_load_ratio(shares: np.ndarray, expert_shards: int) -> np.ndarray:
    """Hottest expert-parallel shard's load over the mean shard load, per layer.

    Experts are split into `expert_shards` contiguous blocks, as an expert-sharded weight is; the
    step waits for the hottest shard, so this ratio is the expert-parallel slowdown routing causes.
    """
    num_experts = shares.shape[-1]
    if expert_shards <= 1 or num_experts % expert_shards:
        return np.ones(shares.shape[:-1])
    blocks = shares.reshape(*shares.shape[:-1], expert_shards, num_experts // expert_shards)
    return blocks.sum(axis=-1).max(axis=-1) * expert_shards


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


@dataclasses.dataclass(frozen=True)
class OverflowPrediction:
    """What the buffers do with these shares, per layer, for one group of `tokens` local tokens."""

    capacity: int
    drop_fraction: np.ndarray  # [L] expected dropped pairs / routed pairs
    overflow_probability: np.ndarray  # [L] probability that a group drops at least one pair


def predict_overflow(
    shares: np.ndarray, *, tokens: int, real_fraction: float, top_k: int, factor: float
) -> OverflowPrediction:
    """Drops at `factor` when each of `tokens` local tokens (a `real_fraction` of them real) picks
    expert e with probability K * share_e.

    An expert's queue length is Binomial(real tokens, K * share_e); the expected excess over the
    capacity and the probability of any excess use the normal approximation with a continuity
    correction, and experts are treated as independent (they are nearly so for E >> K).
    """
    num_experts = shares.shape[-1]
    capacity = expert_capacity(tokens, top_k, num_experts, factor)
    real = max(1.0, tokens * real_fraction)
    tail, excess = binomial_excess(real, np.clip(shares * top_k, 0.0, 1.0), capacity)
    drop_fraction = excess.sum(axis=-1) / (real * top_k)
    return OverflowPrediction(capacity, drop_fraction, any_overflow(tail))


def binomial_excess(trials: float, p: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """For queues of Binomial(trials, p) against `capacity` slots: the chance each overflows and
    its expected excess, by the normal approximation with a continuity correction."""
    mean = trials * p
    sd = np.sqrt(np.maximum(trials * p * (1 - p), 1e-12))
    z = (capacity + 0.5 - mean) / sd
    tail = 1.0 - _normal_cdf(z)
    density = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    excess = np.maximum(sd * density - (capacity + 0.5 - mean) * tail, 0.0)
    return tail, excess


def any_overflow(tail: np.ndarray) -> np.ndarray:
    """P(some queue of the last axis overflows), the queues taken as independent."""
    return 1.0 - np.exp(np.log(np.clip(1.0 - tail, 1e-300, 1.0)).sum(axis=-1))


def replay_probability(
    overflow_per_group: np.ndarray, tokens_per_group: int, micro_batch_tokens: int
) -> float:
    """P(a micro-batch replays): 1 - prod over layers of (1 - p_layer) ** groups.

    `overflow_per_group[l]` is the chance that one group of `tokens_per_group` tokens overflows in
    layer l; groups and layers are taken as independent, as the calibration report takes experts.
    """
    groups = math.ceil(micro_batch_tokens / max(tokens_per_group, 1))
    keep = np.clip(1.0 - np.asarray(overflow_per_group, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        log_keep = groups * np.log(keep).sum()
    return float(1.0 - math.exp(log_keep)) if np.isfinite(log_keep) else 1.0
