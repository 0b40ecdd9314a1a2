"""Exact checks across arms: each passes on a healthy A/B and fails on records broken the way it guards."""

import dataclasses

import pytest
from ab_synthetic import arm, off_on_off_on

from rl_trainer_bench.ab import checks as ab_checks


def _status(runs, check):
    return check(runs).status


def test_healthy_ab_passes_every_check():
    results = ab_checks.exact_checks(off_on_off_on(0.1, 0.09))
    assert [r.status for r in results] == [ab_checks.PASS] * len(ab_checks.CHECKS)
    assert not ab_checks.failed(results)


def test_different_micro_batch_content_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[2].records[3].digests[1] = "digest-of-something-else"
    result = ab_checks.same_micro_batches(runs)
    assert result.status == ab_checks.FAIL
    assert "off'" in result.detail


def test_micro_batches_in_another_order_fail():
    runs = off_on_off_on(0.1, 0.09)
    records = runs[1].records
    records[1], records[2] = records[2], records[1]
    assert _status(runs, ab_checks.same_micro_batches) == ab_checks.FAIL


def test_an_arm_with_fewer_micro_batches_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[3].records[-1].digests.pop()
    runs[3].records[-1].micro_batches.pop()
    assert _status(runs, ab_checks.same_micro_batches) == ab_checks.FAIL


def test_records_without_digests_fail():
    runs = off_on_off_on(0.1, 0.09)
    for run in runs:
        for record in run.records:
            record.digests = []
    assert _status(runs, ab_checks.same_micro_batches) == ab_checks.FAIL


def test_arms_that_warmed_up_for_other_numbers_of_steps_fail_naming_the_warm_up():
    """Two engines' runs warm up as each needs (the built-in one step, MaxText's two): their
    steps train other micro-batches, and the checks say why, not only that the counts differ."""
    runs = [arm("builtin", "builtin", [0.1, 0.1, 0.1]), arm("maxtext", "maxtext", [0.2, 0.2])]
    runs[1].records[1] = dataclasses.replace(runs[1].records[1], warmup=True)
    for check in (ab_checks.same_micro_batches, ab_checks.same_loss_denominators):
        result = check(runs)
        assert (result.status, result.detail) == (
            ab_checks.FAIL,
            "builtin warmed up 1 step(s), maxtext 2: their scored steps train other"
            " micro-batches; give every run the same WARMUP_STEPS (--warmup-steps)",
        ), check.__name__


def test_different_loss_denominator_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[1].records[4].loss_denominator += 1.0
    result = ab_checks.same_loss_denominators(runs)
    assert result.status == ab_checks.FAIL
    assert "step 4" in result.detail


def test_missing_update_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[3].updates -= 1
    assert _status(runs, ab_checks.same_updates) == ab_checks.FAIL


def test_two_updates_per_step_in_every_arm_fails():
    runs = off_on_off_on(0.1, 0.09)
    for run in runs:
        run.updates = 2 * len(run.records)
    result = ab_checks.same_updates(runs)
    assert result.status == ab_checks.FAIL
    assert "in 21 steps" in result.detail


def test_arm_that_ran_fewer_steps_and_updates_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[2].records.pop()
    runs[2].updates -= 1
    result = ab_checks.same_updates(runs)
    assert result.status == ab_checks.FAIL
    assert "off': 20" in result.detail


def test_unknown_update_counts_are_skipped_not_passed():
    runs = off_on_off_on(0.1, 0.09)
    runs[0].updates = None
    assert _status(runs, ab_checks.same_updates) == ab_checks.SKIP


def test_staged_arm_missing_a_stage_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[1].stages -= 1
    assert _status(runs, ab_checks.one_stage_per_boundary) == ab_checks.FAIL


def test_staged_arm_staging_the_wrong_micro_batch_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[3].records[2].staged = "bench_2_1"
    result = ab_checks.one_stage_per_boundary(runs)
    assert result.status == ab_checks.FAIL
    assert "bench_2_1" in result.detail


def test_unstaged_arm_that_staged_fails():
    runs = off_on_off_on(0.1, 0.09)
    runs[0].records[0].staged = "bench_1_0"
    runs[0].stages = 1
    assert _status(runs, ab_checks.one_stage_per_boundary) == ab_checks.FAIL


