"""ENGINE=module:Class: one factory builds the named engine in run, ab, check-engine and the pod;
aot takes only engines that lower from abstract inputs; bad names and missing staging are refused
with one line and exit 2 before any step."""

from __future__ import annotations

import argparse
import json

import pytest
from stand_in_engine import ConfiguredStandInEngine

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import parser as ab_parser
from rl_trainer_bench.ab import plan as ab_plan
from rl_trainer_bench.ab.arms import parse_arms
from rl_trainer_bench.bench import entry
from rl_trainer_bench.config.knobs import BenchConfig, engine_spec
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT, engine_class
from rl_trainer_bench.errors import ConfigError

STAND_IN = "stand_in_engine:ConfiguredStandInEngine"
STAGELESS = "stand_in_engine:StagelessStandInEngine"


def test_engine_knob_defaults_to_the_built_in_engine_and_checks_its_form():
    assert BenchConfig.from_env({}).engine == BUILT_IN
    assert BenchConfig.from_env({"ENGINE": STAND_IN}).describe()["ENGINE"] == STAND_IN
    assert engine_spec("maxtext") == MAXTEXT and engine_spec(" builtin ") == BUILT_IN
    with pytest.raises(ConfigError, match="ENGINE='maxtxt' is not module:Class nor one of"):
        engine_spec("maxtxt")


def test_factory_finds_the_class_built_with_the_engine_config():
    config = BenchConfig.from_env({}).preset.engine
    engine = engine_class(STAND_IN)(config)
    assert isinstance(engine, ConfiguredStandInEngine)
    assert ConfiguredStandInEngine.built_with[-1] is config
    with pytest.raises(ContractError, match="ENGINE='no_such_module:Engine' cannot be imported"):
        engine_class("no_such_module:Engine")
    with pytest.raises(ContractError, match="names a function, not a class"):
        engine_class("json:dumps")


def _driver(tmp_path, **knobs):
    env = {"STEPS": "1", "RESULTS_DIR": str(tmp_path / "r"), "MICRO_STEPS": "1", **knobs}
    return entry.main([], env)


def test_run_times_the_engine_the_knob_names(tmp_path, capsys):
    built = len(ConfiguredStandInEngine.built_with)
    assert _driver(tmp_path, ENGINE=STAND_IN) == 0
    out = capsys.readouterr().out
    assert len(ConfiguredStandInEngine.built_with) == built + 1
    assert f"ENGINE={STAND_IN}" in out
    lines = (tmp_path / "r" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one warm-up and one scored step, by the named engine


def test_stage_before_update_with_an_engine_lacking_staging_exits_2_naming_the_methods(
    tmp_path, capsys
):
    assert _driver(tmp_path, ENGINE=STAGELESS, STAGE_BEFORE_UPDATE="on") == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "bench_driver: STAGE_BEFORE_UPDATE=on needs the engine methods prepare_fwd_bwd_input"
        " and wait_for_device; StagelessStandInEngine lacks prepare_fwd_bwd_input and"
        " wait_for_device: set STAGE_BEFORE_UPDATE=off\n"
    )
    assert "step=" not in captured.out
    assert not (tmp_path / "r" / "results.jsonl").exists()  # no partial output


def test_an_engine_that_cannot_be_imported_exits_2_with_one_line(tmp_path, capsys):
    assert _driver(tmp_path, ENGINE="no_such_module:Engine") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("bench_driver: ENGINE='no_such_module:Engine' cannot be imported")


def test_arm_values_may_hold_a_colon():
    arms = parse_arms(f"a:ENGINE={STAND_IN},b:MICRO_STEPS=1,ENGINE={BUILT_IN},a,b")
    assert arms[0].driver_knobs == {"ENGINE": STAND_IN}
    assert arms[1].driver_knobs == {"MICRO_STEPS": "1", "ENGINE": BUILT_IN}


def _ab_args(tmp_path, arms: str, engine: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ab_parser.add_arguments(parser)
    argv = [
        "--arms",
        arms,
        "--steps",
        "1",
        "--out",
        str(tmp_path / "ab"),
        "--knob",
        "MICRO_STEPS=1",
    ]
    return parser.parse_args(argv + (["--engine", engine] if engine else []))


def test_ab_arms_with_different_engines_get_their_own_benches(tmp_path):
    args = _ab_args(tmp_path, f"mine:ENGINE={STAND_IN},builtin:ENGINE={BUILT_IN},mine,builtin")
    plan = ab_plan.plan_arms(args, ab_command.complete(args), tmp_path / "ab")
    assert (
        plan.groups["mine"] != plan.groups["builtin"]
        and plan.groups["mine"] == plan.groups["mine'"]
    )
    engines = {name: c.engine for name, c in plan.bench_configs.items()}
    assert sorted(engines.values()) == sorted([STAND_IN, BUILT_IN])


def test_ab_engine_flag_sets_every_arm(tmp_path):
    args = _ab_args(tmp_path, "off,on", STAND_IN)
    plan = ab_plan.plan_arms(args, ab_command.complete(args), tmp_path / "ab")
    assert {c.engine for c in plan.bench_configs.values()} == {STAND_IN}


def test_ab_runs_the_named_engine_in_every_arm_and_checks_pass(tmp_path):
    built = len(ConfiguredStandInEngine.built_with)
    assert ab_command.run(_ab_args(tmp_path, "off,on", STAND_IN)) == 0
    assert len(ConfiguredStandInEngine.built_with) == built + 1  # off and on share one bench
    report = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert {v["ENGINE"] for v in report["arm_knobs"].values()} == {STAND_IN}
    assert all(check["status"] == "PASS" for check in report["checks"])


def test_aot_refuses_an_engine_that_cannot_lower_from_abstract_inputs(capsys):
    assert cli.main(["aot", "--engine", STAND_IN]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "stand_in_engine lacks lower_programs, abstract_state," in err


def test_check_engine_builds_through_the_same_factory(capsys):
    assert cli.main(["check-engine", "--engine", "no_such_module:Engine"]) == 2
    assert "--engine='no_such_module:Engine' cannot be imported" in capsys.readouterr().err
