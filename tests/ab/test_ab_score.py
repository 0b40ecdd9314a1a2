"""The A/B scorer on synthetic step times: verdicts, their sign, the noise floor and the interval."""

import pytest
from ab_synthetic import arm, jittered, off_on_off_on

from rl_trainer_bench.ab import score as ab_score
from rl_trainer_bench.errors import UserError


def test_delta_well_above_noise_is_faster_with_negative_sign():
    result = ab_score.score(off_on_off_on(0.100, 0.090), min_effect_pct=2.0)
    (delta,) = result.deltas
    assert delta.verdict == ab_score.FASTER
    assert delta.name == "on-off"
    assert delta.delta_s == pytest.approx(-0.010, abs=0.002)
    assert delta.ci_low_s < delta.delta_s < delta.ci_high_s < 0


def test_delta_well_above_noise_is_slower_with_positive_sign():
    result = ab_score.score(off_on_off_on(0.100, 0.112), min_effect_pct=2.0)
    (delta,) = result.deltas
    assert delta.verdict == ab_score.SLOWER
    assert 0 < delta.ci_low_s < delta.delta_s
    assert delta.percent(delta.delta_s) == pytest.approx(12.0, abs=2.0)


def test_identical_arms_give_no_effect():
    result = ab_score.score(off_on_off_on(0.100, 0.100), min_effect_pct=2.0)
    (delta,) = result.deltas
    assert delta.verdict == ab_score.NO_EFFECT
    assert delta.ci_low_s <= 0 <= delta.ci_high_s


def test_wide_noise_floor_gives_noisy_even_when_the_interval_excludes_zero():
    # off' landed 15% above off: a 5% "effect" of on is inside what nothing-changed can do.
    runs = off_on_off_on(0.100, 0.095, repeat_off_s=0.115)
    result = ab_score.score(runs, min_effect_pct=2.0)
    (delta,) = result.deltas
    assert result.noise_floor_s == pytest.approx(0.015, abs=0.002)
    assert delta.verdict == ab_score.NOISY
    assert "noise floor" in delta.reason


def test_noise_floor_is_the_spread_of_repeated_setting_medians():
    runs = [
        arm("off", "off", [0.100] * 5),
        arm("on", "on", [0.100] * 5),
        arm("off'", "off", [0.104] * 5),
        arm("on'", "on", [0.101] * 5),
    ]
    result = ab_score.score(runs, min_effect_pct=2.0)
    assert {n.setting: n.seconds for n in result.noise} == pytest.approx(
        {"off": 0.004, "on": 0.001}
    )
    assert result.noise_floor_s == pytest.approx(0.004)


def test_warmup_steps_are_never_scored():
    runs = [arm("off", "off", [0.1] * 5, warmup_s=9.0), arm("on", "on", [0.1] * 5, warmup_s=0.001)]
    result = ab_score.score(runs, min_effect_pct=2.0)
    assert result.arms["off"].max_s == pytest.approx(0.1)
    assert result.arms["on"].steps == 5


def test_cross_pod_has_no_noise_floor_and_says_so():
    runs = [arm("a", "a", jittered(0.1, 20, 0.005, 1)), arm("b", "b", jittered(0.1, 20, 0.005, 2))]
    result = ab_score.score(runs, min_effect_pct=2.0, cross_pod=True)
    assert result.noise_floor_s is None
    assert "cross-pod" in result.rule
    assert result.deltas[0].verdict == ab_score.NO_EFFECT


def test_same_records_give_the_same_interval():
    first = ab_score.score(off_on_off_on(0.1, 0.099, rel_sd=0.05), min_effect_pct=2.0)
    second = ab_score.score(off_on_off_on(0.1, 0.099, rel_sd=0.05), min_effect_pct=2.0)
    assert first.deltas == second.deltas


def test_rule_is_printed_with_its_numbers():
    result = ab_score.score(off_on_off_on(0.100, 0.090), min_effect_pct=2.0)
    assert "noise floor" in result.rule and "min effect +-2 ms" in result.rule


def test_arm_without_scored_steps_is_refused():
    runs = [arm("off", "off", []), arm("on", "on", [0.1])]
    with pytest.raises(UserError, match="no scored steps"):
        ab_score.score(runs, min_effect_pct=2.0)


@pytest.mark.parametrize(
    ("delta", "low", "high", "floor", "word"),
    [
        (-0.010, -0.012, -0.008, 0.001, ab_score.FASTER),
        (0.010, 0.008, 0.012, 0.001, ab_score.SLOWER),
        (-0.010, -0.012, -0.008, 0.011, ab_score.NOISY),  # inside the floor
        (0.000, -0.001, 0.001, 0.001, ab_score.NO_EFFECT),
        (0.000, -0.001, 0.001, 0.003, ab_score.NOISY),  # floor wider than the min effect
        (0.000, -0.004, 0.004, 0.001, ab_score.NOISY),  # interval wider than the min effect
        (-0.003, -0.004, -0.002, None, ab_score.FASTER),  # no floor: min effect is the bar
        (-0.001, -0.0015, -0.0005, None, ab_score.NO_EFFECT),
    ],
)
def test_verdict_rule(delta, low, high, floor, word):
    assert ab_score.verdict(delta, low, high, floor, min_effect_s=0.002)[0] == word
