"""Driver knobs: every value validated at the edge, one line naming the knob, value and choices."""

from __future__ import annotations

import argparse

import pytest

from rl_trainer_bench.bench import driver
from rl_trainer_bench.config.knobs import (
    BenchConfig,
    StageConfig,
    add_driver_knob_arguments,
    driver_knobs,
)
from rl_trainer_bench.errors import ConfigError


def test_defaults():
    config = BenchConfig.from_env({})
    assert config.preset.name == "cpu-tiny" and config.steps == 5 and config.warmup_steps == 1
    assert config.micro_steps == config.preset.micro_steps
    assert config.distinct_micro_batches == config.micro_steps + 1
    assert config.stage == StageConfig() and config.worker == "separate"
    assert config.profile_steps is None


def test_knobs_parse():
    config = BenchConfig.from_env(
        {
            "STEPS": "3",
            "MICRO_STEPS": "4",
            "STAGE_BEFORE_UPDATE": "on",
            "PROFILE_STEPS": "2:3",
            "TRAINER_ARGV": "--a=1 'b c'",
            "ENGINE_FLAGS": "x=1 y=2",
            "WORKER": "fused",
        }
    )
    assert config.micro_steps == 4 and config.distinct_micro_batches == 5
    assert config.stage.before_update and not config.stage.after_update
    assert config.profile_steps == (2, 3)
    assert config.trainer_argv == ("--a=1", "b c") and config.engine_flags == ("x=1", "y=2")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STAGE_BEFORE_UPDATE": "yes"}, "STAGE_BEFORE_UPDATE='yes' is not allowed: use on or off"),
        ({"STAGE_AFTER_UPDATE": "1"}, "STAGE_AFTER_UPDATE='1' is not allowed: use on or off"),
        (
            {"STAGE_BEFORE_UPDATE": "on", "STAGE_AFTER_UPDATE": "on"},
            "STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE are exclusive",
        ),
        ({"STEPS": "0"}, "STEPS=0 is too small"),
        ({"STEPS": "ten"}, "STEPS='ten' is not an integer"),
        ({"MICRO_STEPS": "-1"}, "MICRO_STEPS=-1 is too small"),
        ({"PRESET": "huge"}, "PRESET='huge' is unknown: choose one of cpu-tiny"),
        ({"WORKER": "both"}, "WORKER='both' is not allowed: use one of separate, fused"),
        ({"PROFILE_STEPS": "a:b"}, "PROFILE_STEPS='a:b' is not a:b"),
        (
            {"PROFILE_STEPS": "3:9", "STEPS": "4"},
            "PROFILE_STEPS='3:9' is outside the run: steps are 0..4",
        ),
        ({"STAGE_ISSUE": "early"}, "STAGE_ISSUE='early' is not allowed"),
        ({"TRAINER_ARGV": "--a 'unclosed"}, "TRAINER_ARGV="),
        ({"MICROSTEPS": "2"}, "MICROSTEPS is not a knob: did you mean MICRO_STEPS?"),
    ],
)
def test_bad_values_are_refused_naming_the_knob(env, message):
    with pytest.raises(ConfigError) as error:
        BenchConfig.from_env(env)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_stage_issue_auto_is_before_the_last_dispatch_on_gpu_only():
    auto = StageConfig(before_update=True)
    assert auto.issue_before_last("gpu") and not auto.issue_before_last("cpu")
    assert StageConfig(before_update=True, issue="before_last").issue_before_last("cpu")
    assert not StageConfig(before_update=True, issue="after_last").issue_before_last("gpu")


def test_flags_override_the_environment():
    parser = argparse.ArgumentParser()
    add_driver_knob_arguments(parser)
    args = parser.parse_args(["--steps", "7", "--stage-before-update", "on"])
    knobs = driver_knobs({"STEPS": "2", "SEED": "4", "HOME": "/x"}, args)
    assert knobs == {"STEPS": "7", "SEED": "4", "STAGE_BEFORE_UPDATE": "on"}


def test_main_refuses_a_bad_knob_with_one_line_and_exit_2(tmp_path, capsys):
    code = driver.main([], {"STAGE_BEFORE_UPDATE": "maybe", "RESULTS_DIR": str(tmp_path / "r")})
    err = capsys.readouterr().err
    assert code == 2
    assert err == "bench_driver: STAGE_BEFORE_UPDATE='maybe' is not allowed: use on or off\n"
    assert not (tmp_path / "r").exists()


def test_run_command_refuses_a_bad_knob_with_exit_2(capsys):
    from rl_trainer_bench import cli

    assert cli.main(["run", "--worker", "both"]) == 2
    assert capsys.readouterr().err == (
        "rl-trainer-bench run: WORKER='both' is not allowed: use one of separate, fused\n"
    )
