"""The A/B's design sized by a budget, its cost, and the smallest effect it resolves, derived from
the verdict's own rule (ab/resolution.py, ab/budget.py)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from ab_synthetic import record
from scipy import stats

from rl_trainer_bench import cli
from rl_trainer_bench.ab import budget, one_state, resolution, student_t
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.ab.plan import plan_arms
from rl_trainer_bench.bench.step_record import format_line
from rl_trainer_bench.errors import ConfigError, UserError


def _parsed(*argv: str):
    return cli.build_parser(["ab"]).parse_args(["ab", *argv])


def _run(*argv: str):
    return ab.complete(_parsed(*argv))


@pytest.mark.parametrize("df", [1, 2, 3, 5, 11, 40])
def test_t_quantiles_and_chi_square_are_scipys(df):
    for p in (0.9, 0.995):
        assert student_t.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    w = np.array([0.3, 2.0, 9.0])
    assert resolution._chi2_cdf(w, df) == pytest.approx(stats.chi2.cdf(w, df), abs=1e-12)


def test_the_variance_of_a_median_of_normal_draws():
    # 1 and 2 draws: the draw and the mean of two; 3: the known 0.4487; 4 and 5 against numpy's
    # median of a million draws (standard error about 0.0005)
    assert resolution.median_variance(1) == pytest.approx(1.0, abs=1e-6)
    assert resolution.median_variance(2) == pytest.approx(0.5, abs=1e-6)
    assert resolution.median_variance(3) == pytest.approx(0.4487, abs=1e-4)
    draws = np.random.default_rng(0).standard_normal((1_000_000, 5))
    assert resolution.median_variance(4) == pytest.approx(
        np.var(np.median(draws[:, :4], 1)), abs=2e-3
    )
    assert resolution.median_variance(5) == pytest.approx(np.var(np.median(draws, 1)), abs=2e-3)
    assert resolution.median_variance(1000) == pytest.approx(math.pi / 2000)


def test_with_no_min_effect_the_claim_rate_is_the_t_tests_size_and_power():
    # at no effect the rule claims one in exactly 1 - 99% of runs; at an effect, the power of the
    # two-sided t test over blocks (scipy's noncentral t)
    assert resolution.claim_rate(0.0, 1.0, 6, 1, 0.0) == pytest.approx(0.01, abs=1e-6)
    t = stats.t.ppf(0.995, 5)
    for effect in (0.5, 1.0, 2.0):
        noncentrality = effect * math.sqrt(6)
        power = stats.nct.sf(t, 5, noncentrality) + stats.nct.cdf(-t, 5, noncentrality)
        assert resolution.claim_rate(effect, 1.0, 6, 1, 0.0) == pytest.approx(power, abs=1e-6)
    for effect in (0.3, 0.6, 0.9):  # turns of 3: a turn's median has 0.4487 of a step's variance
        noncentrality = effect * math.sqrt(6) / math.sqrt(0.4487)
        power = stats.nct.sf(t, 5, noncentrality) + stats.nct.cdf(-t, 5, noncentrality)
        assert resolution.claim_rate(effect, 1.0, 6, 3, 0.0) == pytest.approx(power, abs=1e-4)


def test_the_seeds_case_resolves_a_1_percent_effect_in_12_steps_per_setting():
    """Two arms, ~100 s steps with 0.15% noise, 6 blocks of 1-step turns, min effect 0.5%: the
    interval is far narrower than the bar, so the smallest resolved effect is the bar plus the
    90% quantile of the mean: 0.5 + 1.2816 x 0.15 / sqrt(6) = 0.5785% (by hand)."""
    smallest = resolution.smallest_effect(0.15, 6, 1, 0.5)
    assert smallest == pytest.approx(0.5785, abs=0.001)
    # at the assumed 0.3% noise too, a 1% effect is found in at least 9 runs of 10
    assert resolution.smallest_effect(0.3, 6, 1, 0.5) < 1.0
    run = _run(
        "--preset",
        "qwen3.5-397b-cell",
        "--arms",
        "off,on",
        "--step-noise",
        "0.15%",
        "--blocks",
        "6",
    )
    design = run.design
    assert (design.blocks, design.turn_steps, design.scored_per_setting) == (6, 1, 12)
    assert (run.blocks, run.steps, run.min_effect) == (6, 1, 0.5)
    assert design.smallest_effect_pct() == pytest.approx(0.5785, abs=0.001)


def test_the_accelerators_default_budget_is_eight_scored_steps_per_setting_at_most():
    """At most 8 scored steps per setting in 4 blocks of 1-step turns, stopped when settled: the
    one-chip v5e's A/B fits README's main job in 4 minutes with its ~2 minute compile."""
    run = _run("--preset", "qwen3.5-397b-cell", "--arms", "off,on")
    design = run.design
    assert (design.blocks, design.turn_steps, design.scored_per_setting) == (4, 1, 8)
    assert design.looks is not None and design.looks.max_units == 8


def test_the_cpus_default_is_six_blocks_of_three_step_turns():
    run = _run("--arms", "off,on")
    assert (run.blocks, run.steps, run.min_effect) == (6, 3, 2.0)
    assert run.design.budget is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # 30 scored steps per setting in 1-step turns (an accelerator's): 15 blocks
        (["--preset", "qwen3.5-397b-cell", "--budget", "30"], (True, 1, 15, 0.5)),
        # 120 scored steps per setting over 4 given blocks, two turns a block: turns of 15
        (["--preset", "qwen3.5-397b-cell", "--budget", "120", "--blocks", "4"], (True, 15, 4, 0.5)),
        # interleaved: no budget design, 8 pairs by default, no blocks, the given min effect
        (["--design", "interleaved", "--min-effect", "1.5"], (False, 8, None, 1.5)),
        # another order: its 3 steps per arm, the given blocks kept, the CPU's min effect
        (["--order", "mirrored", "--blocks", "3"], (False, 3, 3, 2.0)),
    ],
)
def test_the_run_is_resolved_apart_from_the_flags_which_stay_as_parsed(argv, expected):
    args = _parsed(*argv, "--schedule-seed", "11")
    given = copy.deepcopy(vars(args))
    run = ab.complete(args)
    assert vars(args) == given  # nothing written into the flags
    assert (run.design is not None, run.steps, run.blocks, run.min_effect) == expected
    assert run.schedule_seed == 11
    if run.design is not None:  # the design prints the blocks and turns the run runs
        assert (run.design.blocks, run.design.turn_steps) == (run.blocks, run.steps)
    unseeded = _parsed(*argv)
    before = copy.deepcopy(vars(unseeded))
    assert budget.size(unseeded, 5).schedule_seed == 5 and vars(unseeded) == before
    assert 0 <= ab.complete(unseeded).schedule_seed < 2**32  # drawn into the run only
    assert vars(unseeded) == before


def test_a_minutes_budget_pays_the_warmups_then_buys_blocks(tmp_path):
    # 41 min of 100 s steps: 24 steps, less 2 warm-ups (one program set, the most any engine
    # needs) leaves 22, 11 per setting: 5 blocks of 1-step turns
    argv = ("--preset", "qwen3.5-397b-cell", "--arms", "off,on", "--budget", "41min")
    args = _parsed(*argv, "--step-time", "100")
    run = ab.complete(args)
    assert (run.blocks, run.steps) == (5, 1)
    plan = plan_arms(args, run, tmp_path, on_this_host=False)  # the built-in engine: 1 warm-up
    assert plan.warmup_steps == 1 and args.warmup_steps is None  # the plan's, args untouched
    # ... and one more, as the run takes it: arm on's stage is warmed before any arm is scored
    assert one_state.set_warmups(plan) == [2]
    design = run.planned_lines(one_state.set_warmups(plan))
    assert "and 2 warm-up steps (2 per program set x 1, once, up front)" in design[0]
    assert design[3].endswith(
        "; at most 22 steps x 100 s = 36.7 min (ESTIMATE; step time: given by --step-time),"
        " plus start-up and compiles"
    )
    fixed = ab.complete(_parsed(*argv, "--step-time", "100", "--stop", "budget"))
    assert fixed.planned_lines(one_state.set_warmups(plan))[1] == (
        "A/B pod time: 22 steps x 100 s = 36.7 min (ESTIMATE; step time: given by --step-time),"
        " plus start-up and compiles"
    )


def test_a_budget_too_small_for_three_blocks_is_refused_naming_the_need():
    with pytest.raises(UserError, match=r"buys 4 scored steps per setting: 2 block\(s\) of 1-step"):
        _run("--preset", "qwen3.5-397b-cell", "--budget", "4")
    with pytest.raises(UserError, match="needs a step time"):
        _run("--preset", "qwen3.5-397b-cell", "--budget", "30min")
    with pytest.raises(UserError, match="--budget is for the blocks order"):
        _run("--budget", "12", "--design", "interleaved")
    with pytest.raises(UserError, match="--stop is for the blocks order"):
        _run("--stop", "settled", "--order", "mirrored")
    with pytest.raises(ConfigError, match="--expect-effect='7,x'"):
        _run("--preset", "qwen3.5-397b-cell", "--expect-effect", "7,x")
    with pytest.raises(ConfigError, match="--budget='12 hours'"):
        _run("--budget", "12 hours")


def test_step_time_and_noise_come_from_a_prior_runs_log(tmp_path):
    # alternating 100.0 and 100.3 s: consecutive differences of 0.3 s, so the noise is
    # 1.4826 x 0.3 / sqrt(2) = 0.3145 s of a 100.15 s median step
    times = [100.0, 100.3] * 5
    log = tmp_path / "pod.log"
    lines = [format_line(record(0, 300.0, warmup=True))]
    lines += [format_line(record(i + 1, t)) for i, t in enumerate(times)]
    log.write_text("\n".join(["some other line", *lines]) + "\n")
    time, noise = budget.parse_step_time(str(log))
    assert time == budget.Figure(100.15, f"median of 10 scored steps of {log}")
    assert noise.value == pytest.approx(1.4826 * 0.3 / math.sqrt(2) / 100.15, rel=1e-3)
    results = tmp_path / "results.jsonl"
    results.write_text(
        "".join(json.dumps(record(i, t).to_json()) + "\n" for i, t in enumerate(times))
    )
    assert budget.parse_step_time(str(results))[0].value == pytest.approx(100.15)


@pytest.mark.parametrize(
    "text",
    ['[1, 2]\n"x"\n', '{\n  "preset": "p",\n  "time_estimate": null\n}\n', '{"step": 0}\n', ""],
    ids=[
        "lines of lists and strings",
        "a JSON report spread over lines",
        "no record's fields",
        "empty",
    ],
)
def test_a_results_file_of_no_run_is_refused_in_one_line(tmp_path, text):
    results = tmp_path / "results.jsonl"
    results.write_text(text)
    with pytest.raises(UserError, match="no scored step in it"):
        budget.parse_step_time(str(results))


def test_aots_estimate_is_a_named_step_time(tmp_path):
    report = tmp_path / "aot.json"
    report.write_text(json.dumps({"preset": "p", "time_estimate": {"step_seconds": 98.5}}))
    time, noise = budget.parse_step_time(str(report))
    assert (time.value, noise) == (98.5, None)
    assert "aot's roofline ESTIMATE" in time.source
    ab_report = {
        "ab_arms": "a,b",
        "program_sets": [{"report": {"time_estimate": {"step_seconds": 97.0}}}],
    }
    report.write_text(json.dumps(ab_report))  # aot --ab-arms: the first (baseline) set's step
    assert budget.parse_step_time(str(report))[0].value == 97.0
    report.write_text(json.dumps({"preset": "p", "time_estimate": None}))
    with pytest.raises(UserError, match="has no predicted step"):
        budget.parse_step_time(str(report))


def test_a_resolved_figure_reads_back_with_its_source():
    figure = budget.Figure(100.15, "median of 10 scored steps of pod.log")
    assert budget.parse_step_time(figure.text("s")) == (figure, None)
    noise = budget.Figure(0.0015, "spread of consecutive steps of pod.log")
    assert budget.parse_step_noise(noise.text("%")) == noise


def test_an_unknown_pod_time_names_a_flag_each_command_takes():
    """The hint is printed by `ab`, `plan` and the render alike: each flag it names must parse."""
    line = _run("--arms", "off,on").design.lines()[1]
    assert "no step-time source" in line
    assert "`ab --step-time`" in line and "`render --ab-step-time`" in line
    assert _parsed("--step-time", "100s").step_time == "100s"
    render = cli.build_parser(["render"]).parse_args(
        ["render", "--launch-render", "x.yaml", "--ab-step-time", "100s"]
    )
    assert render.ab_step_time == "100s"
