"""Calibrated micro-batch builder: a synthetic Payload shaped and routed like a production one.

The bench times the trainer on micro-batches it builds itself, off the clock. They must load the
MoE experts the way a production step does (a random-weight router would spread tokens evenly and
hide overflows, replays and expert-parallel imbalance), and they must be cheap enough that the
production cell's 5 GB micro-batch builds in seconds. A micro-batch is its packing (`packing`), its
token arrays (`tokens`), its routing (`routing`), checked against the profile (`calibration`) and
digested (`digests`).

Everything is deterministic in (seed, index): same inputs, byte-identical arrays and digests.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import Payload
from rl_trainer_bench.engine.payload_shapes import extra_bytes_per_token
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload import routing_profile
from rl_trainer_bench.payload.calibration import CalibrationError, CalibrationReport, calibrate
from rl_trainer_bench.payload.digests import with_digests
from rl_trainer_bench.payload.packing import PackingLayout, draw_packing
from rl_trainer_bench.payload.routing import draw_routing
from rl_trainer_bench.payload.routing_profile import RoutingProfile
from rl_trainer_bench.payload.tokens import token_arrays


@dataclasses.dataclass(frozen=True)
class BuiltMicroBatch:
    payload: Payload
    calibration: CalibrationReport | None  # None when the micro-batch has no routed_experts
    seconds: float


def _streams(seed: int, index: int) -> list[np.random.Generator]:
    """Independent generators for packing, token arrays, routing and `extra_host_bytes`' filler,
    fixed by (seed, index). A child's stream does not depend on how many follow it, so the filler's
    leaves every other array as it was without it."""
    sequence = np.random.SeedSequence([seed, index, 0x9A7_10AD])
    return [np.random.default_rng(child) for child in sequence.spawn(4)]


def micro_batch_layout(
    engine: EngineConfig, profile: RoutingProfile, layout: PackingLayout | None = None
) -> PackingLayout:
    """The packing layout of the engine's micro-batches: `layout` (the orchestrator's), else the
    routing profile's, else the defaults, fitted to the micro-batch's shape."""
    shape = (engine.micro_batch_rows, engine.seq_len)
    return (layout or profile.layout or PackingLayout(*shape)).for_shape(*shape)


def first_segment_ids(
    engine: EngineConfig, profile: RoutingProfile, seed: int, layout: PackingLayout | None = None
) -> np.ndarray:
    """The segment ids of the pool's first micro-batch (`build_calibrated` at index 0), without
    drawing its tokens or routes: what shape arithmetic on the micro-batch needs."""
    packing = draw_packing(micro_batch_layout(engine, profile, layout), _streams(seed, 0)[0])
    return packing.segment_ids((engine.micro_batch_rows, engine.seq_len))


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
    `replay` is True, by default when the engine replays routes (`moe.router_replay`);
    `extra_host_bytes` when the engine asks for filler bytes (`engine/payload_shapes.py`).
    """
    if seed < 0 or index < 0:
        raise UserError(f"seed={seed}, index={index}: both must be >= 0")
    started = time.perf_counter()
    shape = (engine.micro_batch_rows, engine.seq_len)
    layout = micro_batch_layout(engine, profile, layout)
    packing_rng, token_rng, routing_rng, filler_rng = _streams(seed, index)
    packing = draw_packing(layout, packing_rng)
    arrays = token_arrays(packing, shape, engine.model.vocab_size, layout.group_size, token_rng)
    if engine.loss.beta <= 0:
        del arrays["ref_logps"]
    per_token = extra_bytes_per_token(engine)
    if per_token:  # random bytes: nothing about them can make a copy cheaper than its size
        filler = filler_rng.bytes(shape[0] * shape[1] * per_token)
        arrays["extra_host_bytes"] = np.frombuffer(filler, np.uint8).reshape(*shape, per_token)
    calibration = None
    if engine.moe.router_replay if replay is None else replay:
        fitted = routing_profile.fit_to_model(profile, engine.model)
        routed, counts = draw_routing(fitted, packing.real_lengths, engine.seq_len, routing_rng)
        arrays["routed_experts"] = routed
        calibration = calibrate(engine, fitted, counts, int(packing.real_lengths.sum()))
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
    payload = with_digests(Payload(**arrays, name=name or f"bench_{index}"))
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
