"""Is a micro-batch well formed? The first of `rl-trainer-bench check`'s two checks (the engine's
numerics knobs are the other, `engine_numerics.py`).

A malformed micro-batch does not crash an engine; it trains on garbage (a segment split in two
attends across a gap, a mask on padding adds tokens to the loss denominator, a repeated expert
takes two buffer slots) and the timing looks plausible. So every rule here names the row and
position where it is broken.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import OPTIONAL_PAYLOAD_FIELDS, PAYLOAD_FIELDS, Payload
from rl_trainer_bench.engine.payload_shapes import payload_shapes
from rl_trainer_bench.payload.digests import digest_mismatches

MAX_REPORTS_PER_RULE = 5  # positions named per broken rule; the rest are counted


def _positions(mask: np.ndarray) -> Iterator[tuple[int, ...]]:
    return (tuple(int(i) for i in index) for index in np.argwhere(mask))


def _report(rule: str, mask: np.ndarray, describe) -> list[str]:
    """One message per broken position (up to MAX_REPORTS_PER_RULE), then a count of the rest."""
    count = int(mask.sum())
    if not count:
        return []
    messages = []
    for index in _positions(mask):
        if len(messages) == MAX_REPORTS_PER_RULE:
            break
        messages.append(f"row {index[0]} position {index[1]}: {describe(*index)} [{rule}]")
    if count > MAX_REPORTS_PER_RULE:
        messages.append(f"... and {count - MAX_REPORTS_PER_RULE} more positions breaking [{rule}]")
    return messages


def _check_shapes(payload: Payload, engine: EngineConfig) -> list[str]:
    taken = payload_shapes(engine)
    expected = {name: shape for name, (shape, _dtype) in taken.items()}
    # what a file may carry beyond what this engine takes still has its one shape
    rows, seq_len, model = engine.micro_batch_rows, engine.seq_len, engine.model
    expected.setdefault("ref_logps", (rows, seq_len))
    expected.setdefault("routed_experts", (rows, seq_len, model.num_layers, model.top_k))
    problems = []
    beta = engine.loss.beta
    if (payload.ref_logps is not None) != (beta > 0):
        state = "present" if payload.ref_logps is not None else "missing"
        problems.append(
            f"ref_logps: {state} but loss.beta={beta:g}; the engine takes ref_logps exactly when "
            "beta > 0 [optional arrays]"
        )
    if (payload.extra_host_bytes is not None) != ("extra_host_bytes" in taken):
        state = "present" if payload.extra_host_bytes is not None else "missing"
        problems.append(
            f"extra_host_bytes: {state} but the engine's extra_host_bytes="
            f"{engine.extra_host_bytes}; the micro-batch carries the array exactly when that is"
            " above 0 [optional arrays]"
        )
    for name, (dtype, _rank) in PAYLOAD_FIELDS.items():
        array = getattr(payload, name)
        if array is None:
            if name not in OPTIONAL_PAYLOAD_FIELDS:
                problems.append(f"{name}: missing [shapes]")
            continue
        if array.dtype != dtype:
            problems.append(f"{name}: dtype {array.dtype}, the contract says {dtype} [dtypes]")
        if name in expected and array.shape != expected[name]:
            problems.append(f"{name}: shape {array.shape}, expected {expected[name]} [shapes]")
    return problems


def _segment_starts(segment_ids: np.ndarray) -> np.ndarray:
    """True where a real token begins a run of its segment id."""
    previous = np.concatenate(
        [np.zeros((segment_ids.shape[0], 1), segment_ids.dtype), segment_ids[:, :-1]], axis=1
    )
    return (segment_ids != 0) & (segment_ids != previous)


def _check_segments(payload: Payload) -> list[str]:
    """Segments are contiguous runs numbered 1, 2, ... in order; positions restart in each."""
    ids, positions = payload.segment_ids, payload.positions
    real = ids > 0
    starts = _segment_starts(ids)
    run_number = np.cumsum(starts, axis=1)  # 1 for the row's first run, 2 for the next, ...
    problems = _report(
        "segments contiguous and numbered in order",
        real & (ids != run_number),
        lambda b, t: (
            f"segment id {ids[b, t]} where run {run_number[b, t]} of the row begins or continues"
        ),
    )
    problems += _report(
        "segment ids >= 0",
        ids < 0,
        lambda b, t: f"segment id {ids[b, t]} (0 is padding, real segments count from 1)",
    )
    token = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    start_of_run = np.maximum.accumulate(np.where(starts, token, 0), axis=1)
    expected = token - start_of_run
    problems += _report(
        "positions restart at 0 in each segment",
        real & (positions != expected),
        lambda b, t: (
            f"position {positions[b, t]}, expected {expected[b, t]} (offset in its segment)"
        ),
    )
    return problems


def _check_masks(payload: Payload) -> list[str]:
    """completion_mask: 0/1, 0 on padding and on each segment's last token, one run per segment
    that ends at the segment's second-to-last token; advantages constant per segment."""
    ids, mask, advantages = payload.segment_ids, payload.completion_mask, payload.advantages
    real = ids > 0
    nxt = np.concatenate([ids[:, 1:], np.zeros((ids.shape[0], 1), ids.dtype)], axis=1)
    last_token = real & (nxt != ids)
    second_last = (
        np.concatenate([last_token[:, 1:], np.zeros((ids.shape[0], 1), bool)], axis=1) & real
    )
    problems = _report(
        "completion_mask is 0 or 1", (mask != 0) & (mask != 1), lambda b, t: f"value {mask[b, t]}"
    )
    problems += _report(
        "completion_mask is 0 on padding",
        ~real & (mask != 0),
        lambda b, t: "mask set on a padding token",
    )
    problems += _report(
        "completion_mask is 0 on a segment's last token (it has no next token)",
        last_token & (mask != 0),
        lambda b, t: f"mask set on the last token of segment {ids[b, t]}",
    )
    on = mask == 1
    following = np.concatenate([on[:, 1:], np.zeros((ids.shape[0], 1), bool)], axis=1)
    problems += _report(
        "completion is one run to the segment's end",
        real & on & ~following & ~second_last,
        lambda b, t: (
            f"completion of segment {ids[b, t]} stops before the segment's second-to-last token"
        ),
    )
    previous_advantage = np.concatenate([advantages[:, :1], advantages[:, :-1]], axis=1)
    starts = _segment_starts(ids)
    problems += _report(
        "advantages constant per segment",
        real & ~starts & (advantages != previous_advantage),
        lambda b, t: (
            f"advantage {advantages[b, t]:g} differs from the previous token's in segment {ids[b, t]}"
        ),
    )
    problems += _report(
        "advantages 0 on padding",
        ~real & (advantages != 0),
        lambda b, t: f"advantage {advantages[b, t]:g} on padding",
    )
    return problems


