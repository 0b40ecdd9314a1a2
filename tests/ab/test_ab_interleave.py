"""The interleaved design: a balanced schedule reproducible from its seed, paired scoring that a
linear drift cannot move, the exact checks on a run that switches setting at its boundaries, and
the command end to end with an engine whose unstaged first call is slower by a known delay."""

import json

import pytest
from ab_synthetic import interleaved_run
from stand_in_engine import TimedEngine, drifting_sleep
from test_ab_command import Benches, run_ab

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import checks as ab_checks
from rl_trainer_bench.ab import interleave
from rl_trainer_bench.ab import score as ab_score
from rl_trainer_bench.errors import UserError

SETTINGS = ("off", "on")


def _schedule(pairs=10, warmup=1, seed=0):
    return interleave.make_schedule(SETTINGS, pairs=pairs, warmup_steps=warmup, seed=seed)


@pytest.mark.parametrize("seed", range(10))
def test_schedule_is_balanced_in_every_window(seed):
    schedule = _schedule(pairs=9, warmup=2, seed=seed)
    assert len(schedule.pairs) == 10  # rounded up to even: blocks come in balanced pairs
    scored = schedule.boundaries[schedule.warmup_steps - 1 :]
    assert len(scored) == 4 * len(schedule.pairs)
    for start in range(0, len(scored), 4):  # every aligned block: two of each
        assert sorted(scored[start : start + 4]) == ["off", "off", "on", "on"]
    for start in range(0, len(scored), 8):  # every aligned pair of blocks: AABB and BBAA
        first, second = scored[start : start + 4], scored[start + 4 : start + 8]
        assert first[0] == first[1] != first[2] == first[3]
        assert second == first[2:] + first[:2]
    for start in range(len(scored) - 4):  # never more than four of one setting in a row
        assert len(set(scored[start : start + 5])) == 2
    assert sum(1 for s in scored if s == "on") == sum(1 for s in scored if s == "off")


@pytest.mark.parametrize("seed", range(10))
def test_pairs_are_pure_steps_of_each_setting(seed):
    schedule = _schedule(seed=seed)
    for off_step, on_step in schedule.pairs:
        assert schedule.setting_of_step(off_step) == "off"
        assert schedule.setting_of_step(on_step) == "on"
        assert abs(on_step - off_step) == 2 and min(off_step, on_step) >= schedule.warmup_steps
    firsts = [on < off for off, on in schedule.pairs]
    assert firsts.count(True) == firsts.count(False)  # each order equally often


def test_units_pair_an_aabb_block_with_a_bbaa_block():
    schedule = _schedule(pairs=6, seed=4)
    assert len(schedule.units) == 3
    for (off_1, on_1), (off_2, on_2) in schedule.units:
        assert (on_1 - off_1) == -(on_2 - off_2)  # the drift one adds, the other takes back


def test_warmup_runs_both_settings_before_scoring():
    schedule = _schedule(warmup=1)
    assert schedule.warmup_steps == 1 + interleave.EXTRA_WARMUP
    assert set(schedule.boundaries[: schedule.warmup_steps - 1]) == set(SETTINGS)


def test_schedule_is_reproducible_from_its_seed():
    assert _schedule(seed=7) == _schedule(seed=7)
    assert len({_schedule(seed=s).boundaries for s in range(10)}) > 5


def test_only_two_stage_only_settings_interleave():
    with pytest.raises(UserError, match=r"differ in SEED.*--design arms"):
        interleave.stage_only_settings(ab_arms.parse_arms("off,x:SEED=3"))
    with pytest.raises(UserError, match="two settings, --arms has 3"):
        interleave.stage_only_settings(ab_arms.parse_arms("off,on,after"))
    baseline, other = interleave.stage_only_settings(ab_arms.parse_arms("on,after"))
    assert (baseline.setting, other.setting) == ("on", "after")


