"""The render's plan accounts for every variable of the trainer's environment and every value the
preset supplies; config-diff between the launcher and the bench lists what the bench substitutes.
"""

from __future__ import annotations

from render_helpers import FIXTURE

from rl_trainer_bench import cli
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan

# The fixture's trainer with two more variables before its python: one the bench knows changes the
# program and does not reproduce, one it does not know.
HOSTILE = FIXTURE.read_text().replace(
    "PYTHONUNBUFFERED=1 ", "PYTHONUNBUFFERED=1 TUNIX_LOGPS_SHARDED_HEAD=true ZZ_TEAM_SWITCH=on "
)


def _plan(text: str, **knobs: str):
    return render_with_plan(text, "launch.yaml", RenderKnobs.from_strings(knobs)).plan


def test_every_trainer_variable_is_counted_and_those_that_may_change_the_program_listed():
    rows = _plan(HOSTILE).environment_rows()
    # container env: JAX_PLATFORMS TRAINER_HOST UNRELATED_NAME; script: PYTHONUNBUFFERED, the
    # two added, LIBTPU_INIT_ARGS, MAXTEXT_EXTRA_FLAGS
    assert rows[0] == (
        "trainer environment",
        "8 variables (1 carries MaxText keys, 1 applied, 1 not reproduced, 3 not known to the"
        " bench, 2 runtime plumbing)",
    )
    listed = [text.split(":")[0] for name, text in rows if name == "trainer variable"]
    assert listed == [
        "TRAINER_HOST=fixture-train-bench-proc-0-0.fixture-train-bench",  # renamed with the JobSet
        "UNRELATED_NAME=fixture-train2",
        "TUNIX_LOGPS_SHARDED_HEAD=true",
        "ZZ_TEAM_SWITCH=on",
        "LIBTPU_INIT_ARGS=--xla_a=1 --xla_b=true",
        "MAXTEXT_EXTRA_FLAGS=--remat_policy=full --scan_layers=true",
    ]


def test_a_driver_env_value_is_what_the_plan_judges():
    plan = _plan(HOSTILE, driver_env="ZZ_TEAM_SWITCH=off")
    assert "ZZ_TEAM_SWITCH=off: not known to the bench" in [
        text.split(" (")[0] for _, text in plan.environment_rows()
    ]


def test_every_value_the_preset_supplies_names_its_source():
    rows = dict(_plan(FIXTURE.read_text()).value_rows())
    # qwen3-30b-a3b-cell sets no MoE key: the engine's defaults, listed on one line
    assert "retry_when_tokens_dropped=true" in rows["values from the engine's defaults"].split()
    assert "mu_dtype=float32" in rows["values from the engine's defaults"].split()
    # the fixture's orchestrator gives the step: 8 prompts x 4 generations in the preset's rows
    assert rows["value from the launcher"] == (
        "micro_steps=4 (8 prompts x 4 generations = 32 sequences per step (the orchestrator's"
        " --batch_size and --num_generations), one sequence per row of 8-row micro-batches (preset"
        " qwen3-30b-a3b-cell's rows): 4 micro-steps per step)"
    )


def test_config_diff_lists_the_benchs_substitutions(capsys, tmp_path):
    launch, bench = tmp_path / "launch.yaml", tmp_path / "bench.yaml"
    launch.write_text(HOSTILE)
    assert cli.main(["render", "--launch-render", str(launch), "--output", str(bench)]) == 0
    capsys.readouterr()
    cli.main(["config-diff", str(launch), str(bench)])
    out = capsys.readouterr().out.splitlines()
    start = out.index(
        f"substitutions the bench makes in {bench} (what its pod times in place of the trainer's"
        " program):"
    )
    substitutions = out[start + 1 :]
    assert substitutions[0] == (
        "  engine: rl_trainer_bench.engine.builtin.jax_engine:JaxEngine runs in place of the trainer's"
        " own engine"
    )
    assert (
        "  trainer key --remat_policy=full: no equivalent (MaxText keys are written without '--':"
        " did you mean remat_policy=full?)"
    ) in substitutions
    assert any(line.startswith("  values from the engine's defaults: ") for line in substitutions)
    assert any(
        line.startswith("  trainer variable TUNIX_LOGPS_SHARDED_HEAD=true: not reproduced")
        for line in substitutions
    )
    cli.main(["config-diff", str(launch), str(launch)])
    assert "substitutions" not in capsys.readouterr().out


def test_the_orchestrators_variables_that_may_change_the_program_are_named(capsys, tmp_path):
    launch = tmp_path / "launch.yaml"
    launch.write_text(
        FIXTURE.read_text().replace(
            "                python -m app.main --discovery_id=fixture-orch",
            "                TUNIX_LOGPS_SHARDED_HEAD=false PACKER_MODE=greedy PYTHONUNBUFFERED=1"
            " python -m app.main --discovery_id=fixture-orch",
        )
    )
    assert (
        cli.main(["render", "--launch-render", str(launch), "--output", str(tmp_path / "b")]) == 0
    )
    lines = [
        line.split(" (")[0]
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("render: orchestrator variable: ")
    ]
    assert lines == [
        "render: orchestrator variable: TUNIX_LOGPS_SHARDED_HEAD=false: not reproduced",
        "render: orchestrator variable: PACKER_MODE=greedy: not known to the bench",
    ]


def test_keys_engine_flags_sets_that_maxtexts_engine_does_not_take_are_listed_as_unused():
    """With MaxText's engine, a built-in engine's key set by ENGINE_FLAGS would run nowhere, and
    the plan says so before launch; a key MaxText takes is not listed."""
    flags = "keep_moe_gate_up=true,pair_ranking=sort,ragged_buffer_factor=2.0"
    rows = dict(_plan(FIXTURE.read_text(), engine="maxtext", engine_flags=flags).value_rows())
    unused = rows["set by ENGINE_FLAGS, not passed to MaxText's engine, so unused"]
    assert unused.startswith("keep_moe_gate_up=true (MaxText keeps or recomputes")
    assert "; pair_ranking=sort (MaxText sorts its routed pairs itself)" in unused
    assert "ragged_buffer_factor" not in unused
    assert "set by ENGINE_FLAGS, not passed to MaxText's engine, so unused" not in dict(
        _plan(
            FIXTURE.read_text(), engine="maxtext", engine_flags="ragged_buffer_factor=2.0"
        ).value_rows()
    )


def test_keys_engine_flags_sets_that_the_trainers_own_maxtext_keys_replace_are_listed():
    """With MaxText's engine the trainer's own keys come last and win, so a key ENGINE_FLAGS sets
    that one of them also sets does not reach MaxText: the plan says so before launch, naming the
    trainer's value; the same value, or a key the trainer does not set, is not listed."""
    row = (
        "set by ENGINE_FLAGS, replaced in MaxText by the trainer's key, applied last (ENGINE_FLAGS"
        " maxtext.KEY=VALUE sets a key after it)"
    )
    launch = FIXTURE.read_text().replace(  # the trainer's keys as MaxText reads them
        'MAXTEXT_EXTRA_FLAGS="--remat_policy=full --scan_layers=true"',
        'MAXTEXT_EXTRA_FLAGS="remat_policy=full scan_layers=true"',
    )
    flags = "remat_policy=minimal,scan_layers=true,ragged_buffer_factor=2.0"
    rows = dict(_plan(launch, engine="maxtext", engine_flags=flags).value_rows())
    assert rows[row] == "remat_policy=minimal (the trainer's remat_policy=full)"
    same = _plan(launch, engine="maxtext", engine_flags="remat_policy=full")
    assert row not in dict(same.value_rows())
