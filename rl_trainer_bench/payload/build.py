"""Calibrated micro-batch builder: a synthetic Payload shaped and routed like a production one.

The bench times the trainer on micro-batches it builds itself, off the clock. They must load the
MoE experts the way a production step does (a random-weight router would spread tokens evenly and
hide overflows, replays and expert-parallel imbalance), and they must be cheap enough that the
production cell's 5 GB micro-batch builds in seconds. Both come from drawing routing in two stages:

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

Everything is deterministic in (seed, index): same inputs, byte-identical arrays and digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import zipfile
import zlib
from collections.abc import Sequence

import numpy as np

from rl_trainer_bench.config.engine_keys import parse_trainer_argv
from rl_trainer_bench.config.presets import preset as find_preset
from rl_trainer_bench.engine.config import EngineConfig, tokens_per_group
from rl_trainer_bench.engine.contract import OPTIONAL_PAYLOAD_FIELDS, PAYLOAD_FIELDS, Payload
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import write_atomically, write_text_atomically
from rl_trainer_bench.payload import routing_profile
from rl_trainer_bench.payload.routing_profile import PackingLayout, RoutingProfile

__all__ = [
    "CalibrationError",
    "CalibrationReport",
    "PackingLayout",
    "array_digest",
    "build_calibrated",
    "build_micro_batch",
    "build_pool",
    "digest_mismatches",
    "load_npz",
    "payload_digest",
    "save_npz",
]

POOL_TOKENS = 1 << 17  # per-token routings drawn per micro-batch; larger batches reuse them
TABLE_CELLS = 1 << 10  # R: resolution of one expert's inclusion probability in one order
TABLE_ORDERS = 8  # Q: random expert orders per layer (varies which experts co-occur)
SEGMENT_ALIGN = 64  # packed sequences start on multiples of this where the row allows it
LOGP_NOISE = 0.02  # spread of old/ref log-probs around a fresh model's, so ratios start near 1
CALIBRATION_REL_TOL = 0.05  # achieved max-load ratio within 5% of target ...
CALIBRATION_BASE_SIGMAS = 3.0  # ... plus (3 + sqrt(2 ln E)) standard errors of sampling noise


class CalibrationError(UserError):
    """The built micro-batch's expert loads miss the profile by more than the stated tolerance."""


# ----------------------------------------------------------------------------------------------
# Digests
# ----------------------------------------------------------------------------------------------

_DIGEST_BLOCK = 1 << 20  # 64-bit words per block


