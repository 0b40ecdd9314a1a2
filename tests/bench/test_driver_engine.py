"""The driver with the real JAX engine on 8 host CPU devices (mesh 2x2x2).

STAGE_BEFORE_UPDATE must change when copies happen, never what is trained: on and off end with
bit-identical parameters and identical step lines apart from times, with and without replays.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("rl_trainer_bench.engine.builtin.jax_engine")
pytest.importorskip("rl_trainer_bench.payload.build")

from rl_trainer_bench.bench import step_record
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS


def tiny_config(replays: bool) -> BenchConfig:
    """cpu-tiny; with replays, buffers too small for the routing: micro-batches overflow and are
    replayed. Without, no dropless program to replay them: the programs the A/B tests' cpu-tiny
    compiles too (ENGINE_FLAGS=retry_when_tokens_dropped=false), from the session's cache."""
    preset = PRESETS["cpu-tiny"]
    moe = dataclasses.replace(
        preset.engine.moe,
        ragged_buffer_factor=0.5 if replays else preset.engine.moe.ragged_buffer_factor,
        retry_when_tokens_dropped=replays,
    )
    preset = dataclasses.replace(preset, engine=dataclasses.replace(preset.engine, moe=moe))
    return BenchConfig(preset=preset, steps=2, micro_steps=2, distinct_micro_batches=3)


STAGES = {
    "off": StageConfig(),
    "on": StageConfig(before_update=True, issue="after_last"),
    "on_before_last": StageConfig(before_update=True, issue="before_last"),
}


def run_fresh(replays: bool, stage: StageConfig):
    """A fresh engine (same seed, same initial parameters) running one arm."""
    bench = Bench(tiny_config(replays), lambda _: None)
    bench.setup()
    try:
        return bench.run(steps=2, stage=stage)
    finally:
        bench.close()


@pytest.fixture(scope="module", params=[False, True], ids=["no_replays", "replays"])
def arms(request):
    return request.param, {name: run_fresh(request.param, stage) for name, stage in STAGES.items()}


def _lines(result):
    """Step lines without times or the staged name (which only the staged arms print)."""
    return [
        step_record.without_times(step_record.format_line(dataclasses.replace(r, staged=None)))
        for r in result.records
    ]


def test_stage_on_and_off_end_bit_identical(arms):
    replays, results = arms
    off = results["off"]
    assert off.param_digest
    for name in ("on", "on_before_last"):
        assert results[name].param_digest == off.param_digest, name
        assert _lines(results[name]) == _lines(off), name
        assert results[name].updates == off.updates == 3
        assert results[name].stages == 3  # one per step, the last one's included
    assert (sum(r.replay_count for r in off.records) > 0) == replays


def test_stage_measures_a_hidden_fraction(arms):
    hidden = [r.stage_hidden for r in arms[1]["on"].records if r.staged]
    assert len(hidden) == 3 and all(h is None or 0.0 <= h <= 1.0 for h in hidden)


def test_no_recompiles_in_scored_steps(arms):
    assert all(result.recompiles == [] for result in arms[1].values())
