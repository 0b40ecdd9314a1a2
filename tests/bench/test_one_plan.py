"""Resolved once: `aot`, `check-engine` and every A/B arm take the engine config of the plan
`bench/plan.py` resolves, and nothing else in the package resolves one from the knobs."""

from __future__ import annotations

import ast
import types
from pathlib import Path

from stand_in_engine import ConfiguredStandInEngine, StandInEngine, stand_in_pool

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import same_pod
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.engine import sharing_check
from rl_trainer_bench.preflight import check_engine
from rl_trainer_bench.preflight.aot import check

PACKAGE = Path(__file__).resolve().parents[2] / "rl_trainer_bench"
STAND_IN = "stand_in_engine:ConfiguredStandInEngine"
# The plan's builder, and the config room's launcher step shape, which reads the rows a config
# would have (config/engine_keys.py defines the function).
RESOLVERS = {"bench/plan.py", "config/step_shape.py"}


def test_only_the_plans_builder_resolves_an_engine_config_from_the_knobs():
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(node, ast.alias):  # imported, under any name
                name = node.name
            if (
                isinstance(node, ast.Name | ast.Attribute | ast.alias)
                and name == "engine_config_from"
            ):
                callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == RESOLVERS


def test_aot_compiles_the_plans_micro_steps_and_fits_the_mesh_before_resolving():
    # 8 prompts x 4 generations on rows of 4: 8 micro-steps, where cpu-tiny's own count is 4
    argv = "--mini_batch_size=8 --num_generations=4 --train_micro_batch_size=4"
    cell = check.resolve_cell("cpu-tiny", "local", argv)
    assert cell.plan.config.micro_steps == 8
    assert cell.plan.config.micro_steps_source == "the launcher"
    assert cell.config.micro_batch_rows == 4 and cell.config is not None


def test_check_engine_builds_the_plans_engine_config(monkeypatch, capsys):
    # the stand-in is built as check-engine builds any engine; its conformance is not the point
    monkeypatch.setattr(check_engine, "check_engine", lambda engine, payloads: [])
    passed = types.SimpleNamespace(measured="sharing not checked here", failures=[])
    monkeypatch.setattr(sharing_check, "check_sharing", lambda *args: passed)
    built = len(ConfiguredStandInEngine.built_with)
    argv = ["check-engine", "--engine", STAND_IN, "--maxtext-driver", "maxtext"]
    assert cli.main([*argv, "--engine-flags", "ragged_buffer_factor=2"]) == 0
    (config,) = ConfiguredStandInEngine.built_with[built:]
    assert config.maxtext_driver == "maxtext"  # the plan's: check-engine sets nothing itself
    assert config.moe.ragged_buffer_factor == 2.0


def test_each_arm_of_a_pods_ab_runs_the_engine_config_its_printed_plan_lists(tmp_path):
    env = {
        "AB_ARMS": "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2",
        "STEPS": "1",
        "AB_BUDGET": "6",  # sized once, when the pod plans its A/B, not again when it runs it
        "RESULTS_DIR": str(tmp_path / "ab"),
        "AB_SCHEDULE_SEED": "0",
    }
    planned = same_pod.pod_plan(env)
    lines = [line for line in planned.lines if line.startswith("plan: A/B arm ")]
    assert lines == [
        "plan: A/B arm base: ragged_buffer_factor=1.25; engine config: the plan's above with"
        " moe.ragged_buffer_factor=1.25",
        "plan: A/B arm wide: ragged_buffer_factor=2; engine config: the plan's above",  # 2.0
    ]
    built = {}

    def make_bench(plan, log):  # every arm's bench, from the engine config it is built with
        built[plan.engine.moe.ragged_buffer_factor] = plan.engine
        return Bench(
            plan.config,
            log,
            engine_config=plan.engine,
            engine_factory=lambda _: StandInEngine(),
            pool=stand_in_pool(3),
        )

    ab_command.run(planned.args, make_bench=make_bench, planned=planned.arms)
    assert sorted(built) == [1.25, 2.0]  # each arm at the value its line lists
