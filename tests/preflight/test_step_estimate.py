"""The predicted step and MFU: arithmetic, labelling, and the facts read from micro-batch 0."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin.flops import micro_batch_flops
from rl_trainer_bench.payload import build
from rl_trainer_bench.payload.routing_profile import load_profile
from rl_trainer_bench.preflight import step_estimate

SECONDS = {"fwd_bwd": 2.0, "fwd_bwd_dropless": 3.0, "update": 0.5}


def _estimate(**changes) -> step_estimate.StepEstimate:
    fields = dict(
        micro_steps=9,
        program_seconds=SECONDS,
        replay_probability=0.2,
        model_flops_per_micro_batch=1e15,
        devices=256,
        peak_flops_per_device=1e12,
        bytes_per_second_per_device=1e12,
        replay_source="test",
    )
    return step_estimate.StepEstimate(**{**fields, **changes})


def test_step_is_micro_steps_of_fwd_bwd_and_expected_replays_plus_update():
    estimate = _estimate()
    assert estimate.step_seconds == pytest.approx(9 * (2.0 + 0.2 * 3.0) + 0.5)
    assert estimate.mfu == pytest.approx(9 * 1e15 / (estimate.step_seconds * 256 * 1e12))
    assert "9 x (fwd_bwd 2.000 s + P(replay) 0.2 x fwd_bwd_dropless 3.000 s)" in estimate.formula()


def test_every_other_program_of_an_engine_runs_once_per_micro_batch():
    """An engine with a separate accumulate program has it inside the parentheses."""
    estimate = _estimate(program_seconds={**SECONDS, "accumulate": 0.1})
    assert estimate.step_seconds == pytest.approx(9 * (2.0 + 0.1 + 0.2 * 3.0) + 0.5)
    assert "9 x (fwd_bwd 2.000 s + accumulate 100.000 ms + P(replay) 0.2" in estimate.formula()


def test_no_replay_needs_no_dropless_program():
    without_replay = {k: v for k, v in SECONDS.items() if k != "fwd_bwd_dropless"}
    estimate = _estimate(program_seconds=without_replay, replay_probability=0.0)
    assert estimate.step_seconds == pytest.approx(9 * 2.0 + 0.5)
    assert "P(replay)" not in estimate.formula()


def test_a_program_that_did_not_compile_leaves_no_step():
    estimate = _estimate(program_seconds={**SECONDS, "fwd_bwd_dropless": None})
    assert estimate.step_seconds is None and estimate.mfu is None
    assert "n/a" in estimate.formula()


def test_the_floor_is_compute_at_peak_without_replay_and_bounds_the_mfu():
    compute = {"fwd_bwd": 1.5, "fwd_bwd_dropless": 2.5, "update": 0.25}
    estimate = _estimate(compute_seconds=compute)
    assert estimate.step_floor_seconds == pytest.approx(9 * 1.5 + 0.25)  # no replay term
    assert estimate.mfu_ceiling == pytest.approx(9 * 1e15 / (13.75 * 256 * 1e12))
    assert estimate.mfu_ceiling > estimate.mfu
    assert _estimate().step_floor_seconds is None and _estimate().mfu_ceiling is None
    bounds = estimate.to_json()["bounds"]
    assert bounds["step_floor_seconds"] == pytest.approx(13.75)


def test_the_labels_claim_no_bound_for_the_roofline():
    assert "not a bound" in step_estimate.LABEL
    assert step_estimate.BOUND.startswith("LOWER BOUND")


def test_the_397b_cell_on_tpu7x_is_set_beside_the_public_measurement():
    estimate = _estimate(
        program_seconds={**SECONDS, "fwd_bwd": 21.89}, compute_seconds={"fwd_bwd": 2.189}
    )
    lines = step_estimate.public_comparison("qwen3.5-397b-cell", "tpu7x:4x4x8", estimate)
    assert lines[0].startswith("public, MEASURED by MaxText") and "fwd_bwd 10.945 s" in lines[0]
    assert lines[1] == "  fwd_bwd roofline estimate 21.890 s = 2.00 x the public"
    assert lines[2] == "  fwd_bwd compute lower bound 2.189 s = 0.20 x the public"
    assert step_estimate.public_comparison("cpu-tiny", "tpu7x:4x4x8", estimate) == []


def test_json_says_estimate_and_by_whom():
    document = _estimate().to_json()
    assert document["kind"] == "estimate" and document["measured"] is False
    assert "roofline" in document["by"] and "XLA" in document["by"]
    assert document["step_seconds"] == _estimate().step_seconds


def test_replay_probability_over_groups_and_layers():
    assert step_estimate.replay_probability(np.zeros(4), 100, 800) == 0.0
    # 8 groups, two layers: P(no overflow) = ((1 - 0.1) * (1 - 0.2)) ** 8.
    expected = 1 - (0.9 * 0.8) ** 8
    assert step_estimate.replay_probability(np.array([0.1, 0.2]), 100, 800) == pytest.approx(
        expected
    )
    assert step_estimate.replay_probability(np.array([1.0, 0.0]), 100, 800) == 1.0


def test_facts_come_from_the_bench_first_micro_batch():
    config = preset("cpu-tiny").engine
    facts = step_estimate.micro_batch_facts(config, load_profile(None), seed=0)
    built = build.build_calibrated(config, load_profile(None), seed=0, index=0, replay=True)
    assert facts.model_flops == micro_batch_flops(config, built.payload.segment_ids, False)
    expected = step_estimate.replay_probability(
        built.calibration.overflow.overflow_probability,
        built.calibration.tokens_per_group,
        config.micro_batch_rows * config.seq_len,
    )
    assert facts.replay_probability == expected
    assert "calibration report of micro-batch 0 (seed 0" in facts.source
    never = dataclasses.replace(
        config, moe=dataclasses.replace(config.moe, retry_when_tokens_dropped=False)
    )
    quiet = step_estimate.micro_batch_facts(never, load_profile(None), seed=0)
    assert quiet.replay_probability == 0.0 and "never replays" in quiet.source
    assert quiet.model_flops == facts.model_flops


def test_an_engine_with_an_accumulating_program_runs_fwd_bwd_once_and_it_on_the_rest():
    """MaxText's engine: fwd_bwd on a step's first micro-batch, fwd_bwd_accum on the other 8."""
    seconds = {"fwd_bwd": 2.0, "fwd_bwd_accum": 3.0, "update": 0.5}
    estimate = _estimate(program_seconds=seconds, replay_probability=0.0)
    assert estimate.step_seconds == pytest.approx(2.0 + 8 * 3.0 + 0.5)
    assert "1 x fwd_bwd 2.000 s + 8 x fwd_bwd_accum 3.000 s + update" in estimate.formula()
    floors = _estimate(
        program_seconds=seconds,
        compute_seconds={"fwd_bwd": 1.0, "fwd_bwd_accum": 1.5, "update": 0.1},
    )
    assert floors.step_floor_seconds == pytest.approx(1.0 + 8 * 1.5 + 0.1)