@pytest.mark.parametrize("slope", [-2e-3, 0.0, 2e-3])
def test_paired_delta_is_the_effect_whatever_the_linear_drift(slope):
    """Tolerance: a drift of +-2 ms per second of run moves step time by about 12 ms over this
    run; the paired delta must stay within 0.05 ms of the 3 ms effect."""
    schedule = _schedule(pairs=20, seed=3)
    run = interleaved_run(schedule, base_s=0.05, slope=slope, unstaged_first_call_s=0.003)
    result = ab_score.score_interleaved(run, schedule, min_effect_pct=2.0)
    (delta,) = result.deltas
    assert delta.delta_s == pytest.approx(-0.003, abs=5e-5)
    assert delta.verdict == ab_score.FASTER
    assert result.design == ab_score.INTERLEAVED
    assert result.drift.across_run == pytest.approx(slope, abs=2e-4)


def test_exact_checks_follow_the_schedule_boundary_by_boundary():
    schedule = _schedule()
    run = interleaved_run(schedule, base_s=0.05, slope=0.0)
    assert {c.status for c in ab_checks.exact_checks([run])} == {ab_checks.PASS}
    # Move one stage from an "on" boundary to an earlier "off" one: the count still matches.
    off_boundary = schedule.boundaries.index("off")
    on_boundary = schedule.boundaries.index("on", off_boundary)
    run.records[off_boundary].staged = f"bench_{off_boundary + 1}_0"
    run.records[on_boundary].staged = None
    (check,) = [c for c in ab_checks.exact_checks([run]) if c.status == ab_checks.FAIL]
    assert f"step {off_boundary} staged at a boundary set to not stage" in check.detail


def _interleaved_ab(tmp_path, engine, *extra, seed="0"):  # seed 0: these tests' tuned layout
    out = tmp_path / "interleaved"
    argv = ["--design", "interleaved", "--knob", "MICRO_STEPS=2", "--out", str(out), *extra]
    argv += ["--schedule-seed", seed]
    assert run_ab(argv, Benches(engine)) == 0
    return json.loads((out / "ab.json").read_text()), (out / "ab.txt").read_text()


def test_the_baseline_is_the_setting_named_first_whatever_the_seed(tmp_path):
    """Seed 1 turns the blocks order's first block BAAB (tests/ab/test_ab_blocks.py), so the
    planned arms start with `on`; the interleaved run still takes `off`, named first, as baseline."""
    report, _ = _interleaved_ab(
        tmp_path, lambda: TimedEngine(drifting_sleep(0.005, 0.0)), "--steps", "4", seed="1"
    )
    assert report["schedule"]["settings"] == ["off", "on"]
    (delta,) = report["score"]["deltas"]
    assert delta["name"] == "on-off"


def test_interleaved_command_finds_a_known_boundary_delay(tmp_path):
    report, text = _interleaved_ab(
        tmp_path,
        lambda: TimedEngine(drifting_sleep(0.010, 0.0), boundary_delay_s=0.020),
        "--steps",
        "12",
    )
    assert report["settings"]["design"] == "interleaved"
    assert report["score"]["design"] == "interleaved boundaries"
    assert {c["status"] for c in report["checks"]} == {"PASS"}
    (delta,) = report["score"]["deltas"]
    assert delta["name"] == "on-off"
    assert delta["delta_s"] == pytest.approx(-0.020, abs=0.006)
    assert report["verdict"] == "FASTER"
    schedule = report["schedule"]
    assert len(schedule["pairs"]) == 12
    assert len(report["arms"]) == 1 and len(report["arms"][0]["records"]) == 3 + 4 * 12
    assert "design: interleaved boundaries:" in text


def test_interleaved_command_is_not_fooled_by_drift(tmp_path):
    """The drift moves step time by about 100 ms over the run (1.6 ms a step); the delta must stay
    under 3 ms (sleeps on a loaded host jitter by a few ms a step)."""
    report, _ = _interleaved_ab(
        tmp_path, lambda: TimedEngine(drifting_sleep(0.060, -0.4e-3)), "--steps", "16"
    )
    (delta,) = report["score"]["deltas"]
    assert abs(delta["delta_s"]) < 3e-3
    assert report["score"]["drift"]["exceeds_min_effect"]


def test_too_few_pairs_for_an_interval_are_refused_before_any_output(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(UserError, match="needs --steps >= 4"):
        run_ab(["--design", "interleaved", "--steps", "3", "--out", str(out)])
    assert not out.exists()


def test_interleaving_settings_that_change_programs_is_refused_before_any_output(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(UserError, match="differ in SEED"):
        run_ab(["--design", "interleaved", "--arms", "off,x:SEED=2", "--out", str(out)])
    assert not out.exists()
