"""The token arrays of a micro-batch (ids, segments, positions, masks, advantages, log-probs) from
its packing."""

from __future__ import annotations

import math

import numpy as np

from rl_trainer_bench.payload.packing import Packing

LOGP_NOISE = 0.02  # spread of old/ref log-probs around a fresh model's, so ratios start near 1


def token_arrays(
    packing: Packing, shape: tuple[int, int], vocab_size: int, group_size: int, rng
) -> dict[str, np.ndarray]:
    """Every [B, T] array of the contract, from the packing.

    `completion_mask` is input-aligned as `contract.Payload` defines it: 1 at t where token t+1 of
    the same sequence is a completion token.
    """
    rows = shape[0]
    segment_ids = packing.segment_ids(shape)
    positions = np.zeros(shape, np.int32)
    completion_mask = np.zeros(shape, np.int32)
    advantages = np.zeros(shape, np.float32)
    rewards = rng.random(packing.length.size)
    groups = np.arange(packing.length.size) // group_size
    group_count = np.bincount(groups)
    group_mean = np.bincount(groups, rewards) / group_count
    centered = rewards - group_mean[groups]
    group_std = np.sqrt(np.bincount(groups, centered**2) / group_count)
    advantage = np.where(group_count[groups] > 1, centered / (group_std[groups] + 1e-6), 0.0)
    for b in range(rows):
        mine = packing.row == b
        if not mine.any():
            continue
        lengths, prompts = packing.length[mine], packing.prompt[mine]
        real = int(packing.real_lengths[b])
        starts = np.repeat(packing.start[mine], lengths)
        offset = np.arange(real) - starts
        positions[b, :real] = offset
        completion_mask[b, :real] = (offset >= np.repeat(prompts - 1, lengths)) & (
            offset <= np.repeat(lengths - 2, lengths)
        )
        advantages[b, :real] = np.repeat(advantage[mine], lengths)
    real = segment_ids > 0
    fresh_logp = np.float32(-math.log(vocab_size))  # a fresh model's softmax is near uniform
    return {
        "input_ids": np.where(real, rng.integers(0, vocab_size, shape, dtype=np.int32), 0),
        "segment_ids": segment_ids,
        "positions": positions,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_logps": np.where(real, fresh_logp + LOGP_NOISE * _normal(rng, shape), 0),
        "ref_logps": np.where(real, fresh_logp + LOGP_NOISE * _normal(rng, shape), 0),
    }


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)
