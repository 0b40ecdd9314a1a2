"""Calibrated routing: per-token expert choices whose loads match a routing profile, drawn cheaply.

Routing must load the experts as the profile says, and be cheap enough that the production cell's
5 GB micro-batch builds in seconds. Both come from drawing routing in two stages:

1. Per layer, a table of Q*R "expert sets" (K distinct experts each) whose expert counts equal
   the profile's shares times K*Q*R, to within one count (systematic sampling: Q random orders of
   the experts, each expert given a contiguous run of cells no longer than R, and set r made of
   cells r, r+R, ..., r+(K-1)R, so its K experts are distinct).
2. A pool of per-token routings (one set per layer), drawn by cycling through every table row
   the same number of times in shuffled order, so the pool's loads equal the tables' loads; each
   token then copies one pool entry (L*K int16 in one memcpy-sized gather).

Tokens sharing a pool entry route identically in every layer; with the pool at 131,072 entries a
production micro-batch reuses each about 27 times, which the engine's timing cannot see. Layers
stay independent of each other within an entry.
"""

from __future__ import annotations

import math

import numpy as np

from rl_trainer_bench.payload.routing_profile import RoutingProfile

POOL_TOKENS = 1 << 17  # per-token routings drawn per micro-batch; larger batches reuse them


TABLE_CELLS = 1 << 10  # R: resolution of one expert's inclusion probability in one order


TABLE_ORDERS = 8  # Q: random expert orders per layer (varies which experts co-occur)


def _cell_counts(target: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to `total`, each within one of `target` (largest remainder)."""
    counts = np.floor(target).astype(np.int64)
    short = total - counts.sum()
    if short > 0:
        counts[np.argsort(counts - target, kind="stable")[:short]] += 1
    return counts


def expert_set_tables(shares: np.ndarray, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """[L, Q*R, K] int16: per layer, Q*R sets of K distinct experts matching `shares`.

    Expert e appears in round(shares[e] * K * Q * R) sets. In each of the Q orders the experts
    take contiguous runs of cells (at most R each, since a share is at most 1/K), and set r of
    that order is cells r, r+R, ..., so no set holds an expert twice.
    """
    num_layers, num_experts = shares.shape
    cells = TABLE_CELLS
    tables = np.empty((num_layers, TABLE_ORDERS * cells, top_k), np.int16)
    for layer in range(num_layers):
        counts = _cell_counts(
            shares[layer] * top_k * TABLE_ORDERS * cells, top_k * TABLE_ORDERS * cells
        )
        base, extra = np.divmod(counts, TABLE_ORDERS)
        dealt = np.repeat(np.arange(num_experts), extra)  # extra cells, dealt round-robin to orders
        for order in range(TABLE_ORDERS):
            per_expert = base + np.bincount(dealt[order::TABLE_ORDERS], minlength=num_experts)
            experts = rng.permutation(num_experts)
            run = np.repeat(experts, per_expert[experts]).astype(np.int16)
            tables[layer, order * cells : (order + 1) * cells] = run.reshape(top_k, cells).T
    return tables


def _row_view(array: np.ndarray, last_axes: int) -> np.ndarray:
    """`array` with its last `last_axes` axes fused into one opaque item, for row gathers."""
    itemsize = array.itemsize * math.prod(array.shape[-last_axes:])
    lead = array.shape[:-last_axes]
    return array.reshape(*lead, -1).view(np.dtype((np.void, itemsize))).reshape(lead)


def _draw_pool(tables: np.ndarray, size: int, rng: np.random.Generator):
    """A pool of `size` per-token routings [size, L, K] and the table row behind each ([L, size]).

    Table rows are dealt in shuffled cycles, so every row is used equally often (to within one)
    and the pool carries the tables' loads without sampling noise.
    """
    num_layers, table_rows, top_k = tables.shape
    cycles = math.ceil(size / table_rows)
    rows = np.empty((num_layers, size), np.int64)
    layer_major = np.empty((num_layers, size), np.dtype((np.void, 2 * top_k)))
    table_items = _row_view(tables, 1)  # [L, Q*R] of K experts each
    for layer in range(num_layers):
        rows[layer] = rng.permutation(cycles * table_rows)[:size] % table_rows
        np.take(table_items[layer], rows[layer], out=layer_major[layer], mode="clip")
    pool = np.ascontiguousarray(layer_major.T).view(np.int16).reshape(size, num_layers, top_k)
    return pool, rows


def _achieved_counts(
    tables: np.ndarray, pool_rows: np.ndarray, uses: np.ndarray, num_experts: int
) -> np.ndarray:
    """Pairs routed to each expert per layer ([L, E]) when pool entry p is used `uses[p]` times."""
    num_layers, table_rows, top_k = tables.shape
    counts = np.empty((num_layers, num_experts))
    for layer in range(num_layers):
        row_uses = np.bincount(pool_rows[layer], weights=uses, minlength=table_rows)
        experts = tables[layer].reshape(-1).astype(np.int64)
        counts[layer] = np.bincount(experts, np.repeat(row_uses, top_k), minlength=num_experts)
    return counts


def draw_routing(
    profile: RoutingProfile, real_lengths: np.ndarray, seq_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """routed_experts [B, T, L, K] int16 (-1 on padding) and the pairs per expert, per layer."""
    rows = real_lengths.size
    num_layers, top_k = profile.num_layers, profile.top_k
    tables = expert_set_tables(profile.shares, top_k, rng)
    total_real = int(real_lengths.sum())
    pool_size = min(POOL_TOKENS, total_real)
    pool, pool_rows = _draw_pool(tables, pool_size, rng)
    pool_items = _row_view(pool, 2)
    routed = np.empty((rows, seq_len, num_layers, top_k), np.int16)
    token_items = _row_view(routed, 2)  # [B, T] of L*K experts each
    uses = np.zeros(pool_size, np.int64)
    taken = 0
    for b, real in enumerate(real_lengths.tolist()):
        if total_real <= POOL_TOKENS:  # every token gets its own pool entry
            picks = np.arange(taken, taken + real)
            taken += real
        else:
            picks = rng.integers(0, pool_size, real, dtype=np.int64)
        np.take(pool_items, picks, out=token_items[b, :real], mode="clip")
        uses += np.bincount(picks, minlength=pool_size)
        routed[b, real:] = -1
    return routed, _achieved_counts(tables, pool_rows, uses, profile.num_experts)
