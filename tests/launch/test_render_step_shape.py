"""The rendered pod's micro-steps per step come from the launcher, and the plan says so, or says
why the preset's are used, or marks MICRO_STEPS where it differs from the trainer."""

from __future__ import annotations

from reference_data import launch_render
from render_helpers import FIXTURE

from rl_trainer_bench import cli
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan

# The fixture's orchestrator: 8 prompts x 4 generations; its trainer: the preset's 8 rows.
FIXTURE_STEP = (
    "8 prompts x 4 generations = 32 sequences per step (the orchestrator's --batch_size and"
    " --num_generations), one sequence per row of 8-row micro-batches (preset"
    " qwen3-30b-a3b-cell's rows): 4 micro-steps per step"
)


def _plan(text: str, name: str = "launch.yaml", **knobs: str):
    return render_with_plan(text, name, RenderKnobs.from_strings(knobs)).plan


def test_micro_steps_set_against_the_launcher_differ_from_the_trainer(capsys, tmp_path):
    plan = _plan(FIXTURE.read_text(), micro_steps="9")
    assert plan.config.micro_steps == 9
    rows = dict(plan.value_rows())
    assert rows["micro-steps differ from the trainer"] == f"MICRO_STEPS=9, where {FIXTURE_STEP}"
    launch, bench = tmp_path / "launch.yaml", tmp_path / "bench.yaml"
    launch.write_text(FIXTURE.read_text())
    assert (
        cli.main(["render", f"--launch-render={launch}", f"--output={bench}", "--micro-steps=9"])
        == 0
    )
    capsys.readouterr()
    cli.main(["config-diff", str(launch), str(bench)])
    assert (
        f"  micro-steps differ from the trainer: MICRO_STEPS=9, where {FIXTURE_STEP}"
        in capsys.readouterr().out.splitlines()
    )


def test_micro_steps_that_agree_with_the_launcher_are_not_marked():
    rows = dict(_plan(FIXTURE.read_text(), micro_steps="4").value_rows())
    assert "micro-steps differ from the trainer" not in rows
    assert "value from the launcher" not in rows


def test_an_orchestrator_without_prompts_per_step_leaves_the_presets_count_and_says_why():
    plan = _plan(FIXTURE.read_text(), orch_argv="--num_generations=4")
    assert plan.config.micro_steps == 4
    assert dict(plan.value_rows())["value from preset qwen3-30b-a3b-cell"] == (
        "micro_steps=4 (not derived from the launcher: neither the orchestrator's --batch_size"
        " (no ORCH_ARGV or none there) nor the trainer's --mini_batch_size gives the prompts per"
        " step)"
    )


def test_the_gsm8k_launch_trains_its_four_sequences_in_one_micro_batch_of_engine_flags_rows():
    """The real gsm8k launcher: the orchestrator's 2 prompts x 2 generations agree with the
    trainer's --mini_batch_size=4; ENGINE_FLAGS' 8 rows hold them in one micro-batch."""
    name = "tunix-gsm8k-start.yaml"
    plan = _plan(
        launch_render(name).read_text(),
        name,
        driver_env="PRESET=qwen3-30b-a3b-cell",
        engine_flags="train_micro_batch_size=8 compute_logps_chunk_size=128",
    )
    assert plan.config.micro_steps == 1
    assert dict(plan.value_rows())["value from the launcher"] == (
        "micro_steps=1 (2 prompts x 2 generations = 4 sequences per step (the orchestrator's"
        " --batch_size and --num_generations), one sequence per row of 8-row micro-batches"
        " (ENGINE_FLAGS train_micro_batch_size): 1 micro-step per step; preset"
        " qwen3-30b-a3b-cell has 4)"
    )
