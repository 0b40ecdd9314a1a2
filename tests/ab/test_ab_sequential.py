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


def test_the_looks_spend_one_percent_in_all_and_a_third_of_it_at_the_first():
    looks = Looks(12)
    assert list(looks.units) == list(range(3, 13))
    # 1% ln(1 + (e - 1) 3/12), worked by hand: ln(1.429570) = 0.357374
    assert looks.alpha(3) == pytest.approx(0.00357374, abs=1e-8)
    assert sum(looks.alpha(n) for n in looks.units) == pytest.approx(0.01, abs=1e-15)
    assert all(looks.alpha(n) > 0 for n in looks.units)
    assert "99.64% at the first look, 99.95% at the last" in looks.rule()


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


def test_a_large_effect_stops_at_the_first_look_with_its_level_interval():
    off = [100.0, 100.2, 99.9]
    on = [107.1, 107.4, 107.2]
    runs = _arms(off, on)
    assert sequential.look(runs[:4], Looks(12), 0.5, "off") is None  # two half-blocks: no look
    look = sequential.look(runs, Looks(12), 0.5, "off")
    units = np.subtract(on, off)  # 7.1, 7.2, 7.3
    t = stats.t.ppf(1 - 0.00357374 / 2, 2)
    half_width = t * np.std(units, ddof=1) / math.sqrt(3)
    (delta,) = look.deltas
    assert delta.delta_s == pytest.approx(7.2)
    assert (delta.ci_low_s, delta.ci_high_s) == pytest.approx(
        (7.2 - half_width, 7.2 + half_width), rel=1e-6
    )
    assert delta.verdict == "SLOWER" and look.settled and not look.last
    assert "look after half-block 3 (99.64% CI): on-off +7.2e+03 ms" in look.line()


def test_the_score_is_the_first_settled_looks_and_names_where_it_stopped():
    # settled at the third half-block; a fourth, whatever it holds, is not looked at
    runs = _arms([100.0, 100.2, 99.9, 100.0], [107.1, 107.4, 107.2, 90.0])
    score = sequential.score(runs, Looks(12), min_effect_pct=0.5, baseline="off")
    assert [look["units"] for look in score.looks] == [3]
    assert score.deltas[0].delta_s == pytest.approx(7.2)
    assert score.confidence == pytest.approx(1 - 0.00357374, abs=1e-8)
    assert "Stopped at the look after half-block 3 of 12: every verdict settled" in score.stopping
    assert len(score.blocks) == 3


def test_an_unsettled_run_goes_on_to_the_budgets_last_look():
    rng = np.random.default_rng(3)
    off = 100 + rng.normal(0, 1.0, 6)
    on = 100.3 + rng.normal(0, 1.0, 6)  # 0.3% against a 1% step noise: not settled in 6
    score = sequential.score(_arms(off, on), Looks(6), min_effect_pct=0.5, baseline="off")
    assert [look["units"] for look in score.looks] == [3, 4, 5, 6]
    assert score.deltas[0].verdict == "NOISY"
    assert "the budget's last look, on-off still NOISY" in score.stopping


def test_the_forecasts_vectorised_rule_stops_where_the_scorer_does():
    """The plan's simulation and the run's scorer are two implementations of one rule: on the
    same half-block differences they stop at the same look with the same verdict."""
    rng = np.random.default_rng(7)
    looks = Looks(8)
    rows = rng.normal(0.6, 0.5, (40, 8))  # near the 0.5 min effect: every kind of stop
    stop, verdict = sequential_forecast.stops(rows, looks, 0.5)
    names = {
        sequential_forecast.CLAIMED: ("FASTER", "SLOWER"),
        sequential_forecast.NO_EFFECT: ("NO-EFFECT",),
        sequential_forecast.NOISY: ("NOISY",),
    }
    seen = set()
    for row, units, word in zip(rows, stop, verdict, strict=True):
        score = sequential.score(
            _arms([100.0] * 8, 100 + row), looks, min_effect_pct=0.5, baseline="off"
        )
        assert score.looks[-1]["units"] == units
        assert score.deltas[0].verdict in names[word]
        seen.add((int(units) == 8, int(word)))
    assert len(seen) >= 3  # early and last stops, claimed and not, were all exercised


