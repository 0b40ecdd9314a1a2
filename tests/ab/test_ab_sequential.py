"""The A/B that stops when its verdict is settled (ab/sequential.py, ab/sequential_forecast.py):
its spending of the error rate over the looks, the look it stops at, its false claims at no
effect, and the forecast the plan prints."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from ab_synthetic import arm
from scipy import stats
from stand_in_engine import TimedEngine, drifting_sleep
from test_ab_command import Benches, run_ab

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.ab import sequential, sequential_forecast
from rl_trainer_bench.ab.sequential import Looks


def test_the_looks_spend_one_percent_in_all_and_half_of_it_at_the_first():
    looks = Looks(8)
    assert list(looks.units) == list(range(3, 9))
    # 1% ln(1 + (e - 1) 3/8), worked by hand: ln(1.644356) = 0.497348
    assert looks.alpha(3) == pytest.approx(0.00497348, abs=1e-8)
    assert sum(looks.alpha(n) for n in looks.units) == pytest.approx(0.01, abs=1e-15)
    assert all(looks.alpha(n) > 0 for n in looks.units)
    assert "99.5% at the first look, 99.92% at the last" in looks.rule()
    # Student's t at 3 degrees of freedom: two-sided at a_3 for a claim, one-sided for NO-EFFECT
    assert looks.claim_quantile(3, 3) == pytest.approx(stats.t.ppf(1 - 0.00497348 / 2, 3))
    assert looks.no_effect_quantile(3, 3) == pytest.approx(stats.t.ppf(1 - 0.00497348, 3))


def test_a_run_is_cut_into_half_blocks_each_setting_once():
    assert sequential.halves(["off", "on", "on", "off", "on", "off"]) == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
    ]
    assert sequential.halves(["off", "on", "on"]) is None
    assert sequential.halves(["off", "off", "on", "on"]) is None


def _arms(off_s, on_s):
    """Arms in ABBA order, one scored step a turn: off_s[i] and on_s[i] in the i-th half-block."""
    runs = []
    for i, (off, on) in enumerate(zip(off_s, on_s, strict=True)):
        pair = [("off", off), ("on", on)] if i % 2 == 0 else [("on", on), ("off", off)]
        runs += [arm(f"{name}#{i}", name, [t]) for name, t in pair]
    return runs


def _fit_by_hand(off_s, on_s):
    """The effect, its standard error and degrees of freedom of arms laid out by `_arms`, by
    least squares (numpy's lstsq) on a level, the effect and the place in the run: the fit where
    no step is clipped."""
    y, on = [], []
    for i, (off, other) in enumerate(zip(off_s, on_s, strict=True)):
        pair = [(0, off), (1, other)] if i % 2 == 0 else [(1, other), (0, off)]
        on += [s for s, _ in pair]
        y += [t for _, t in pair]
    place = np.arange(len(y)) - (len(y) - 1) / 2
    x = np.column_stack([np.ones(len(y)), on, place])
    beta, residual, *_ = np.linalg.lstsq(x, np.array(y), rcond=None)
    df = len(y) - 3
    error = math.sqrt(residual[0] / df * np.linalg.inv(x.T @ x)[1, 1])
    return beta[1], error, df


def test_a_large_effect_stops_at_the_first_look_with_its_level_interval():
    """Three steps a setting, no step clipped (their residuals are within 1.345 scales): the
    look's delta is least squares' and its interval Student's t at 3 degrees of freedom, at the
    first look's level, on Huber's standard error (least squares' times sqrt(1.0525) at a scale
    that, with nothing clipped, is the root mean square residual over sqrt(0.7101))."""
    off = [100.0, 100.2, 99.9]
    on = [107.1, 107.4, 107.2]
    runs = _arms(off, on)
    assert sequential.look(runs[:4], Looks(8), 0.5, "off") is None  # two half-blocks: no look
    look = sequential.look(runs, Looks(8), 0.5, "off")
    delta_s, error, df = _fit_by_hand(off, on)
    assert df == 3
    half_width = stats.t.ppf(1 - 0.00497348 / 2, 3) * error * math.sqrt(1.0525 / 0.7101)
    (delta,) = look.deltas
    assert delta.delta_s == pytest.approx(delta_s, abs=1e-9)
    assert (delta.ci_low_s, delta.ci_high_s) == pytest.approx(
        (delta_s - half_width, delta_s + half_width), rel=1e-3
    )
    assert delta.verdict == "SLOWER" and look.settled and not look.last
    assert "look after half-block 3 (99.5% CI): on-off +7.2" in look.line()


def test_the_score_is_the_first_settled_looks_and_names_where_it_stopped():
    # settled at the third half-block; a fourth, whatever it holds, is not looked at
    runs = _arms([100.0, 100.2, 99.9, 100.0], [107.1, 107.4, 107.2, 90.0])
    score = sequential.score(runs, Looks(8), min_effect_pct=0.5, baseline="off")
    assert [look["units"] for look in score.looks] == [3]
    by_hand, _, _ = _fit_by_hand([100.0, 100.2, 99.9], [107.1, 107.4, 107.2])
    assert score.deltas[0].delta_s == pytest.approx(by_hand, abs=1e-9)
    assert score.confidence == pytest.approx(1 - 0.00497348, abs=1e-8)
    assert "Stopped at the look after half-block 3 of 8: every verdict settled" in score.stopping
    assert len(score.blocks) == 3


def test_an_unsettled_run_goes_on_to_the_budgets_last_look():
    rng = np.random.default_rng(3)
    off = 100 + rng.normal(0, 1.0, 6)
    on = 100.3 + rng.normal(0, 1.0, 6)  # 0.3% against a 1% step noise: not settled in 6
    score = sequential.score(_arms(off, on), Looks(6), min_effect_pct=0.5, baseline="off")
    assert [look["units"] for look in score.looks] == [3, 4, 5, 6]
    assert score.deltas[0].verdict == "NOISY"
    assert "the budget's last look, on-off still NOISY" in score.stopping


# The chip's no-effect series (STAGE off vs on, tpu-v5e-1, steps of ~2058 ms, 0.2% noise: each
# turn within 2047-2069 ms, as the eleven), in ms, one step a turn, ABBA BAAB order
CHIP_OFF = [2058.1, 2059.2, 2058.8, 2054.4, 2053.2, 2059.4, 2059.8, 2065.8]
CHIP_ON = [2055.5, 2059.7, 2058.7, 2057.1, 2052.7, 2052.0, 2066.0, 2056.0]
CHIP_STRAY_MS = 2155.0  # the chip's `on#6`: +4.7%


def _chip_arms(on_ms):
    return _arms([t / 1000 for t in CHIP_OFF], [t / 1000 for t in on_ms])


@pytest.mark.parametrize("stray", range(8))
def test_one_stray_step_neither_moves_the_verdict_nor_widens_it_past_the_min_effect(stray):
    """The chip's series says NO-EFFECT within 6 half-blocks (6 scored steps per setting); with
    its stray 2155 ms step put in any one `on` turn it still says NO-EFFECT, within 6, with its
    NO-EFFECT interval inside +-min effect (0.5% of the step: 10.3 ms). Scored as the run before
    this design scored it (one difference of turn medians per half-block), the stray step made
    every later look NOISY (the issue's run)."""
    clean = sequential.score(_chip_arms(CHIP_ON), Looks(8), min_effect_pct=0.5, baseline="off")
    assert clean.deltas[0].verdict == "NO-EFFECT" and clean.looks[-1]["units"] <= 6
    on = list(CHIP_ON)
    on[stray] = CHIP_STRAY_MS
    score = sequential.score(_chip_arms(on), Looks(8), min_effect_pct=0.5, baseline="off")
    (delta,) = score.deltas
    assert delta.verdict == "NO-EFFECT" and score.looks[-1]["units"] <= 6
    assert (
        -score.min_effect_s <= delta.no_effect_low_s
        and delta.no_effect_high_s <= score.min_effect_s
    )
    assert abs(delta.delta_s - clean.deltas[0].delta_s) < 0.003  # 3 ms: a stray 97 ms step


# The chip's run of a 1.4% effect (`ab --arms off,more:extra_device_work=5e11`, tpu-v5e-1,
# 2026-12-06, benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md): its turns in run order, one
# scored step each, in ms. Its first scored `off` step took 1977.45 ms, 4.5% over the other three.
CHIP_EFFECT_RUN = [
    ("more", 1918.59),
    ("off", 1977.45),
    ("off", 1892.15),
    ("more", 1918.60),
    ("off", 1891.98),
    ("more", 1918.07),
    ("more", 1918.22),
    ("off", 1892.66),
]


def test_a_stray_step_at_the_first_look_is_set_aside_there():
    """On the chip, Huber's fit alone could not tell the stray step at the first look (6 steps
    for 3 parameters): the noise read 2.32% and the interval [-275, +276] ms, NOISY, and the run
    went on a look. The steps' outlier test sets it aside there: SLOWER at the first look, the
    effect that of the other steps, the interval inside the min effect."""
    runs = [arm(f"{name}#{i}", name, [ms / 1000]) for i, (name, ms) in enumerate(CHIP_EFFECT_RUN)]
    score = sequential.score(runs, Looks(8), min_effect_pct=0.5, baseline="off")
    (delta,) = score.deltas
    assert score.looks[-1]["units"] == 3 and delta.verdict == "SLOWER"
    assert 0.0260 < delta.delta_s < 0.0266  # 1918.4 - 1892.1 ms, by the steps without the stray
    assert delta.ci_high_s - delta.ci_low_s < score.min_effect_s
    (aside,) = score.looks[-1]["set_aside"]["step"]
    assert (aside["label"], aside["step"]) == ("off#1", 0) and aside["value_s"] == pytest.approx(
        1.97745
    )
    assert aside["scales"] > 5


# The chip's run of a 7.1% effect (`ab --arms off,more:extra_device_work=4.3e12`, tpu-v5e-1,
# 2026-12-06, benchmarks/reports/chip-round-3_tpu-v5e_2026-12-06.md), its turns as they ran: the
# last `more` step took 2118.46 ms, 92 ms over the other two.
CHIP_LARGE_EFFECT_RUN = [
    ("more", 2026.41),
    ("off", 1891.96),
    ("off'", 1891.53),
    ("more'", 2026.04),
    ("off#3", 1892.01),
    ("more#3", 2118.46),
]


def test_the_look_and_the_report_name_the_step_they_set_aside(tmp_path):
    runs = [arm(label, label.rstrip("'#3"), [ms / 1000]) for label, ms in CHIP_LARGE_EFFECT_RUN]
    score = sequential.score(runs, Looks(8), min_effect_pct=0.5, baseline="off")
    (delta,) = score.deltas
    assert delta.verdict == "SLOWER" and 0.1341 < delta.delta_s < 0.1347  # 2026.2 - 1891.8 ms
    (aside,) = score.looks[-1]["set_aside"]["step"]
    assert (aside["label"], aside["step"]) == ("more#3", 0) and aside["value_s"] == pytest.approx(
        2.11846
    )
    look = sequential.look(runs, Looks(8), 0.5, "off")
    assert "set aside: more#3 step 0 (2118 ms, +" in look.line()
    assert "set aside: more#3 step 0 (2118 ms" in score.stopping
    clean = [*runs[:-1], arm("more#3", "more", [2.02620])]
    assert "set aside" not in sequential.look(clean, Looks(8), 0.5, "off").line()


def test_a_step_set_aside_from_steps_that_fit_exactly_is_named_without_a_scale():
    """Steps alike to the bit (a stand-in engine's) leave the fit no spread to measure the stray
    one by: it is named with no scale, and ab.json stays valid JSON (no Infinity)."""
    steps = [("more", 1.1), ("off", 1.0), ("off'", 1.0), ("more'", 1.1), ("off#3", 1.0)]
    runs = [arm(label, label.rstrip("'#3"), [s]) for label, s in [*steps, ("more#3", 1.3)]]
    look = sequential.look(runs, Looks(8), 0.5, "off")
    assert "set aside: more#3 step 0 (1300 ms, off a fit of no spread)" in look.line()
    (aside,) = json.loads(json.dumps(look.to_json(), allow_nan=False))["set_aside"]["step"]
    assert aside["scales"] is None


def test_the_forecasts_vectorised_rule_stops_where_the_scorer_does():
    """The plan's simulation and the run's scorer are two implementations of one rule: on the
    same steps' fits they stop at the same look with the same verdict."""
    rng = np.random.default_rng(7)
    looks = Looks(8)
    # no effect, one inside the 0.5 min effect and one past it, at 0.2% noise: every kind of stop
    effects = np.repeat([[0.0], [0.3], [0.6]], 20, axis=0)
    rows = 100 + rng.normal(0.0, 0.2, (60, 8, 2))
    rows[:, :, 1] += effects
    delta = np.zeros((60, 6))
    error = np.zeros_like(delta)
    df = np.zeros((60, 6), dtype=int)
    scores = []
    for r, row in enumerate(rows):
        runs = _arms(list(row[:, 0]), list(row[:, 1]))
        for column, units in enumerate(looks.units):
            look = sequential.look(runs[: 2 * units], looks, 0.5, "off")
            (d,) = look.deltas
            half_width = (d.ci_high_s - d.ci_low_s) / 2
            df[r, column] = look.steps - 3
            delta[r, column] = d.delta_s
            error[r, column] = half_width / looks.claim_quantile(units, int(df[r, column]))
        scores.append(sequential.score(runs, looks, min_effect_pct=0.5, baseline="off"))
    stop, verdict = sequential_forecast.stops(delta, error, looks, df, 0.5)
    names = {
        sequential_forecast.CLAIMED: ("FASTER", "SLOWER"),
        sequential_forecast.NO_EFFECT: ("NO-EFFECT",),
        sequential_forecast.NOISY: ("NOISY",),
    }
    seen = set()
    for score, units, word in zip(scores, stop, verdict, strict=True):
        assert score.looks[-1]["units"] == units
        assert score.deltas[0].verdict in names[word]
        seen.add((int(units) == 8, int(word)))
    # early and last stops, each verdict, were all exercised
    assert {word for _, word in seen} == {0, 1, 2} and {last for last, _ in seen} == {True, False}


def test_with_no_effect_a_claim_is_made_in_under_one_run_in_a_hundred():
    """The spending keeps the false claims at no effect under 1% over all the looks with no min
    effect to help (the interval alone guards); looking at every half-block at 99% each (the fixed
    design's level) would claim in several percent."""
    looks = Looks(8)
    no_bar = sequential_forecast.forecast(looks, 0.0, 1.0, 1, 0.0)
    assert no_bar.claimed < 0.01
    unit = sequential_forecast.unit_runs(looks, 1)
    _, verdict = sequential_forecast.stops(
        unit.delta, unit.error, _every_look_at_99(), unit.df, 0.0
    )
    assert np.mean(verdict == sequential_forecast.CLAIMED) > 0.02


def test_at_the_min_effect_no_effect_is_said_in_under_one_run_in_a_hundred():
    """The NO-EFFECT interval (one-sided at each look's level) keeps a NO-EFFECT where the true
    effect is the min effect under 1% over all the looks."""
    at_bar = sequential_forecast.forecast(Looks(8), 0.5, 0.2, 1, 0.5)
    assert at_bar.no_effect < 0.01


def _every_look_at_99():
    class Loose(Looks):
        def alpha(self, units):
            return 0.01

    return Loose(8)


def test_the_chips_goals_as_simulated_at_its_noise():
    """A one-chip v5e step (0.2% noise, min effect 0.5%, at most 8 scored steps per setting):
    the seeds' 7.2% called at the first look (3 steps a setting), a 1% effect within 4 in most
    runs; with no effect, NO-EFFECT by the budget in most runs and a claim in under 1%."""
    looks = Looks(8)
    seeds = sequential_forecast.forecast(looks, 7.2, 0.2, 1, 0.5)
    assert seeds.mean_units == pytest.approx(3.0) and seeds.claimed == 1.0
    one = sequential_forecast.forecast(looks, 1.0, 0.2, 1, 0.5)
    assert one.claimed > 0.99 and one.mean_units < 4.5
    quiet = sequential_forecast.forecast(looks, 0.0, 0.2, 1, 0.5)
    assert quiet.no_effect > 0.5 and quiet.claimed < 0.01 and 3 < quiet.mean_units <= 8
    at_15 = sequential_forecast.forecast(looks, 0.0, 0.15, 1, 0.5)
    assert at_15.no_effect > 0.9 and at_15.share_units <= 7
    smallest = sequential_forecast.smallest_effect(looks, 0.2, 1, 0.5)
    assert 0.5 < smallest < 1.0
    assert sequential_forecast.forecast(looks, smallest, 0.2, 1, 0.5).claimed >= 0.9


def test_ab_stops_at_the_first_settled_look_and_says_why(tmp_path, capsys):
    """An unstaged boundary costs 100 ms more a step: the staged `on` is called FASTER at the
    first look (three half-blocks, six turns of one step) unless a stray hiccup of the host
    widens it, and in any case long before the budget's 24 turns (the CPU's 6 blocks)."""
    out = tmp_path / "out"
    benches = Benches(lambda: TimedEngine(drifting_sleep(0.002, 0.0), boundary_delay_s=0.1))
    argv = ["--steps", "1", "--stop", "settled", "--schedule-seed", "1", "--out", str(out)]
    assert run_ab(argv, benches) == 0
    report = json.loads((out / "ab.json").read_text())
    score = report["score"]
    units = score["looks"][-1]["units"]
    assert [look["units"] for look in score["looks"]] == list(range(3, units + 1))
    assert units < 12 and len(report["arms"]) == 2 * units
    assert [a["label"] for a in report["arms"]][:6] == ["on", "off", "off'", "on'", "off#3", "on#3"]
    assert len(report["planned_run_order"]) == 24 and report["settings"]["stop"] == "settled"
    assert score["design"] == "separate arms in blocks, looked at after every half-block"
    (delta,) = score["deltas"]
    assert delta["verdict"] == "FASTER" and delta["delta_s"] < -0.08
    printed = capsys.readouterr().out
    assert "stops when settled: looks after every half-block" in printed
    assert "look after half-block 3 (99.64% CI): on-off " in printed
    assert "stopping: looks after every half-block" in printed
    assert (
        f"Stopped at the look after half-block {units} of 12: every verdict settled: on-off FASTER"
        in printed
    )


def test_a_look_measures_the_step_noise_the_plan_takes():
    """Steps of 100 s with 1% normal noise in 5-step turns: the fit's robust scale over 4,000
    steps measures 1% within its sampling error (about 1.2% of it; Huber's proposal 2 is
    consistent for normal noise). The draws are seeded: the same figure every run."""
    rng = np.random.default_rng(5)
    runs = []
    for i in range(400):
        pair = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        runs += [arm(f"{name}#{i}", name, list(100 + rng.normal(0, 1.0, 5))) for name in pair]
    look = sequential.look(runs, Looks(400), 0.5, "off")
    assert look.noise == pytest.approx(0.01, rel=0.04)
    assert look.to_json()["step_noise"] == look.noise
    assert "step noise 1" in look.line() or "step noise 0.9" in look.line()


def _with_first_call_extra(runs, extra_ms):
    """`runs` with each scored step's first call's extra set from `extra_ms` by setting, turn by
    turn (a list of each setting's turns' values, in ms)."""
    seen = {}
    for run in runs:
        turn = seen[run.setting] = seen.get(run.setting, -1) + 1
        for record in run.scored:
            record.first_call_extra_s = extra_ms[run.setting][turn] / 1000
    return runs


def test_a_stage_switch_is_judged_by_the_first_calls_extra_beside_the_step():
    """STAGE off vs on on the chip: the step says NO-EFFECT, the first call's extra after the
    boundary (4.0-4.6 ms off, 2.5-3.0 ms on) is called FASTER with its own interval at the same
    look, and the report says the switch is judged by it."""
    runs = _chip_arms(CHIP_ON)
    for run in runs:
        run.staged = run.setting == "on"
    extra = {
        "off": [4.3, 4.0, 4.6, 4.2, 4.4, 4.1, 4.5, 4.3],
        "on": [2.7, 2.9, 2.5, 3.0, 2.8, 2.6, 2.9, 2.7],
    }
    score = sequential.score(
        _with_first_call_extra(runs, extra), Looks(8), min_effect_pct=0.5, baseline="off"
    )
    assert score.deltas[0].verdict == "NO-EFFECT"
    (first,) = score.boundary["first call's extra"]
    units = score.looks[-1]["units"]
    by_hand, _, _ = _fit_by_hand(extra["off"][:units], extra["on"][:units])
    assert first.delta_s == pytest.approx(by_hand / 1000, abs=2e-4)
    assert first.verdict == "FASTER" and first.ci_high_s < 0
    assert "boundary idle" in score.boundary  # measured (0 in every synthetic step)
    assert score.judged_by.startswith("the first call's extra after the update boundary")
    assert score.looks[-1]["judged_by"] == "first call's extra"


def test_a_run_stops_only_when_the_metric_it_is_judged_by_is_settled_too():
    """The step settles NO-EFFECT, but the first call's extra of a stage switch is still NOISY
    (it scatters by 2 ms): the run goes on; with no stage switch it would have stopped."""
    runs = _chip_arms(CHIP_ON)
    for run in runs:
        run.staged = run.setting == "on"
    rng = np.random.default_rng(1)
    noisy = {s: list(4 + 2 * rng.standard_normal(8)) for s in ("off", "on")}
    staged = sequential.score(
        _with_first_call_extra(runs, noisy), Looks(8), min_effect_pct=0.5, baseline="off"
    )
    plain = sequential.score(_chip_arms(CHIP_ON), Looks(8), min_effect_pct=0.5, baseline="off")
    assert staged.looks[-1]["units"] > plain.looks[-1]["units"]
    assert "(first call's extra)" in staged.stopping


def test_the_plan_expects_the_seeds_switch_called_in_three_steps_a_setting():
    """The seeds' case on the 397B slice: a 107.7 s step, 0.15% noise, their 7.2% switch. The
    plan's forecast is the goal's figure: 3 scored steps per setting, 8 steps with 2 warm-ups."""
    argv = ["--preset", "qwen3.5-397b-cell", "--arms", "off,on", "--step-time", "107.7s"]
    args = cli.build_parser(["ab"]).parse_args(
        ["ab", *argv, "--step-noise", "0.15%", "--expect-effect", "7.2"]
    )
    lines = ab.complete(args).planned_lines([2])
    expected = next(line for line in lines if line.startswith("A/B expected stop"))
    assert (
        "at a 7.2% effect, 3 scored steps per setting on average, 3 or fewer in 80% of runs"
        " (claimed in 100%); at most 8" in expected
    )
    pod_time = next(line for line in lines if line.startswith("A/B pod time"))
    assert "8 steps = 14.4 min at 7.2%; at most 18 steps x 107.7 s = 32.3 min" in pod_time


def test_a_long_budget_is_forecast_with_fewer_runs_or_not_at_all():
    """The forecast fits every look of every simulated run, a cost that grows with the square of
    the budget: 8 half-blocks take 4,000 runs, 24 fewer (4,000 x 300 / 594 steps fitted a run:
    2,020), 1,000 blocks none, and the plan says so instead of waiting hours."""
    assert sequential_forecast.runs_for(Looks(8), 1) == 4000
    assert sequential_forecast.runs_for(Looks(24), 1) == 2020
    assert sequential_forecast.runs_for(Looks(2000), 1) == 0
    args = cli.build_parser(["ab"]).parse_args(
        ["ab", "--stop", "settled", "--blocks", "1000", "--steps", "1"]
    )
    lines = ab.complete(args).planned_lines([1])
    assert (
        "A/B expected stop: not simulated for 2000 half-blocks of 1-step turns (a forecast's cost"
        " grows with the square of the budget); at most 2000 scored steps per setting" in lines
    )
