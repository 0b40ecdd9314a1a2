"""Driver knobs: every value validated at the edge, one line naming the knob, value and choices."""

from __future__ import annotations

import argparse

import pytest

from rl_trainer_bench.bench import entry
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
            "TRAINER_ARGV": "--a=1 --b 'c d'",
            "ENGINE_FLAGS": "x=1 y=2",
            "WORKER": "fused",
        }
    )
    assert config.micro_steps == 4 and config.distinct_micro_batches == 5
    assert config.stage.before_update and not config.stage.after_update
    assert config.profile_steps == (2, 3)
    assert config.trainer_argv == ("--a=1", "--b", "c d") and config.engine_flags == "x=1 y=2"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STAGE_BEFORE_UPDATE": "yes"}, "STAGE_BEFORE_UPDATE='yes' is not allowed: use on or off"),
        ({"STAGE_AFTER_UPDATE": "2"}, "STAGE_AFTER_UPDATE='2' is not allowed: use on or off (or 1"),
        ({"PLAN_ONLY": "yes"}, "PLAN_ONLY='yes' is not allowed: use on or off (or 1 or 0)"),
        (
            {"STAGE_BEFORE_UPDATE": "on", "STAGE_AFTER_UPDATE": "on"},
            "STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE are exclusive",
        ),
        ({"STEPS": "0"}, "STEPS=0 is too small"),
        ({"STEPS": "ten"}, "STEPS='ten' is not an integer"),
        ({"MICRO_STEPS": "-1"}, "MICRO_STEPS=-1 is too small"),
        ({"PRESET": "huge"}, "PRESET='huge' is unknown: choose one of cpu-tiny"),
        ({"WORKER": "both"}, "WORKER='both' is not allowed: use one of separate, fused"),
        ({"PROFILE_STEPS": "a:b"}, "PROFILE_STEPS='a:b' is not a step window: write N, A:B or A-B"),
        ({"PROFILE_STEPS": "3:2"}, "PROFILE_STEPS='3:2' is reversed"),
        ({"PROFILE_STEPS": "1,3"}, "PROFILE_STEPS='1,3' is not a step window"),
        ({"STEPS": "²"}, "STEPS='²' is not an integer"),
        ({"STEPS": "٣"}, "STEPS='٣' is not an integer"),
        ({"SEED": "1.5"}, "SEED='1.5' is not an integer"),
        ({"ENGINE_FLAGS": "beta"}, "ENGINE_FLAGS: 'beta' is not key=value"),
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
    code = entry.main([], {"STAGE_BEFORE_UPDATE": "maybe", "RESULTS_DIR": str(tmp_path / "r")})
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "bench_driver: STAGE_BEFORE_UPDATE='maybe' is not allowed: use on or off (or 1 or 0)\n"
    )
    assert not (tmp_path / "r").exists()


def test_run_command_refuses_a_bad_knob_with_exit_2(capsys):
    from rl_trainer_bench import cli

    assert cli.main(["run", "--worker", "both"]) == 2
    assert capsys.readouterr().err == (
        "rl-trainer-bench run: WORKER='both' is not allowed: use one of separate, fused\n"
    )


def test_plan_prints_the_cell_and_exits_before_any_device_work(tmp_path, capsys):
    results = tmp_path / "r"
    code = entry.main(["--plan", "--steps", "3"], {"RESULTS_DIR": str(results)})
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == (
        "plan: cell: cpu-tiny mesh 2 x 2 x 2 (fsdp x context x expert),"
        " micro-batch 4 rows of 128 tokens, 2 micro-steps per step"
    )
    assert all(line.startswith("plan: ") for line in out)
    assert not results.exists()  # refused or planned, a run that did no work writes nothing


def test_plan_checks_the_mesh_against_the_slice_it_is_told_not_the_host(capsys):
    env = {"PLAN_ONLY": "1", "TRAINER_SLICE": "v5p:2x2x1"}
    assert entry.main([], env) == 2
    assert capsys.readouterr().err == (
        "bench_driver: mesh 2 x 2 x 2 (fsdp x context x expert) needs 8 devices, but"
        " TRAINER_SLICE=v5p:2x2x1 (4 chips) has 4: set mesh_fsdp, mesh_context and mesh_expert"
        " to multiply to 4 (v5p shows 1 JAX device per chip)\n"
    )
    assert entry.main([], {**env, "ENGINE_FLAGS": "mesh_fsdp=1"}) == 0


_PRODUCTION_PLAN = {"PLAN_ONLY": "1", "PRESET": "qwen3.5-397b-cell"}


@pytest.mark.parametrize(
    ("tpu_slice", "mesh", "devices_line"),
    [
        # Ironwood: 128 chips show as 256 JAX devices, the public recipe's 32 x 4 x 2 mesh.
        ("tpu7x:4x4x8", "mesh_fsdp=32 mesh_context=4 mesh_expert=2",
         "plan: mesh: 32 x 4 x 2 = 256 devices on tpu7x:4x4x8 (128 chips = 256 devices)"),
        # v5p: one device a chip, the v5p recipe's 16 x 8 x 2 mesh.
        ("v5p:4x8x8", "mesh_fsdp=16 mesh_context=8 mesh_expert=2",
         "plan: mesh: 16 x 8 x 2 = 256 devices on v5p:4x8x8 (256 chips)"),
    ],
)  # fmt: skip
def test_production_meshes_fill_their_slices(capsys, tpu_slice, mesh, devices_line):
    env = {**_PRODUCTION_PLAN, "TRAINER_SLICE": tpu_slice, "ENGINE_FLAGS": mesh}
    assert entry.main([], env) == 0, capsys.readouterr().err
    assert devices_line in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("tpu_slice", "mesh", "needs"),
    [
        ("tpu7x:4x4x8", "mesh_fsdp=32 mesh_context=2 mesh_expert=2", 128),  # one device a chip
        ("tpu7x:4x4x8", "mesh_fsdp=32 mesh_context=8 mesh_expert=2", 512),
        ("v5p:4x8x8", "mesh_fsdp=16 mesh_context=4 mesh_expert=2", 128),
        ("v5p:4x8x8", "mesh_fsdp=16 mesh_context=16 mesh_expert=2", 512),
    ],
)
def test_a_mesh_smaller_or_larger_than_the_slice_is_refused(capsys, tpu_slice, mesh, needs):
    env = {**_PRODUCTION_PLAN, "TRAINER_SLICE": tpu_slice, "ENGINE_FLAGS": mesh}
    assert entry.main([], env) == 2
    err = capsys.readouterr().err
    assert f"needs {needs} devices, but TRAINER_SLICE={tpu_slice}" in err
    assert "has 256: set mesh_fsdp" in err and err.count("\n") == 1


def test_the_pods_driver_reports_an_engine_contract_error_as_one_line(capsys, monkeypatch):
    from rl_trainer_bench.engine.contract import ContractError

    def broken_engine(*_args):
        raise ContractError("fwd_bwd returned a value; the contract says None")

    monkeypatch.setattr(entry, "run_bench", broken_engine)
    assert entry.main([], {}) == 2
    assert capsys.readouterr().err == (
        "bench_driver: fwd_bwd returned a value; the contract says None\n"
    )


def test_every_on_off_knob_reads_one_grammar():
    """on/off and 1/0, any case, mean the same to every switch (STAGE_*, PLAN_ONLY)."""
    for words, expected in ((("on", "ON", "1"), True), (("off", "Off", "0"), False)):
        for word in words:
            config = BenchConfig.from_env({"STAGE_AFTER_UPDATE": word, "PLAN_ONLY": word})
            assert config.stage.after_update is expected and config.plan_only is expected