def test_with_no_effect_a_claim_is_made_in_at_most_one_run_in_a_hundred():
    """The spending keeps the false claims at no effect under 1% over all the looks; looking at
    every half-block at 99% each (the fixed design's level) would claim in several percent."""
    looks = Looks(12)
    no_bar = sequential_forecast.forecast(looks, 0.0, 1.0, 1, 0.0)  # only the interval guards
    assert no_bar.claimed <= 0.01
    draws = np.random.default_rng(11).standard_normal((4000, 12))
    _, verdict = sequential_forecast.stops(draws, _every_look_at_99(), 0.0)
    assert np.mean(verdict == sequential_forecast.CLAIMED) > 0.02


def _every_look_at_99():
    class Loose(Looks):
        def alpha(self, units):
            return 0.01

    return Loose(12)


def test_a_large_effect_is_expected_at_the_first_look_and_none_runs_longer():
    looks = Looks(12)
    # the seeds' 7.2% at 0.15% step noise, 1-step turns: called at the third half-block
    seeds = sequential_forecast.forecast(looks, 7.2, 0.15, 1, 0.5)
    assert seeds.mean_units == pytest.approx(3.0) and seeds.claimed == 1.0
    quiet = sequential_forecast.forecast(looks, 0.0, 0.15, 1, 0.5)
    assert 3 < quiet.mean_units <= 12 and quiet.no_effect > 0.95 and quiet.claimed == 0.0
    smallest = sequential_forecast.smallest_effect(looks, 0.15, 1, 0.5)
    assert 0.5 < smallest < 1.0
    at = sequential_forecast.forecast(looks, smallest, 0.15, 1, 0.5)
    assert at.claimed >= 0.9


def test_ab_stops_at_the_first_settled_look_and_says_why(tmp_path, capsys):
    """An unstaged boundary costs 100 ms more a step: the staged `on` is called FASTER at the
    first look (three half-blocks, six turns of one step) unless a stray hiccup of the host
    widens it, and in any case long before the budget's 24 turns."""
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
    """Steps of 100 s with 1% normal noise in 5-step turns: 400 half-blocks measure 1% within
    their sampling error (about 3.5% of it), through the variance of a median of five (0.287:
    without it the figure would be 0.76%). The draws are seeded: the same figure every run."""
    rng = np.random.default_rng(5)
    runs = []
    for i in range(400):
        pair = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        runs += [arm(f"{name}#{i}", name, list(100 + rng.normal(0, 1.0, 5))) for name in pair]
    look = sequential.look(runs, Looks(400), 0.5, "off")
    assert look.noise == pytest.approx(0.01, rel=0.08)
    assert look.to_json()["step_noise"] == look.noise
    assert "step noise 1" in look.line() or "step noise 0.9" in look.line()


def test_the_plan_expects_the_seeds_switch_called_in_three_steps_a_setting():
    """The seeds' case on the 397B slice: a 107.7 s step, 0.15% noise, their 7.2% switch. The
    plan's forecast is the goal's figure: 3 scored steps per setting, 8 steps with 2 warm-ups."""
    argv = ["--preset", "qwen3.5-397b-cell", "--arms", "off,on", "--step-time", "107.7s"]
    args = cli.build_parser(["ab"]).parse_args(
        ["ab", *argv, "--step-noise", "0.15%", "--expect-effect", "7.2"]
    )
    lines = ab.complete(args).planned_lines(1, 2)
    expected = next(line for line in lines if line.startswith("A/B expected stop"))
    assert "at a 7.2% effect, 3 scored steps per setting (claimed in 100%); at most 12" in expected
    pod_time = next(line for line in lines if line.startswith("A/B pod time"))
    assert "8 steps = 14.4 min at 7.2%; at most 26 steps x 107.7 s = 46.7 min" in pod_time