def loss_positions(payload: Payload) -> np.ndarray:
    """Where the loss reads a token's values: the completion mask where a next token exists."""
    ids = payload.segment_ids
    nxt = np.concatenate([ids[:, 1:], np.zeros((ids.shape[0], 1), ids.dtype)], axis=1)
    return (payload.completion_mask != 0) & (ids > 0) & (nxt == ids)


_FLOAT_FIELDS = ("advantages", "old_logps", "ref_logps")


def _check_finite(payload: Payload) -> list[str]:
    """Float values the loss reads are finite: NaN or inf there turns the loss and gradient NaN."""
    return _non_finite(payload, loss_positions(payload), "finite where the loss reads it")


def _non_finite(payload: Payload, where: np.ndarray, rule: str) -> list[str]:
    """One report per float field holding a non-finite value at a position of `where`."""
    problems = []
    for name in _FLOAT_FIELDS:
        values = getattr(payload, name)
        if values is not None:
            problems += _report(
                f"{name} {rule}",
                where & ~np.isfinite(values),
                lambda b, t, v=values, n=name: f"{n} is {v[b, t]}",
            )
    return problems


def payload_warnings(payload: Payload, engine: EngineConfig) -> list[str]:
    """What is allowed but worth knowing: non-finite values where the loss never reads them.

    A payload from elsewhere may hold -inf log-probs on prompt tokens; the engine masks them before
    any exponent (`engine/builtin/loss.py`), so they are harmless, but an adapter that misaligns the
    completion mask would move them into the loss.
    """
    if _check_shapes(payload, engine):
        return []
    return _non_finite(
        payload, ~loss_positions(payload), "non-finite where masked; the loss ignores it"
    )


