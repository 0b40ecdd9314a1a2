"""Routing profiles: what a production step looks like, so a synthetic micro-batch can look the same.

A profile holds, per MoE layer, the share of routed (token, expert) pairs each expert received, and
the packing layout of the step's micro-batches (padding rows, real lengths, segments per row,
prompt/completion split). With random weights a router spreads tokens almost evenly, which hides
the overflows, replays and expert-parallel imbalance that dominate a real step; the profile is how
the bench puts them back.

This module owns the profile's data: the JSON schema (`profiles/routing_profile.schema.json`,
documented in `profiles/README.md`), loading with one-line errors, fitting a profile to an engine
whose expert count, top-k or depth differ (the rule is in `fit_to_model`), extraction from a dump of
a real run's routed experts, and the load statistics both the builder's calibration report and the
profile speak in (max-load ratio, expert-parallel shard load, predicted overflow).
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from typing import Any

import jsonschema
import numpy as np

from rl_trainer_bench.engine.config import ModelConfig, expert_capacity
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.payload.errors import ProfileError
from rl_trainer_bench.payload.packing import PackingLayout

PROFILE_FORMAT = "rl_trainer_bench.routing_profile"
PROFILE_VERSION = 1
DEFAULT_PROFILE = "default.json"
SCHEMA_FILE = "routing_profile.schema.json"
QUANTILE_POINTS = 11  # quantiles stored for an extracted distribution (0%, 10%, ..., 100%)


MAX_EXPERT_ID = int(np.iinfo(np.int16).max)  # the payload contract stores routed experts as int16


# ----------------------------------------------------------------------------------------------
# Load statistics
# ----------------------------------------------------------------------------------------------


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
    p = np.clip(shares * top_k, 0.0, 1.0)
    mean = real * p
    sd = np.sqrt(np.maximum(real * p * (1 - p), 1e-12))
    z = (capacity + 0.5 - mean) / sd
    tail = 1.0 - _normal_cdf(z)
    density = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    excess = np.maximum(sd * density - (capacity + 0.5 - mean) * tail, 0.0)
    drop_fraction = excess.sum(axis=-1) / (real * top_k)
    overflow_probability = 1.0 - np.exp(np.log(np.clip(1.0 - tail, 1e-300, 1.0)).sum(axis=-1))
    return OverflowPrediction(capacity, drop_fraction, overflow_probability)


# ----------------------------------------------------------------------------------------------
# The profile
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoutingProfile:
    """Per-layer expert-load shares of a production step, and its packing layout.

    `shares[l, e]` is the fraction of layer l's routed (token, expert) pairs that went to expert
    e; each row sums to 1 and no entry exceeds 1/top_k (a token's K experts are distinct, so an
    expert can take at most one pair per token).
    """

    num_experts: int
    top_k: int
    num_layers: int
    shares: np.ndarray  # [L, E] float64
    layout: PackingLayout | None = None
    synthetic: bool = False
    description: str = ""
    fitted_from: str = ""  # how the profile was rescaled to the engine ("" = used as written)

    def __post_init__(self) -> None:
        _check_dims(self.num_experts, self.top_k, self.num_layers)
        shares = np.asarray(self.shares, dtype=np.float64)
        if shares.shape != (self.num_layers, self.num_experts):
            raise ProfileError(
                f"shares shape {shares.shape} != (num_layers={self.num_layers}, num_experts={self.num_experts})"
            )
        if not np.all(np.isfinite(shares)) or shares.min() < 0:
            raise ProfileError("expert loads must be finite and >= 0")
        if not np.allclose(shares.sum(axis=1), 1.0, atol=1e-6):
            raise ProfileError("each layer's expert shares must sum to 1")
        layer, expert = np.unravel_index(np.argmax(shares), shares.shape)
        if shares[layer, expert] > 1.0 / self.top_k + 1e-9:
            raise ProfileError(
                f"layers[{layer}] expert {expert} takes {shares[layer, expert]:.2%} of the routed "
                f"pairs, more than 1/top_k = {1 / self.top_k:.2%} (an expert takes at most one of "
                "a token's top_k pairs): check top_k or the loads"
            )
        object.__setattr__(self, "shares", shares)

    @property
    def max_load_ratio(self) -> np.ndarray:
        return max_load_ratio(self.shares)

    def to_json(self) -> dict[str, Any]:
        """The profile as its JSON document (histogram form, shares rounded to 9 digits)."""
        document: dict[str, Any] = {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "synthetic": self.synthetic,
            "description": self.description,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "num_layers": self.num_layers,
            "layers": [{"expert_load": [round(float(v), 9) for v in row]} for row in self.shares],
        }
        if self.layout is not None:
            document["layout"] = self.layout.to_json()
        return document


def _check_dims(num_experts: int, top_k: int, num_layers: int) -> None:
    if num_experts < 1 or top_k < 1 or num_layers < 1:
        raise ProfileError(
            f"num_experts={num_experts}, top_k={top_k}, num_layers={num_layers}: all must be >= 1"
        )
    if top_k > num_experts:
        raise ProfileError(
            f"top_k={top_k} > num_experts={num_experts}: a token's top_k experts are distinct, "
            "so top_k must be <= num_experts"
        )


def zipf_shares(num_experts: int, exponent: float, seed: int) -> np.ndarray:
    """Zipf-like loads: the expert of rank r gets a share proportional to (r + 1) ** -exponent.

    Ranks are assigned to experts by a permutation drawn from `seed`, so hot experts sit at
    different indices (and on different expert-parallel shards) in different layers.
    """
    weights = np.arange(1, num_experts + 1, dtype=np.float64) ** -exponent
    order = np.random.default_rng(seed).permutation(num_experts)
    shares = np.empty(num_experts)
    shares[order] = weights / weights.sum()
    return shares


def _layer_shares(index: int, layer: dict[str, Any], num_experts: int) -> np.ndarray:
    if "expert_load" in layer:
        loads = np.asarray(layer["expert_load"], dtype=np.float64)
        if loads.size != num_experts:
            raise ProfileError(
                f"layers[{index}].expert_load has {loads.size} entries but num_experts={num_experts}: "
                "give one load per expert"
            )
        total = loads.sum()
        if not total > 0:
            raise ProfileError(f"layers[{index}].expert_load sums to 0: no token was routed")
        return loads / total
    zipf = layer["zipf"]
    return zipf_shares(num_experts, float(zipf["exponent"]), int(zipf["seed"]))


def cap_shares(shares: np.ndarray, top_k: int) -> np.ndarray:
    """Shares with none above 1/top_k: the excess of capped experts goes to the others pro rata.

    Needed after rescaling to a larger top_k, where a share that was feasible becomes impossible
    (an expert can take at most one of each token's K pairs).
    """
    cap = 1.0 / top_k
    shares = shares.astype(np.float64, copy=True)
    for _ in range(shares.shape[-1]):
        over = shares > cap * (1 + 1e-12)
        if not over.any():
            break
        for row in np.flatnonzero(over.any(axis=-1)):
            at_cap = shares[row] >= cap * (1 - 1e-12)
            free = ~at_cap
            excess = 1.0 - cap * at_cap.sum()
            shares[row, at_cap] = cap
            free_load = shares[row, free].sum()
            if free_load > 0:
                shares[row, free] *= excess / free_load
            else:
                shares[row, free] = excess / free.sum()
    return shares


def _schema() -> dict[str, Any]:
    text = resources.files("rl_trainer_bench.payload.profiles").joinpath(SCHEMA_FILE).read_text()
    return json.loads(text)


def parse_profile(document: Any, origin: str = "profile") -> RoutingProfile:
    """A RoutingProfile from its JSON document; every problem is one ProfileError naming the field."""
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(_schema()).iter_errors(document)
    )
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ProfileError(f"{origin}: {where.lstrip('.') or 'document'}: {error.message}")
    num_experts, top_k, num_layers = (document[k] for k in ("num_experts", "top_k", "num_layers"))
    layers = document["layers"]
    try:
        _check_dims(num_experts, top_k, num_layers)
        if len(layers) != num_layers:
            raise ProfileError(
                f"layers has {len(layers)} entries but num_layers={num_layers}: "
                "give one entry per MoE layer"
            )
        shares = np.stack([_layer_shares(i, layer, num_experts) for i, layer in enumerate(layers)])
        layout = PackingLayout(**document["layout"]) if "layout" in document else None
        return RoutingProfile(
            num_experts=num_experts,
            top_k=top_k,
            num_layers=num_layers,
            shares=shares,
            layout=layout,
            synthetic=document["synthetic"],
            description=document.get("description", ""),
        )
    except ProfileError as error:
        raise ProfileError(f"{origin}: {error}") from None


def load_profile(path: str | None) -> RoutingProfile:
    """The profile at `path`, or the shipped default (synthetic) when `path` is None."""
    if path is None:
        text = (
            resources.files("rl_trainer_bench.payload.profiles")
            .joinpath(DEFAULT_PROFILE)
            .read_text()
        )
        origin = f"shipped profile {DEFAULT_PROFILE}"
    else:
        try:
            text = read_user_text(path, "routing profile")
        except UserError as error:
            raise ProfileError(str(error)) from None
        origin = f"routing profile {path}"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProfileError(f"{origin}: not JSON ({error.msg} at line {error.lineno})") from None
    return parse_profile(document, origin)


# ----------------------------------------------------------------------------------------------
# Fitting a profile to an engine
# ----------------------------------------------------------------------------------------------


def _resample_experts(shares: np.ndarray, num_experts: int, seed: int) -> np.ndarray:
    """Shares for `num_experts` experts with the same load curve (Lorenz curve) as `shares`.

    Each layer's shares, sorted in decreasing order, define the cumulative load carried by the
    hottest x fraction of experts; the new experts take equal slices of x, so "the hottest 10%
    of experts carry 30% of the load" stays true. Hot experts are then placed at indices drawn
    from `seed`, per layer.
    """
    source = shares.shape[-1]
    rng = np.random.default_rng(seed)
    x_source = np.arange(source + 1) / source
    x_target = np.arange(num_experts + 1) / num_experts
    out = np.empty((shares.shape[0], num_experts))
    for layer, row in enumerate(shares):
        curve = np.concatenate([[0.0], np.cumsum(np.sort(row)[::-1])])
        resampled = np.diff(np.interp(x_target, x_source, curve))
        out[layer, rng.permutation(num_experts)] = resampled
    return out / out.sum(axis=-1, keepdims=True)


def fit_to_model(profile: RoutingProfile, model: ModelConfig) -> RoutingProfile:
    """The profile rescaled to the model's num_layers, num_experts and top_k.

    The rule, applied only to what differs:
    - layers: engine layer i takes the profile layer at the same relative depth,
      round(i * (L_profile - 1) / (L_engine - 1));
    - experts: each layer's load curve is resampled (`_resample_experts`), keeping the share of
      load carried by the hottest fraction of experts;
    - top_k: shares are per routed pair, so they carry over; any share above the new 1/top_k is
      capped and its excess spread pro rata over the other experts (`cap_shares`).
    The result records what was done in `fitted_from`, which the calibration report prints.
    """
    wanted = (model.num_layers, model.num_experts, model.top_k)
    have = (profile.num_layers, profile.num_experts, profile.top_k)
    if wanted == have:
        return profile
    if model.top_k > model.num_experts:
        raise ProfileError(f"engine top_k={model.top_k} > num_experts={model.num_experts}")
    shares = profile.shares
    if model.num_layers != profile.num_layers:
        if model.num_layers == 1:
            picks = np.array([0])
        else:
            picks = np.round(
                np.arange(model.num_layers) * (profile.num_layers - 1) / (model.num_layers - 1)
            ).astype(int)
        shares = shares[picks]
    if model.num_experts != profile.num_experts:
        shares = _resample_experts(shares, model.num_experts, seed=model.num_experts)
    shares = cap_shares(shares, model.top_k)
    return dataclasses.replace(
        profile,
        num_layers=model.num_layers,
        num_experts=model.num_experts,
        top_k=model.top_k,
        shares=shares,
        fitted_from=f"L={have[0]} E={have[1]} K={have[2]}",
    )


# ----------------------------------------------------------------------------------------------
# Extraction from a real run's routed experts
# ----------------------------------------------------------------------------------------------

DUMP_LAYOUTS = ("BTLK", "BLTK")


def routed_expert_counts(
    routed: np.ndarray, num_experts: int, *, layout: str = "BTLK"
) -> np.ndarray:
    """Pairs routed to each expert, per layer ([L, E] int64), ignoring -1 (padding) slots.

    Walks the array one row at a time so a memory-mapped dump of many gigabytes is never copied
    whole.
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
    for row in routed:
        per_layer = np.moveaxis(np.asarray(row), layer_axis - 1, 0).reshape(num_layers, -1)
        keys = per_layer.astype(np.int64) + (np.arange(num_layers) * num_experts)[:, None]
        keys = keys[per_layer >= 0]
        counts += np.bincount(keys, minlength=num_layers * num_experts).reshape(counts.shape)
    return counts


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
