"""MaxText's routed-MoE buffer, which a replay forecast for MaxText's engine models.

MaxText does not give each expert a capacity, as the built-in engine does. Its expert-parallel
MoE layer (MaxText's layers/moe.py, `get_ragged_buffer_size`) gives each expert-parallel shard one
receive buffer of int(ragged_buffer_factor x a device's tokens x top_k) rows, shared by the
shard's E / EP experts and filled with the pairs that the EP devices of its group route to them.
A shard overflows only when its experts together draw more than `factor` x their balanced share,
so one hot expert among cold ones on its shard costs nothing. The tokens reach the shard by
ragged all-to-all (MaxText's default), or by its ring of experts (`use_ring_of_experts=true`),
where the buffer is finite only with the ring's ragged sort (`use_ragged_sort=true`) and the
ring alone splits a device's tokens into `num_moe_token_chunks` chunks, each filling the buffers
on its own; without the ring the chunks key does nothing. No buffer drops anything at a factor of
0 or less (MaxText then sizes it for the worst case), nor with one shard (no exchange). With
`custom_mesh_and_rule=cp-as-ep` the context axis is expert-parallel too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig, device_tokens
from rl_trainer_bench.payload.expert_load import any_overflow, binomial_excess

RAGGED_ALL_TO_ALL = "ragged all-to-all"
RING = "ring of experts"
_CONTEXT_AS_EXPERT = ("custom_mesh_and_rule", "cp-as-ep")


@dataclasses.dataclass(frozen=True)
class ShardBuffer:
    """One expert-parallel shard's receive buffer, and the tokens whose pairs fill it."""

    shards: int  # expert-parallel devices in a group, each holding E / shards experts
    exchange: str  # RAGGED_ALL_TO_ALL | RING
    chunk_tokens: int  # one device's tokens per chunk (all of them without the ring's chunks)
    rows: int  # the buffer: int(factor x chunk_tokens x top_k)

    @property
    def pool_tokens(self) -> int:
        """The tokens whose routed pairs fill one set of the group's shard buffers."""
        return self.shards * self.chunk_tokens

    def describe(self) -> str:
        return (
            f"MaxText's buffer, {self.exchange}: {self.rows:,} rows per expert-parallel shard of"
            f" {self.shards}, filled from the {self.pool_tokens:,} tokens of its group"
        )


def shard_buffer(engine: EngineConfig, top_k: int) -> ShardBuffer | None:
    """The buffer MaxText sizes for `engine`'s mesh, factor and trainer keys; None where its
    layer keeps every routed pair (factor <= 0, one shard, a ring without its ragged sort)."""
    keys = _last_values(engine.trainer_maxtext_keys)
    ring = keys.get("use_ring_of_experts") == "true"
    shards = engine.mesh.expert
    if keys.get(_CONTEXT_AS_EXPERT[0]) == _CONTEXT_AS_EXPERT[1]:
        shards *= engine.mesh.context
    factor = engine.moe.ragged_buffer_factor
    if factor <= 0 or shards <= 1 or (ring and keys.get("use_ragged_sort") != "true"):
        return None
    chunks = engine.moe.token_chunks if ring else 1
    tokens = device_tokens(engine) // chunks
    return ShardBuffer(
        shards, RING if ring else RAGGED_ALL_TO_ALL, tokens, int(factor * tokens * top_k)
    )


def shard_overflow(
    shares: np.ndarray, buffer: ShardBuffer, *, real_fraction: float, top_k: int
) -> np.ndarray:
    """P(some shard's buffer overflows), per layer, for one pool of tokens (`shares`: [L, E]).

    Experts sit on shards in contiguous blocks, as MaxText shards its expert weights; a shard's
    load is taken as Binomial(real tokens x K, its experts' summed share), the K picks of a token
    being treated as independent draws (they are distinct experts, so this slightly overstates
    the spread).
    """
    starts = np.linspace(0, shares.shape[-1], buffer.shards + 1).round().astype(int)[:-1]
    loads = np.add.reduceat(shares, starts, axis=-1)
    trials = max(1.0, buffer.pool_tokens * real_fraction) * top_k
    tail, _ = binomial_excess(trials, np.clip(loads, 0.0, 1.0), buffer.rows)
    return any_overflow(tail)


def _last_values(keys: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The trainer's MaxText keys as MaxText keeps them: the last setting of each, lower-cased."""
    return {key: value.strip().lower() for key, value in keys}
