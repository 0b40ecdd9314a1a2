"""Routing profiles: what a production step looks like, so a synthetic micro-batch can look the same.

A profile holds, per MoE layer, the share of routed (token, expert) pairs each expert received, and
the packing layout of the step's micro-batches (padding rows, real lengths, segments per row,
prompt/completion split). With random weights a router spreads tokens almost evenly, which hides
the overflows, replays and expert-parallel imbalance that dominate a real step; the profile is how
the bench puts them back.

This module owns the profile's data: the JSON schema (`profiles/routing_profile.schema.json`,
documented in `profiles/README.md`), loading with one-line errors, and fitting a profile to an
engine whose expert count, top-k or depth differ (the rule is in `fit_to_model`). A profile is
extracted from a real run's routed experts in `routing_dump.py`; the load statistics it speaks in
are `expert_load.py`, its forecast of replays at an engine's settings `replay_forecast.py`.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

import jsonschema
import numpy as np

from rl_trainer_bench.engine.config import ModelConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.payload.errors import ProfileError
from rl_trainer_bench.payload.expert_load import max_load_ratio
from rl_trainer_bench.payload.packing import PackingLayout

PROFILE_FORMAT = "rl_trainer_bench.routing_profile"
PROFILE_VERSION = 1
DEFAULT_PROFILE = "default.json"
SCHEMA_FILE = "routing_profile.schema.json"


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
    # The outcome a synthetic profile's parameters were chosen to reproduce ('' = none): a
    # forecast of that outcome from the profile is no evidence, and the plan says so.
    chosen_to_match: str = ""
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
        if self.chosen_to_match:
            document["chosen_to_match"] = self.chosen_to_match
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
            chosen_to_match=document.get("chosen_to_match", ""),
        )
    except ProfileError as error:
        raise ProfileError(f"{origin}: {error}") from None


def load_profile(path: str | None, shipped: str = DEFAULT_PROFILE) -> RoutingProfile:
    """The profile at `path`, or the shipped profile `shipped` (a preset's) when `path` is None."""
    if path is None:
        text = resources.files("rl_trainer_bench.payload.profiles").joinpath(shipped).read_text()
        origin = f"shipped profile {shipped}"
    else:
        try:
            text = read_user_text(path, "routing profile")
        except UserError as error:
            raise ProfileError(str(error)) from None
        origin = f"routing profile {path}"
    try:
        document = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as error:
        raise ProfileError(f"{origin}: not JSON ({error.msg} at line {error.lineno})") from None
    except _RepeatedKey as repeated:
        raise ProfileError(
            f"{origin}: the key {repeated.args[0]!r} appears twice in one object; keep one"
        ) from None
    return parse_profile(document, origin)


class _RepeatedKey(ValueError):
    """A JSON object names one key twice (Python's reader would keep the last without a word)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _RepeatedKey(key)
        document[key] = value
    return document


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