def _check_token_ids(payload: Payload, vocab_size: int) -> list[str]:
    """Every input id indexes the embedding table (the engine embeds padding positions too)."""
    ids = payload.input_ids
    return _report(
        f"input ids in [0, {vocab_size})",
        (ids < 0) | (ids >= vocab_size),
        lambda b, t: f"input id {ids[b, t]} (vocab_size {vocab_size})",
    )


def _check_routed_experts(payload: Payload, num_experts: int) -> list[str]:
    """Experts in range and distinct per token and layer on real tokens; all -1 on padding.

    A -1 slot on a real token is allowed (docs/engine.md: it has weight 0 and takes no buffer slot).
    Works one row at a time so a 5 GB array is never copied whole.
    """
    routed = payload.routed_experts
    if routed is None:
        return []
    real = payload.segment_ids > 0
    out_of_range = np.zeros(real.shape, bool)
    repeated = np.zeros(real.shape, bool)
    padding_routed = np.zeros(real.shape, bool)
    for b in range(routed.shape[0]):
        row = routed[b]  # [T, L, K]
        out_of_range[b] = ((row < -1) | (row >= num_experts)).any(axis=(1, 2))
        ordered = np.sort(row, axis=-1)
        repeated[b] = ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any(
            axis=(1, 2)
        )
        padding_routed[b] = (row != -1).any(axis=(1, 2))
    problems = _report(
        f"experts in [0, {num_experts}) or -1",
        real & out_of_range,
        lambda b, t: (
            f"expert ids {_layer_slice(routed, b, t, (routed[b, t] < -1) | (routed[b, t] >= num_experts))}"
        ),
    )
    problems += _report(
        "experts distinct per token",
        real & repeated,
        lambda b, t: f"a token's experts repeat: {_first_repeat(routed[b, t])}",
    )
    problems += _report(
        "routed_experts -1 on padding",
        ~real & padding_routed,
        lambda b, t: f"padding token routed: {_layer_slice(routed, b, t, routed[b, t] != -1)}",
    )
    return problems


def _layer_slice(routed: np.ndarray, b: int, t: int, bad: np.ndarray) -> str:
    layer = int(np.flatnonzero(bad.any(axis=-1))[0])
    return f"layer {layer} has {routed[b, t, layer].tolist()}"


def _first_repeat(token: np.ndarray) -> str:
    for layer, experts in enumerate(token.tolist()):
        real = [e for e in experts if e >= 0]
        if len(set(real)) != len(real):
            return f"layer {layer} has {experts}"
    return "?"


def check_payload(payload: Payload, engine: EngineConfig) -> list[str]:
    """Every way `payload` breaks the contract for `engine`'s shapes; empty when it is well formed.

    Each message names the row and position (or the array, for shape and dtype problems) and
    ends with the rule in brackets.
    """
    problems = _check_shapes(payload, engine)
    if problems:
        return problems  # the per-token rules assume the contract's shapes
    problems += _check_segments(payload)
    problems += _check_token_ids(payload, engine.model.vocab_size)
    problems += _check_masks(payload)
    problems += _check_finite(payload)
    problems += _check_routed_experts(payload, engine.model.num_experts)
    problems += _check_digests(payload)
    return problems


def _check_digests(payload: Payload) -> list[str]:
    """Stored digests must match the arrays: a stale digest hides a change in on/off comparisons."""
    return [f"{problem} [digests]" for problem in digest_mismatches(payload)]
