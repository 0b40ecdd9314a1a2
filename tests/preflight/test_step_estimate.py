"""The predicted step and MFU: arithmetic, labelling, and the facts read from micro-batch 0."""

from __future__ import annotations

import dataclasses
import json

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


def _terms(compute, memory, kernel, moving, exposed):
    return {
        "compute_seconds": compute,
        "memory_seconds": memory,
        "kernel_seconds": kernel,
        "kernel_vector_seconds": 0.0,
        "collective_seconds": moving,
        "exposed_collective_seconds": exposed,
        "seconds": compute + memory + kernel + exposed,
    }


def test_the_step_terms_weigh_each_program_by_its_runs():
    terms = {
        "fwd_bwd": _terms(1.0, 0.5, 0.25, 0.5, 0.25),  # 2.0 s
        "fwd_bwd_dropless": _terms(2.0, 0.5, 0.0, 1.0, 0.5),  # 3.0 s
        "update": _terms(0.0, 0.5, 0.0, 0.0, 0.0),  # 0.5 s
    }
    estimate = _estimate(program_terms=terms)
    step = estimate.step_terms()
    # 9 fwd_bwd, 9 x 0.2 replays, one update
    assert step["compute_seconds"] == pytest.approx(9 * 1.0 + 1.8 * 2.0)
    assert step["memory_seconds"] == pytest.approx(9 * 0.5 + 1.8 * 0.5 + 0.5)
    assert step["exposed_collective_seconds"] == pytest.approx(9 * 0.25 + 1.8 * 0.5)
    assert step["seconds"] == pytest.approx(estimate.step_seconds)
    assert _estimate().step_terms() is None


def test_the_397b_cell_on_tpu7x_is_set_beside_the_public_measurement():
    terms = {
        "fwd_bwd": _terms(8.0, 2.0, 0.5, 3.0, 0.5),  # 11.0 s
        "fwd_bwd_dropless": _terms(8.0, 2.0, 0.5, 3.0, 0.5),
        "update": _terms(0.0, 0.5, 0.0, 0.0, 0.0),
    }
    estimate = _estimate(
        program_seconds={**SECONDS, "fwd_bwd": 11.0, "fwd_bwd_dropless": 11.0},
        compute_seconds={"fwd_bwd": 2.189},
        program_terms=terms,
        replay_probability=0.0,
    )
    lines = step_estimate.public_comparison("qwen3.5-397b-cell", "tpu7x:4x4x8", estimate)
    assert lines[0].startswith("public, MEASURED by MaxText") and "fwd_bwd 10.945 s" in lines[0]
    # 9 x 11.0 + 0.5 = 99.5 s against 100.007 s and 107.727 s
    assert lines[1] == (
        "  predicted step 99.500 s = 0.99 x the public step with STAGE on, 0.92 x off"
    )
    assert lines[2] == (
        "  its terms a step: compute-bound ops 72.000 s, HBM-bound ops 18.500 s, Pallas kernels"
        " 4.500 s (+ 0.0 us of their vector work), collectives exposed 4.500 s (of 27.000 s"
        " moving)"
    )
    assert lines[3] == "  fwd_bwd op estimate 11.000 s = 1.01 x the public"
    assert lines[4] == "  fwd_bwd compute lower bound 2.189 s = 0.20 x the public"
    assert step_estimate.public_comparison("cpu-tiny", "tpu7x:4x4x8", estimate) == []


def test_the_chip_check_is_read_from_its_file(tmp_path):
    path = tmp_path / "check.json"
    summary = {
        "cells": 14,
        "max_abs_error": 0.31,
        "median_abs_error": 0.2,
        "within_10_percent": 3,
        "signs_right_over_1_percent": 5,
        "changes_over_1_percent": 7,
    }
    path.write_text(json.dumps({"summary": summary, "rates": {"source": "v5e spec"}}))
    found = step_estimate.chip_check(path)
    line = step_estimate.chip_check_line(found)
    assert "within 10% on 3 of 14 measured tpu-v5e-1 cells, the largest error 31.0%" in line
    assert "the sign of 5 of 7 measured program changes over 1% right" in line
    assert step_estimate.chip_check(tmp_path / "absent.json") is None
    assert "no check found" in step_estimate.chip_check_line(None)


def test_json_says_estimate_and_by_whom():
    document = _estimate().to_json()
    assert document["kind"] == "estimate" and document["measured"] is False
    assert "op estimate" in document["by"] and "Pallas kernels" in document["by"]
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
