"""A machine whose step time drifts linearly: the block order's delta carries the drift, the
mirrored order's does not, and the drift itself is measured and warned about.

Tolerance: with the drift below (step time falls 1 ms per second of run from 100 ms, 20 steps per
arm, about 2 s per arm), the block order's delta is about one arm's worth of drift, -2 ms; a design
passes as unbiased when its delta stays within 10% of that (0.2 ms) without jitter (later arms are
shorter, so a mirrored order's arms are not quite symmetric in time), and when, with
1% jitter per step, its mean delta over 20 seeded runs stays within 0.3 ms (a single run's median
wanders by about 0.6 ms: the drift spreads each setting's pooled steps over 8 ms).
"""

import re
import statistics

import pytest
from ab_synthetic import drifting_arms

from rl_trainer_bench.ab import drift as ab_drift
from rl_trainer_bench.ab import report as ab_report
from rl_trainer_bench.ab import score as ab_score

SLOPE = -1e-3  # seconds of step time per second of run
ARM_S = 20 * 0.1  # scored seconds per arm, roughly


def _delta(order, rel_sd=0.0, seed=0):
    runs = drifting_arms(order, base_s=0.1, slope=SLOPE, steps=20, rel_sd=rel_sd, seed=seed)
    result = ab_score.score(runs, min_effect_pct=1.0)
    return result, result.deltas[0].delta_s


def test_block_order_turns_a_linear_drift_into_a_delta():
    _, delta = _delta(["off", "on", "off", "on"])
    assert delta == pytest.approx(SLOPE * ARM_S, rel=0.15)  # about -2 ms: "on" looks faster


def test_mirrored_order_cancels_a_linear_drift():
    _, delta = _delta(["off", "on", "on", "off"])
    assert abs(delta) < 0.1 * abs(SLOPE * ARM_S)


def test_mirrored_order_for_three_settings_cancels_it_for_every_setting():
    runs = drifting_arms(
        ["a", "b", "c", "c", "b", "a"], base_s=0.1, slope=SLOPE, steps=20, rel_sd=0.0
    )
    for delta in ab_score.score(runs, min_effect_pct=1.0).deltas:
        assert abs(delta.delta_s) < 0.1 * abs(SLOPE * ARM_S), delta.name


def test_with_jitter_the_mirrored_delta_is_unbiased_and_the_block_delta_is_not():
    block = [_delta(["off", "on", "off", "on"], rel_sd=0.01, seed=s)[1] for s in range(20)]
    mirrored = [_delta(["off", "on", "on", "off"], rel_sd=0.01, seed=s)[1] for s in range(20)]
    assert abs(sum(mirrored) / 20) < 0.3e-3
    assert sum(block) / 20 == pytest.approx(SLOPE * ARM_S, rel=0.15)


def test_drift_is_measured_within_and_across_arms():
    result, _ = _delta(["off", "on", "off", "on"])
    drift = result.drift
    assert drift.across_run == pytest.approx(SLOPE, rel=0.02)
    assert drift.within_arms == pytest.approx(SLOPE, rel=0.02)
    assert all(s == pytest.approx(SLOPE, rel=0.02) for s in drift.per_arm.values())
    assert drift.span_s == pytest.approx(4 * ARM_S, rel=0.1)
    assert drift.moved_s == pytest.approx(abs(drift.across_run) * drift.span_s)
    assert drift.bias_s["on"] == pytest.approx(SLOPE * ARM_S, rel=0.15)


@pytest.mark.parametrize("order", [["off", "on"], ["off", "on", "off", "on"]])
def test_an_effect_is_not_mistaken_for_drift(order):
    runs = drifting_arms(order, base_s=0.1, slope=0.0, steps=20, effect_s={"on": -0.02})
    result = ab_score.score(runs, min_effect_pct=1.0)
    assert result.drift.across_run == pytest.approx(0.0, abs=1e-9)
    assert not result.drift.exceeds_min_effect
    assert result.deltas[0].delta_s == pytest.approx(-0.02)


def test_report_warns_when_drift_exceeds_the_min_effect_and_says_what_the_order_does():
    result, _ = _delta(["off", "on", "off", "on"])
    runs = drifting_arms(["off", "on", "off", "on"], base_s=0.1, slope=SLOPE, steps=20)
    lines = "\n".join(ab_report.design_lines(runs, result))
    assert "design: separate arms, run order off, on, off', on': on runs 1 arm(s) later" in lines
    assert re.search(
        r"drift: within arms -6\d\.\d\d ms/min, across the run -6\d\.\d\d ms/min", lines
    )
    assert re.search(r"WARNING: drift moved step time 7\.\d\d ms over the run", lines)
    assert "more than the min effect 0.97 ms" in lines
    assert "puts about -2." in lines and "ms of drift into delta on-off" in lines


def test_no_warning_when_the_drift_stays_under_the_min_effect():
    runs = drifting_arms(["off", "on", "on", "off"], base_s=0.1, slope=-1e-5, steps=20)
    result = ab_score.score(runs, min_effect_pct=1.0)
    lines = "\n".join(ab_report.design_lines(runs, result))
    assert "every setting centred on the same moment" in lines
    assert "WARNING" not in lines


def test_runs_from_separate_pods_restart_the_clock_and_measure_within_arms_only():
    runs = drifting_arms(["off", "on"], base_s=0.1, slope=SLOPE, steps=20)
    steps = ab_drift.timed_steps(runs, shared_clock=False)
    assert steps[0].clock_s == pytest.approx(steps[20].clock_s, rel=0.2)
    result = ab_score.score(runs, min_effect_pct=1.0, cross_pod=True)
    assert result.drift.across_run is None and result.drift.bias_s == {}
    assert result.drift.within_arms == pytest.approx(SLOPE, rel=0.05)


def test_a_setting_is_the_mean_of_its_arm_medians_not_a_pooled_median():
    """Under a steep drift each setting's steps form an early and a late cluster; a pooled median
    lands anywhere in the gap between them (0.40 ms spread over these 40 seeds), the mean of arm
    medians does not (0.21 ms). Bound: 0.3 ms."""
    deltas = []
    for seed in range(40):
        runs = drifting_arms(
            ["off", "on", "on", "off"], base_s=0.1, slope=-3e-3, steps=8, rel_sd=0.005, seed=seed
        )
        deltas.append(ab_score.score(runs, min_effect_pct=1.0).deltas[0].delta_s)
    assert statistics.pstdev(deltas) < 0.3e-3


def test_a_stray_step_does_not_move_the_measured_slope():
    """The slope is the median over every two steps of an arm (Theil and Sen's): one step 50 ms
    off among ten on the line changes no middle pair's slope, where a least-squares or mean slope
    would tilt."""
    steps = [
        ab_drift.TimedStep("off", "off", clock_s=float(i), step_s=0.1 + SLOPE * i)
        for i in range(10)
    ]
    steps[7] = ab_drift.TimedStep("off", "off", clock_s=7.0, step_s=0.1 + SLOPE * 7 + 0.05)
    found = ab_drift.measure(steps, baseline="off", shared_clock=False, min_effect_s=0.001)
    assert found.within_arms == pytest.approx(SLOPE, rel=1e-9)
    assert found.per_arm["off"] == pytest.approx(SLOPE, rel=1e-9)
