"""Write the qwen3.5-397b-cell's default routing profile from the published replay facts.

The one public fact about this cell's routing is the measured run's: 0 dropped tokens and 0
replays at `ragged_buffer_factor=2.75` with `num_moe_token_chunks=2` (MaxText, 128 Ironwood chips,
mesh 32 x 4 x 2, 64 rows of 65,536 tokens). That bounds the hottest expert's load from above: a
group of 8,192 tokens gives an expert 2.75 x its mean share of slots, and no group of any layer
overflowed. The profile keeps the depth shape of the shipped synthetic profile (hottest expert over
the mean: 1 + s (0.8 + 1.4 sin(0.75 pi d)) at depth d in [0, 1], Zipf-like over the experts, seeded
rank placement) and takes the largest s for which the profile itself forecasts P(replay) <= 0.001
per micro-batch at the measured settings, with every token of every group real (the worst case).
It is the most skewed routing consistent with the published facts, so it forecasts as many
replays at other settings as those facts allow. Its numbers are derived, not measured; a dump of a
real run's routed experts (`rl-trainer-bench profile-routing`) replaces it.

Usage: PYTHONPATH=. python benchmarks/routing_profile_397b.py [--out FILE]
(default: rl_trainer_bench/payload/profiles/qwen3.5-397b.json). Prints s, the hottest-expert ratio
per depth and the forecast P(replay) at a few buffer settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MoeConfig
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.replay_forecast import predicted_replay
from rl_trainer_bench.payload.routing_profile import RoutingProfile, zipf_shares

CELL = PRESETS["qwen3.5-397b-cell"].engine
MEASURED = {"ragged_buffer_factor": 2.75, "token_chunks": 2}  # the public run's, 0 replays
BUDGET = 1e-3  # forecast P(replay) per micro-batch allowed at the measured settings
OUT = Path("rl_trainer_bench/payload/profiles/qwen3.5-397b.json")
E, K, L = 512, 10, 60


def exponent_for(ratio: float) -> float:
    """The Zipf exponent whose hottest expert carries `ratio` x the mean load over E experts."""
    low, high = 0.0, 2.0
    for _ in range(60):
        middle = (low + high) / 2
        weights = np.arange(1, E + 1, dtype=float) ** -middle
        low, high = (middle, high) if E * weights[0] / weights.sum() < ratio else (low, middle)
    return round((low + high) / 2, 4)


def ratios(scale: float) -> list[float]:
    return [
        1 + scale * (0.8 + 1.4 * math.sin(math.pi * 0.75 * layer / (L - 1))) for layer in range(L)
    ]


def profile(scale: float, layout: PackingLayout) -> RoutingProfile:
    shares = np.stack(
        [zipf_shares(E, exponent_for(r), 1000 + layer) for layer, r in enumerate(ratios(scale))]
    )
    return RoutingProfile(E, K, L, shares, layout=layout, synthetic=True)


def forecast(scale: float, layout: PackingLayout, factor: float, chunks: int) -> float:
    engine = dataclasses.replace(
        CELL, moe=MoeConfig(ragged_buffer_factor=factor, token_chunks=chunks)
    )
    return predicted_replay(profile(scale, layout), engine).probability


def solve_scale(layout: PackingLayout) -> float:
    """The largest s (to 3 decimals, rounded down) within BUDGET at the measured settings."""
    full = dataclasses.replace(layout, real_fraction=(1.0, 1.0), pad_rows=0)
    low, high = 0.0, 1.0
    for _ in range(30):
        middle = (low + high) / 2
        within = forecast(middle, full, **_measured_args()) <= BUDGET
        low, high = (middle, high) if within else (low, middle)
    return math.floor(low * 1000) / 1000


def _measured_args() -> dict:
    return {"factor": MEASURED["ragged_buffer_factor"], "chunks": MEASURED["token_chunks"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    layout = PackingLayout.from_orchestrator(64, 65536, 4096, 61440, num_generations=16)
    scale = solve_scale(layout)
    shown = ratios(scale)
    layers = [
        {"zipf": {"exponent": exponent_for(r), "seed": 1000 + layer}}
        for layer, r in enumerate(shown)
    ]
    document = {
        "format": "rl_trainer_bench.routing_profile",
        "version": 1,
        "synthetic": True,
        "description": (
            "DERIVED from the published facts, not measured: the measured qwen3.5-397b run had 0"
            " drops and 0 replays at ragged_buffer_factor=2.75 with num_moe_token_chunks=2"
            " (mesh 32 x 4 x 2, 64 rows of 65,536 tokens). Zipf-like loads per layer with the"
            f" hottest expert at 1 + s (0.8 + 1.4 sin(0.75 pi depth)) x the mean, s = {scale},"
            f" the largest s that forecasts P(replay) <= {BUDGET} per micro-batch there with every"
            f" token real: {shown[0]:.3f}x at the first layer, {max(shown):.3f}x at its peak,"
            f" {shown[-1]:.3f}x at the last. Made by benchmarks/routing_profile_397b.py; replace"
            " it with `rl-trainer-bench profile-routing` output from your run."
        ),
        "num_experts": E,
        "top_k": K,
        "num_layers": L,
        "layers": layers,
        "layout": layout.to_json(),
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"s = {scale}; hottest expert / mean: first {shown[0]:.3f}, peak {max(shown):.3f}")
    written = RoutingProfile(E, K, L, profile(scale, layout).shares, layout=layout)
    for factor, chunks in ((2.75, 2), (2.75, 1), (2.0, 4), (2.0, 2), (1.25, 1)):
        engine = dataclasses.replace(
            CELL, moe=MoeConfig(ragged_buffer_factor=factor, token_chunks=chunks)
        )
        print(f"factor {factor}, {chunks} chunk(s): {predicted_replay(written, engine).describe()}")


if __name__ == "__main__":
    main()