def test_stage_count_from_records_when_the_driver_count_is_unknown():
    runs = off_on_off_on(0.1, 0.09)
    for run in runs:
        run.stages = None
    assert _status(runs, ab_checks.one_stage_per_boundary) == ab_checks.PASS
    runs[1].records[1].staged = None
    assert _status(runs, ab_checks.one_stage_per_boundary) == ab_checks.FAIL


def test_a_staged_arm_whose_last_step_staged_nothing_fails():
    """A run that stages only between two of its own steps leaves its last step's stage out: at
    one scored step per turn, the staged setting would never have been timed."""
    runs = off_on_off_on(0.1, 0.09)
    runs[1].records[-1].staged = None
    runs[1].stages -= 1
    result = ab_checks.one_stage_per_boundary(runs)
    assert result.status == ab_checks.FAIL
    assert "on: 20 stages over 21 boundaries, expected 21" in result.detail


def test_one_step_turns_of_a_staged_setting_that_never_staged_fail():
    runs = [arm("off", "off", [0.1]), arm("on", "on", [0.1], staged=True)]
    for run in runs:
        run.records = run.records[1:]  # a turn scored from its first step: no warm-up
        run.updates = 1
    runs[1].stages = 1
    assert ab_checks.one_stage_per_boundary(runs).status == ab_checks.PASS
    runs[1].records[0].staged, runs[1].stages = None, 0
    result = ab_checks.one_stage_per_boundary(runs)
    assert result.status == ab_checks.FAIL
    assert result.detail == "staged arm on: 0 stages over 1 boundaries, expected 1"


def test_arms_none_of_which_stages_are_skipped_never_passed():
    runs = [arm("a", "a", [0.1, 0.1]), arm("b", "b", [0.1, 0.1])]
    result = ab_checks.one_stage_per_boundary(runs)
    assert result.status == ab_checks.SKIP
    assert "no arm stages" in result.detail


def test_a_staged_setting_staging_only_in_warm_up_steps_is_skipped_not_passed():
    """Staging that never reached a scored step checked nothing the verdict speaks of."""
    runs = [arm("off", "off", []), arm("on", "on", [], staged=True)]
    assert ab_checks.one_stage_per_boundary(runs).status == ab_checks.SKIP


def test_arms_with_nothing_scored_fail_the_checks_that_count_steps():
    runs = [arm("off", "off", []), arm("on", "on", [])]
    for run in runs:
        run.records, run.updates = [], 0
    for check in (
        ab_checks.same_micro_batches,
        ab_checks.same_loss_denominators,
        ab_checks.same_updates,
        ab_checks.no_scored_recompiles,
        ab_checks.finite_metrics,
    ):
        assert check(runs).status == ab_checks.FAIL, check.__name__


@pytest.mark.parametrize("where", ["arm", "record"])
def test_recompile_in_a_scored_step_fails(where):
    runs = off_on_off_on(0.1, 0.09)
    if where == "arm":
        runs[2].recompiles = ["fwd_bwd"]
    else:
        runs[2].records[5] = dataclasses.replace(runs[2].records[5], recompiles=1)
    result = ab_checks.no_scored_recompiles(runs)
    assert result.status == ab_checks.FAIL
    assert "off'" in result.detail


def test_recompile_in_a_warmup_step_is_allowed():
    runs = off_on_off_on(0.1, 0.09)
    runs[0].records[0] = dataclasses.replace(runs[0].records[0], recompiles=2)
    assert _status(runs, ab_checks.no_scored_recompiles) == ab_checks.PASS


def test_a_nan_loss_in_any_arm_fails_and_survives_a_round_trip_through_json():
    runs = off_on_off_on(0.1, 0.09)
    assert ab_checks.finite_metrics(runs).status == ab_checks.PASS
    broken = runs[2].records[1]
    broken.loss = float("nan")
    result = ab_checks.finite_metrics(runs)
    assert (result.status, result.detail) == (ab_checks.FAIL, "off' step 1: loss not finite")
    assert [r.name for r in ab_checks.failed(ab_checks.exact_checks(runs))] == [result.name]
    data = broken.to_json()
    assert (data["loss"], data["non_finite"]) == (None, ["loss"])
    assert type(broken).from_json(data).non_finite == ["loss"]
