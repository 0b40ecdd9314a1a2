"""A routing profile from a real run: a dump of its routed experts (`[B, T, L, K]` or
`[B, L, T, K]`, -1 on padding), as `rl-trainer-bench profile-routing` reads it.

The dump is checked before it is counted (integer ids in range, four axes, no token routed to one
expert twice, each refused naming row, token, layer and expert), then read into per-layer expert
shares and the packing layout its padding shows (real lengths as quantiles).
"""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.payload.errors import ProfileError
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.routing_profile import RoutingProfile

QUANTILE_POINTS = 11  # quantiles stored for an extracted distribution (0%, 10%, ..., 100%)
MAX_EXPERT_ID = int(np.iinfo(np.int16).max)  # the payload contract stores routed experts as int16


DUMP_LAYOUTS = ("BTLK", "BLTK")


def routed_expert_counts(
    routed: np.ndarray, num_experts: int, *, layout: str = "BTLK"
) -> np.ndarray:
    """Pairs routed to each expert, per layer ([L, E] int64), ignoring -1 (padding) slots.

    Walks the array one row at a time so a memory-mapped dump of many gigabytes is never copied
    whole. A token's top-k experts are distinct; a dump that routes one token to one expert twice
    (a broken export, or a slot filler other than -1) would inflate that expert's load, so it is
    refused naming the first such token.
    """
    if layout not in DUMP_LAYOUTS:
        raise ProfileError(
            f"--layout {layout!r} is unknown: choose one of {', '.join(DUMP_LAYOUTS)}"
        )
    if routed.ndim != 4:
        raise ProfileError(f"routed experts have shape {routed.shape}: expected 4 axes ({layout})")
    layer_axis = 2 if layout == "BTLK" else 1
    num_layers = routed.shape[layer_axis]
    counts = np.zeros((num_layers, num_experts), dtype=np.int64)
    for index, row in enumerate(routed):
        row = np.asarray(row)
        _refuse_repeated_expert(row, index, layout)
        per_layer = np.moveaxis(row, layer_axis - 1, 0).reshape(num_layers, -1)
        keys = per_layer.astype(np.int64) + (np.arange(num_layers) * num_experts)[:, None]
        keys = keys[per_layer >= 0]
        counts += np.bincount(keys, minlength=num_layers * num_experts).reshape(counts.shape)
    return counts


def _refuse_repeated_expert(row: np.ndarray, index: int, layout: str) -> None:
    """ProfileError naming the first token of dump row `index` whose slots repeat an expert.

    The row is sorted in its own layout (slots last and contiguous), which is several times faster
    than sorting a transposed view.
    """
    ordered = np.sort(row, axis=-1)
    repeated = ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any(axis=-1)
    if not repeated.any():
        return
    token, layer = (int(i) for i in np.argwhere(repeated if layout == "BTLK" else repeated.T)[0])
    slots = row[token, layer] if layout == "BTLK" else row[layer, token]
    ordered_slots = np.sort(slots)
    expert = int(
        ordered_slots[1:][(ordered_slots[1:] == ordered_slots[:-1]) & (ordered_slots[1:] >= 0)][0]
    )
    raise ProfileError(
        f"routing dump: row {index}, token {token}, layer {layer} routes to expert {expert} twice "
        f"(slots {slots.tolist()}); a token's top-k experts are distinct, so its load would "
        "count twice: fix the dump"
    )


def _quantiles(values: np.ndarray) -> tuple[float, ...]:
    return tuple(
        round(float(v), 6) for v in np.quantile(values, np.linspace(0, 1, QUANTILE_POINTS))
    )


def profile_from_dump(
    routed: np.ndarray,
    *,
    layout: str = "BTLK",
    num_experts: int | None = None,
    description: str = "",
) -> RoutingProfile:
    """A profile (loads and the padding part of the layout) from a run's routed experts.

    A dump of routed experts knows which tokens are padding (all slots -1) but not where packed
    sequences start, so segments per row and the prompt split keep the defaults of PackingLayout.
    `num_experts` defaults to the largest expert id seen plus one; pass it when the hottest
    experts may be unused.
    """
    _check_dump_array(routed, layout)
    num_experts = _dump_expert_count(routed, num_experts)
    counts = routed_expert_counts(routed, num_experts, layout=layout)
    packing = _dump_packing_layout(routed, layout)
    return RoutingProfile(
        num_experts=num_experts,
        top_k=routed.shape[3],
        num_layers=counts.shape[0],
        shares=_dump_shares(counts),
        layout=packing,
        synthetic=False,
        description=description,
    )


def _check_dump_array(routed: np.ndarray, layout: str) -> None:
    """Refuse a dump that is not four axes of integer expert ids with something in each axis."""
    if not np.issubdtype(routed.dtype, np.integer):
        raise ProfileError(f"routed experts have dtype {routed.dtype}: expected integer expert ids")
    if routed.ndim != 4:
        raise ProfileError(f"routed experts have shape {routed.shape}: expected 4 axes ({layout})")
    if routed.size == 0:
        raise ProfileError(
            f"routed experts have shape {routed.shape}: an axis is empty ({layout}); pass a dump "
            "with at least one row, token, layer and slot"
        )


def _dump_expert_count(routed: np.ndarray, num_experts: int | None) -> int:
    """The expert count of a dump: `num_experts` if given and consistent, else the top id plus one.

    Ids out of range usually mean a wrong dtype or --layout, so they are refused with that hint.
    """
    lowest = min(int(np.min(row)) for row in routed)
    highest = max(int(np.max(row)) for row in routed)
    if lowest < -1:
        raise ProfileError(
            f"expert id {lowest} in the dump: ids are 0 and up, or -1 for an empty slot "
            "(is the dump's dtype or --layout right?)"
        )
    if highest > MAX_EXPERT_ID:
        raise ProfileError(
            f"expert id {highest} in the dump: micro-batches store expert ids as int16 (at most "
            f"{MAX_EXPERT_ID}); is the dump's dtype or --layout right?"
        )
    if highest < 0:
        raise ProfileError("routed experts hold no routed token (every slot is -1)")
    if num_experts is None:
        return highest + 1
    if not highest < num_experts <= MAX_EXPERT_ID + 1:
        raise ProfileError(
            f"--num-experts {num_experts}: the dump routes to expert {highest}; pass a count above "
            f"{highest} and at most {MAX_EXPERT_ID + 1}"
        )
    return num_experts


def _dump_packing_layout(routed: np.ndarray, layout: str) -> PackingLayout:
    """The padding part of the layout: a token is real when any of its slots routes somewhere."""
    time_axis = 1 if layout == "BTLK" else 2
    other_axes = (1, 2) if layout == "BTLK" else (0, 2)  # of one row: all but the token axis
    real_tokens = np.array(
        [int((np.asarray(row).max(axis=other_axes) >= 0).sum()) for row in routed]
    )
    rows, seq_len = routed.shape[0], routed.shape[time_axis]
    real_rows = real_tokens[real_tokens > 0]
    return PackingLayout(
        rows=rows,
        seq_len=seq_len,
        pad_rows=int((real_tokens == 0).sum()),
        real_fraction=_quantiles(real_rows / seq_len),
    )


def _dump_shares(counts: np.ndarray) -> np.ndarray:
    """Each layer's counts as shares of its pairs; a layer that routes none means a wrong layout."""
    routed_pairs = counts.sum(axis=1, keepdims=True)
    if (routed_pairs == 0).any():
        empty = int(np.flatnonzero(routed_pairs[:, 0] == 0)[0])
        raise ProfileError(f"layer {empty} of the dump routes no token: is --layout right?")
    return counts / routed_pairs