def _digest_multipliers() -> np.ndarray:
    rng = np.random.default_rng(0x5EED_D16E57)
    return rng.integers(0, 2**63, _DIGEST_BLOCK, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


_MULTIPLIERS = _digest_multipliers()


def array_digest(array: np.ndarray) -> str:
    """A 128-bit content digest of an array: its dtype, shape and bytes.

    Each block of 2**20 64-bit words is reduced to one word by a dot product with fixed odd
    multipliers (wrapping arithmetic: any single-word change moves the block's word), and the
    block words are hashed with BLAKE2b. It reads the 5 GB routing array at about 7 GB/s on one
    core, where SHA-256 manages under 1 GB/s on the development machine.
    """
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    words = flat[: flat.size - flat.size % 8].view(np.uint64)
    tail = np.zeros(8, np.uint8)
    tail[: flat.size % 8] = flat[flat.size - flat.size % 8 :]
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(f"{array.dtype.str}{array.shape}".encode())
    block_words = np.empty(math.ceil(words.size / _DIGEST_BLOCK) + 1, np.uint64)
    for i, start in enumerate(range(0, words.size, _DIGEST_BLOCK)):
        block = words[start : start + _DIGEST_BLOCK]
        block_words[i] = np.dot(block, _MULTIPLIERS[: block.size])
    block_words[-1] = tail.view(np.uint64)[0]
    hasher.update(block_words.tobytes())
    return hasher.hexdigest()


def payload_digest(payload: Payload) -> str:
    """One digest for a micro-batch, from its per-array digests (cheap: no array is read)."""
    hasher = hashlib.blake2b(digest_size=16)
    for field in sorted(payload.digests):
        hasher.update(f"{field}={payload.digests[field]};".encode())
    return hasher.hexdigest()


def _with_digests(payload: Payload) -> Payload:
    return dataclasses.replace(
        payload, digests={k: array_digest(v) for k, v in payload.arrays().items()}
    )


# ----------------------------------------------------------------------------------------------
# Packing layout -> token arrays
# ----------------------------------------------------------------------------------------------


def _segment_lengths(real: int, segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths of `segments` packed sequences filling `real` tokens, each at least 2 tokens.

    Cut points sit on multiples of SEGMENT_ALIGN when the row has at least one aligned unit per
    segment; otherwise they fall anywhere. Either way the lengths are a random composition
    (sorted uniform cut points), which cannot fail the way sampling distinct cut points from too
    small a population does.
    """
    if segments == 1:
        return np.array([real])
    units = real // SEGMENT_ALIGN
    if units >= segments:
        spare = units - segments  # aligned units beyond one per segment
        cuts = np.sort(rng.integers(0, spare + 1, segments - 1))
        lengths = (np.diff(cuts, prepend=0, append=spare) + 1) * SEGMENT_ALIGN
        lengths[-1] += real - units * SEGMENT_ALIGN
        return lengths
    spare = real - 2 * segments
    cuts = np.sort(rng.integers(0, spare + 1, segments - 1))
    return np.diff(cuts, prepend=0, append=spare) + 2


@dataclasses.dataclass(frozen=True)
class _Packing:
    """The micro-batch's packed sequences: per row its real length, and every sequence's extent."""

    real_lengths: np.ndarray  # [B]
    row: np.ndarray  # [S] row of each sequence
    start: np.ndarray  # [S] first token
    length: np.ndarray  # [S]
    prompt: np.ndarray  # [S] prompt tokens (>= 1), the rest is completion (>= 1)


def _draw_packing(layout: PackingLayout, rng: np.random.Generator) -> _Packing:
    rows, seq_len = layout.rows, layout.seq_len
    real_lengths = np.zeros(rows, np.int64)
    real_rows = np.sort(rng.permutation(rows)[: rows - layout.pad_rows])
    fractions = routing_profile.sample_quantiles(layout.real_fraction, rng.random(real_rows.size))
    real_lengths[real_rows] = np.clip(np.round(fractions * seq_len), 2, seq_len)
    wanted = routing_profile.sample_quantiles(layout.segments_per_row, rng.random(real_rows.size))
    row, start, length = [], [], []
    for b, count in zip(real_rows, np.round(wanted).astype(np.int64), strict=True):
        count = int(np.clip(count, 1, real_lengths[b] // 2))
        lengths = _segment_lengths(int(real_lengths[b]), count, rng)
        row.append(np.full(count, b))
        start.append(np.cumsum(lengths) - lengths)
        length.append(lengths)
    row, start, length = (np.concatenate(x) for x in (row, start, length))
    share = routing_profile.sample_quantiles(layout.prompt_fraction, rng.random(length.size))
    prompt = np.clip(np.round(share * length), 1, length - 1).astype(np.int64)
    return _Packing(real_lengths, row, start, length, prompt)


def _token_arrays(
    packing: _Packing, shape: tuple[int, int], vocab_size: int, group_size: int, rng
) -> dict[str, np.ndarray]:
    """Every [B, T] array of the contract, from the packing.

    `completion_mask` is input-aligned as `contract.Payload` defines it: 1 at t where token t+1 of
    the same sequence is a completion token.
    """
    rows = shape[0]
    segment_ids = np.zeros(shape, np.int32)
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
        ids = np.repeat(np.arange(1, lengths.size + 1, dtype=np.int32), lengths)
        starts = np.repeat(packing.start[mine], lengths)
        offset = np.arange(real) - starts
        segment_ids[b, :real] = ids
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


# ----------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------


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


def _draw_routing(
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


# ----------------------------------------------------------------------------------------------
# Calibration report
# ----------------------------------------------------------------------------------------------


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
    overflow: routing_profile.OverflowPrediction  # from the achieved loads
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


def _calibrate(
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
        achieved_max_load=routing_profile.max_load_ratio(achieved),
        tolerance=CALIBRATION_REL_TOL * target_max + sigmas * standard_error,
        target_shard_load=routing_profile.shard_max_load_ratio(profile.shares, shards),
        achieved_shard_load=routing_profile.shard_max_load_ratio(achieved, shards),
        expert_shards=shards,
        factor=engine.moe.ragged_buffer_factor,
        overflow=routing_profile.predict_overflow(
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


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuiltMicroBatch:
    payload: Payload
    calibration: CalibrationReport | None  # None when the micro-batch has no routed_experts
    seconds: float


def _streams(seed: int, index: int) -> list[np.random.Generator]:
    """Independent generators for packing, token arrays and routing, fixed by (seed, index)."""
    sequence = np.random.SeedSequence([seed, index, 0x9A7_10AD])
    return [np.random.default_rng(child) for child in sequence.spawn(3)]


def build_calibrated(
    engine: EngineConfig,
    profile: RoutingProfile,
    *,
    seed: int,
    index: int,
    name: str | None = None,
    layout: PackingLayout | None = None,
    replay: bool | None = None,
) -> BuiltMicroBatch:
    """One micro-batch and its calibration report; raises CalibrationError when loads miss.

    `ref_logps` is present when the engine's loss uses it (beta > 0); `routed_experts` when
    `replay` is True, by default when the engine replays routes (`moe.router_replay`).
    """
    if seed < 0 or index < 0:
        raise UserError(f"seed={seed}, index={index}: both must be >= 0")
    started = time.perf_counter()
    shape = (engine.micro_batch_rows, engine.seq_len)
    layout = (layout or profile.layout or PackingLayout(*shape)).for_shape(*shape)
    packing_rng, token_rng, routing_rng = _streams(seed, index)
    packing = _draw_packing(layout, packing_rng)
    arrays = _token_arrays(packing, shape, engine.model.vocab_size, layout.group_size, token_rng)
    if engine.loss.beta <= 0:
        del arrays["ref_logps"]
    calibration = None
    if engine.moe.router_replay if replay is None else replay:
        fitted = routing_profile.fit_to_model(profile, engine.model)
        routed, counts = _draw_routing(fitted, packing.real_lengths, engine.seq_len, routing_rng)
        arrays["routed_experts"] = routed
        calibration = _calibrate(engine, fitted, counts, int(packing.real_lengths.sum()))
        if calibration.missed_layers:
            worst = max(
                calibration.missed_layers,
                key=lambda i: abs(
                    calibration.achieved_max_load[i] - calibration.target_max_load[i]
                ),
            )
            raise CalibrationError(
                f"routing calibration missed in {len(calibration.missed_layers)} layer(s); worst: "
                f"layer {worst} max-load ratio {calibration.achieved_max_load[worst]:.3f} vs target "
                f"{calibration.target_max_load[worst]:.3f} (tolerance {calibration.tolerance[worst]:.3f})"
            )
    payload = _with_digests(Payload(**arrays, name=name or f"bench_{index}"))
    return BuiltMicroBatch(payload, calibration, time.perf_counter() - started)


def build_micro_batch(
    engine: EngineConfig,
    profile: RoutingProfile,
    *,
    seed: int,
    index: int,
    name: str | None = None,
    layout: PackingLayout | None = None,
    replay: bool | None = None,
) -> Payload:
    """One micro-batch with digests (see `build_calibrated` for which optional arrays it has)."""
    built = build_calibrated(
        engine, profile, seed=seed, index=index, name=name, layout=layout, replay=replay
    )
    return built.payload


def build_pool(
    engine: EngineConfig,
    profile: RoutingProfile,
    *,
    seed: int,
    count: int,
    layout: PackingLayout | None = None,
    replay: bool | None = None,
) -> list[Payload]:
    """`count` distinct micro-batches (indices 0..count-1), built before any timing starts."""
    if count < 1:
        raise UserError(f"count={count}: a pool needs at least one micro-batch")
    return [
        build_micro_batch(engine, profile, seed=seed, index=i, layout=layout, replay=replay)
        for i in range(count)
    ]


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def check_out_folder(path: str) -> str:
    """The folder `path` will be written in; UserError when it does not exist (checked before work)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--out {path}: folder {folder} does not exist; create it first")
    return folder


def save_npz(payload: Payload, path: str) -> None:
    """Write every array under its contract name, plus `name` and `digests`, atomically."""
    check_out_folder(path)
    write_atomically(
        path,
        lambda out: np.savez(
            out,
            **payload.arrays(),
            name=np.array(payload.name),
            digests=np.array([f"{k}={v}" for k, v in sorted(payload.digests.items())]),
        ),
    )


def load_npz(path: str, *, verify: bool = True) -> Payload:
    """A Payload from `save_npz`'s file, carrying the digests stored in it.

    With `verify`, every stored digest must match its array's content (UserError otherwise), so
    the payload's digests are true. Without it the stored digests are kept as they are, possibly
    stale, for `check` to report (`digest_mismatches`): recomputing them first would hide a change.
    A file without digests (from elsewhere) gets them computed. A file that is not a readable
    `.npz`, lacks a required array, or carries digests not written as `name=hex` is a UserError.
    """
    contents = _read_npz(path)
    required = [f for f in PAYLOAD_FIELDS if f not in OPTIONAL_PAYLOAD_FIELDS]
    missing = [f for f in required if f not in contents]
    if missing:
        raise UserError(
            f"micro-batch file {path}: no array {', '.join(missing)}; a payload holds "
            f"{', '.join(required)} (see `rl-trainer-bench payload`)"
        )
    arrays = {k: v for k, v in contents.items() if k in PAYLOAD_FIELDS}
    stored = _stored_digests(contents.get("digests"), path)
    name = contents.get("name")
    name = str(name) if name is not None and name.ndim == 0 else os.path.basename(path)
    payload = Payload(**arrays, name=name)
    if not stored:
        return _with_digests(payload)
    payload = dataclasses.replace(payload, digests=stored)
    if verify:
        stale = digest_mismatches(payload)
        if stale:
            raise UserError(
                f"micro-batch file {path}: {'; '.join(stale)}: the file was modified or corrupted"
            )
    return payload


def digest_mismatches(payload: Payload) -> list[str]:
    """How a payload's array digests disagree with its arrays ([] when they agree).

    Only digests named after contract arrays count (an example payload may carry others, such as
    its seed); a payload with none of them has nothing to disagree with.
    """
    arrays = payload.arrays()
    stored = {k: v for k, v in payload.digests.items() if k in PAYLOAD_FIELDS}
    if not stored:
        return []
    problems = [
        f"{name}: no array for the stored digest" for name in sorted(set(stored) - set(arrays))
    ]
    for name in sorted(arrays):
        if name not in stored:
            problems.append(f"{name}: no stored digest")
        elif array_digest(arrays[name]) != stored[name]:
            problems.append(f"{name}: content does not match its stored digest {stored[name]}")
    return problems


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """Every array of an .npz archive; UserError for anything that is not a whole, plain one."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise UserError(
                f"micro-batch file {path}: a single .npy array; pass the .npz that `payload` writes"
            )
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        if isinstance(error, UserError):
            raise
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(
            f"micro-batch file {path}: not a readable .npz ({reason}); pass the file `payload` wrote"
        ) from None


def _stored_digests(entries: np.ndarray | None, path: str) -> dict[str, str]:
    """The `digests` entry of a payload file as {array: hex}; {} when the file has none."""
    if entries is None or (entries.ndim == 1 and entries.size == 0):
        return {}
    malformed = UserError(
        f"micro-batch file {path}: malformed digests (expected a list of 'array=hex' strings); "
        "rebuild the file with `rl-trainer-bench payload`"
    )
    if entries.ndim != 1 or entries.dtype.kind != "U":
        raise malformed
    digests = {}
    for entry in entries.tolist():
        name, sep, digest = entry.partition("=")
        if not sep or name not in PAYLOAD_FIELDS or name in digests or not _is_hex(digest):
            raise malformed
        digests[name] = digest
    return digests


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


# ----------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------


def engine_for(args) -> EngineConfig:
    """The preset's engine config (the `--preset` flag shared by `payload` and `check`)."""
    return find_preset(args.preset).engine


def layout_for(args, engine: EngineConfig) -> PackingLayout | None:
    """The layout from orchestrator flags, when `--max-prompt-length` is given."""
    if args.max_prompt_length is None and args.max_response_length is None:
        return None
    if args.max_prompt_length is None or args.max_response_length is None:
        raise UserError("--max-prompt-length and --max-response-length go together: give both")
    return PackingLayout.from_orchestrator(
        engine.micro_batch_rows,
        engine.seq_len,
        args.max_prompt_length,
        args.max_response_length,
        num_generations=args.num_generations,
        pad_rows=args.pad_rows,
    )


def layout_from_orchestrator_argv(engine: EngineConfig, argv: Sequence[str]) -> PackingLayout:
    """The packing layout of the orchestrator whose argv is `argv` (ORCH_ARGV).

    Reads `--max_prompt_length` and `--max_response_length` (both required), `--num_generations`
    (default 16) and `--pad_rows` (default 0); the micro-batch's rows and length stay the engine's.
    """
    flags = parse_trainer_argv(list(argv))
    missing = [k for k in ("max_prompt_length", "max_response_length") if k not in flags]
    if missing:
        raise UserError(
            f"ORCH_ARGV lacks --{' and --'.join(missing)}: the packing layout needs both lengths"
        )
    values = {}
    for key, default in (
        ("max_prompt_length", None),
        ("max_response_length", None),
        ("num_generations", "16"),
        ("pad_rows", "0"),
    ):
        text = flags.get(key, default)
        try:
            values[key] = int(text)
        except ValueError:
            raise UserError(f"ORCH_ARGV --{key}={text!r}: write a whole number") from None
    return PackingLayout.from_orchestrator(
        engine.micro_batch_rows,
        engine.seq_len,
        values["max_prompt_length"],
        values["max_response_length"],
        num_generations=values["num_generations"],
        pad_rows=values["pad_rows"],
    )


def run_payload(args) -> int:
    """`rl-trainer-bench payload`: build one micro-batch, print its calibration, write it."""
    if not args.out.endswith(".npz"):
        raise UserError(f"--out {args.out}: the micro-batch is written as .npz; name it FILE.npz")
    check_out_folder(args.out)
    engine = engine_for(args)
    shipped = find_preset(args.preset).routing_profile
    profile = routing_profile.load_profile(args.routing_profile, shipped)
    built = build_calibrated(
        engine,
        profile,
        seed=args.seed,
        index=args.index,
        layout=layout_for(args, engine),
        replay=False if args.no_routed_experts else None,
    )
    if built.calibration is not None:
        print(built.calibration.format())
    save_npz(built.payload, args.out)
    payload = built.payload
    print(
        f"{payload.name}: {payload.shape[0]} x {payload.shape[1]} tokens, "
        f"{int((payload.segment_ids > 0).sum())} real, {payload.nbytes / 1e9:.3f} GB, "
        f"built in {built.seconds:.2f} s, digest {payload_digest(payload)} -> {args.out}"
    )
    return 0


def run_profile_routing(args) -> int:
    """`rl-trainer-bench profile-routing`: a profile from a run's routed-experts dump."""
    try:
        dump = np.load(args.dump, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"routing dump {args.dump}: cannot read as .npy ({reason})") from None
    if not isinstance(dump, np.ndarray):
        dump.close()
        raise UserError(
            f"routing dump {args.dump}: an .npz archive; pass one .npy array of routed experts "
            "(np.save(path, routed))"
        )
    if args.out is not None:
        check_out_folder(args.out)
    profile = routing_profile.profile_from_dump(
        dump,
        layout=args.layout,
        num_experts=args.num_experts,
        description=args.description or f"extracted from {os.path.basename(args.dump)}",
    )
    text = json.dumps(profile.to_json(), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_text_atomically(args.out, text)
    ratios = profile.max_load_ratio
    print(
        f"{args.out}: {profile.num_layers} layers, {profile.num_experts} experts, top-{profile.top_k}; "
        f"max-load ratio {ratios.min():.2f}..{ratios.max():.2f}",
        file=sys.stderr,
    )
    return 0
