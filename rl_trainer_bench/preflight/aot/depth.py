"""Compile shallow, report full depth: the depths compiled and the linear extrapolation between them.

The engine scans over layers, so a shallow compile is fast; `--layers N` compiles at N and 2N
layers and extrapolates every compiled figure linearly to the preset's depth, labelled ESTIMATE.
"""

from __future__ import annotations

import dataclasses

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot.arguments import FULL_DEPTH
from rl_trainer_bench.preflight.aot.compile import COST_FIELDS, MEMORY_FIELDS, ProgramMemory


def depths_to_compile(full_depth: int, layers: int, block: int = 1) -> list[int]:
    """The depths to compile: the full one, or `layers` and twice it. `block`: the length of the
    layer pattern (`layer_types`), which every depth must repeat whole (MaxText's Qwen3.5
    decoder scans 3 Gated DeltaNet layers and 1 attention layer as one block of 4)."""
    if layers < 0:
        raise UserError(
            f"--layers / AOT_LAYERS={layers}: expected {FULL_DEPTH} (full depth) or a positive"
            " count"
        )
    if layers % block:
        raise UserError(
            f"--layers / AOT_LAYERS={layers}: the preset's layers repeat in blocks of {block}"
            f" (layer_types); give a multiple of {block}"
        )
    if layers == FULL_DEPTH or 2 * layers >= full_depth:
        return [full_depth]
    return [layers, 2 * layers]


def with_layers(config: EngineConfig, layers: int) -> EngineConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, num_layers=layers))


def extrapolate(
    measured: list[list[ProgramMemory]], depths: list[int], full_depth: int
) -> list[ProgramMemory]:
    """Every compiled figure at `full_depth`, linear through the two depths that were compiled."""
    (low, high), (shallow, deep) = depths, measured
    rows = []
    for a, b in zip(shallow, deep, strict=True):
        if not (a.compiled and b.compiled):
            rows.append(b if not b.compiled else a)
            continue

        def scaled(x: float, y: float) -> float:
            return x + (y - x) * (full_depth - low) / (high - low)

        row = ProgramMemory(
            name=a.name,
            compile_seconds=a.compile_seconds + b.compile_seconds,
            unstated_kernels=b.unstated_kernels,
        )
        for field in MEMORY_FIELDS:
            setattr(row, field, round(scaled(getattr(a, field), getattr(b, field))))
        for field in COST_FIELDS:
            setattr(row, field, scaled(getattr(a, field), getattr(b, field)))
        if a.xla_optimal_seconds is not None and b.xla_optimal_seconds is not None:
            row.xla_optimal_seconds = scaled(a.xla_optimal_seconds, b.xla_optimal_seconds)
        for field in ("live_peak", "temp_block"):  # figures a backend may not give
            low_value, high_value = getattr(a, field), getattr(b, field)
            if low_value is not None and high_value is not None:
                setattr(row, field, round(scaled(low_value, high_value)))
        rows.append(row)
    return rows
