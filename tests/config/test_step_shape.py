"""The step's micro-steps from the launcher's orchestrator and trainer flags (step_shape.py)."""

from __future__ import annotations

import pytest

from rl_trainer_bench.config.knobs import (
    LAUNCHER_SOURCE,
    MICRO_STEPS_SOURCE,
    PRESET_SOURCE,
    BenchConfig,
)
from rl_trainer_bench.config.step_shape import step_shape
from rl_trainer_bench.errors import ConfigError

# A trainer whose step packs rows as the 397B recipe's does.
PACKED = {
    "mini_batch_size": "16",
    "num_generations": "16",
    "max_seq_token_per_tpu": "65536",
    "max_prompt_length": "4096",
    "max_response_length": "61440",
}


def test_unpacked_rows_hold_one_sequence_each_and_the_last_micro_batch_counts():
    # 3 prompts x 3 generations = 9 sequences in 4-row micro-batches: 4 + 4 + 1
    shape = step_shape({}, {"batch_size": "3", "num_generations": "3"}, 4, "preset's rows")
    assert (shape.micro_steps, shape.exact) == (3, True)
    assert shape.describe() == (
        "3 prompts x 3 generations = 9 sequences per step (the orchestrator's --batch_size and"
        " --num_generations), one sequence per row of 4-row micro-batches (preset's rows):"
        " 3 micro-steps per step"
    )


def test_the_orchestrator_may_take_its_generations_from_the_trainer():
    shape = step_shape({"num_generations": "8"}, {"batch_size": "2"}, 4, "rows")
    assert shape.micro_steps == 4  # 2 x 8 = 16 sequences / 4 rows
    assert "(the orchestrator's --batch_size, the trainer's --num_generations)" in shape.how


def test_a_trainers_mini_batch_without_generations_counts_sequences():
    """Tunix's distributed trainer node: ceil(mini_batch_size / train_micro_batch_size) micro-steps
    (its launcher sets MINI_BATCH_SIZE to prompts x generations)."""
    shape = step_shape({"mini_batch_size": "4"}, {}, 1, "the trainer's --train_micro_batch_size")
    assert shape.micro_steps == 4


def test_a_trainers_mini_batch_with_generations_counts_prompts():
    shape = step_shape({"mini_batch_size": "16", "num_generations": "16"}, {}, 64, "rows")
    assert shape.micro_steps == 4  # 256 sequences / 64 rows


def test_packed_rows_bound_the_count_by_the_longest_sequence():
    # 256 sequences of up to 65,536 tokens in 65,536-token rows: at least one per row, 64 rows
    shape = step_shape(PACKED, {}, 64, "rows")
    assert (shape.micro_steps, shape.exact) == (4, False)
    assert shape.describe().endswith(
        "shorter rollouts pack into fewer: at most 4 micro-steps per step"
    )
    # sequences of up to 512 + 128 = 640 tokens: 102 share each 65,536-token row; 256 / (2 x 102)
    short = {**PACKED, "max_prompt_length": "512", "max_response_length": "128"}
    assert step_shape(short, {}, 2, "rows").micro_steps == 2


def test_packed_rows_without_the_lengths_are_not_derived():
    flags = {k: v for k, v in PACKED.items() if k != "max_response_length"}
    shape = step_shape(flags, {}, 64, "rows")
    assert shape.micro_steps is None
    assert "without --max_response_length how many sequences share a row is unknown" in shape.how


def test_an_orchestrator_and_a_trainer_that_disagree_derive_nothing():
    shape = step_shape(
        {"mini_batch_size": "8"}, {"batch_size": "2", "num_generations": "2"}, 1, "r"
    )
    assert shape.micro_steps is None
    assert shape.how.endswith("and the trainer's --mini_batch_size=8 sequences per step disagree")


@pytest.mark.parametrize(
    ("trainer", "orch", "why"),
    [
        ({}, {}, "neither the orchestrator's --batch_size (no ORCH_ARGV or none there) nor"),
        ({}, {"batch_size": "4"}, "--batch_size=4 counts prompts, and neither command gives"),
    ],
)
def test_a_launcher_that_says_too_little_says_which_flag_is_missing(trainer, orch, why):
    shape = step_shape(trainer, orch, 8, "rows")
    assert shape.micro_steps is None and why in shape.describe()


@pytest.mark.parametrize(
    ("trainer", "orch", "named"),
    [
        ({}, {"batch_size": "x", "num_generations": "4"}, "ORCH_ARGV --batch_size='x'"),
        ({"mini_batch_size": "0"}, {}, "the trainer's --mini_batch_size=0 is too small"),
    ],
)
def test_a_flag_that_is_not_a_count_is_refused_naming_it(trainer, orch, named):
    with pytest.raises(ConfigError, match=named):
        step_shape(trainer, orch, 8, "rows")


FIXTURE_TRAINER = (
    "python -m app.trainer --model_name=Qwen3-30B-A3B --max_prompt_length=1024"
    " --max_response_length=3072"
)


def test_the_launchers_count_is_the_runs_unless_micro_steps_sets_one():
    env = {"TRAINER_ARGV": FIXTURE_TRAINER, "ORCH_ARGV": "--batch_size=8 --num_generations=6"}
    config = BenchConfig.from_env(env)
    # 48 sequences in qwen3-30b-a3b-cell's 8-row micro-batches, where the preset says 4
    assert (config.micro_steps, config.micro_steps_source) == (6, LAUNCHER_SOURCE)
    assert config.distinct_micro_batches == 7
    given = BenchConfig.from_env({**env, "MICRO_STEPS": "3"})
    assert (given.micro_steps, given.micro_steps_source) == (3, MICRO_STEPS_SOURCE)
    assert given.step_shape.micro_steps == 6  # still read, so the plan can mark the difference
    bare = BenchConfig.from_env({"TRAINER_ARGV": FIXTURE_TRAINER})
    assert (bare.micro_steps, bare.micro_steps_source) == (4, PRESET_SOURCE)


def test_engine_flags_rows_are_the_rows_the_count_fills():
    env = {
        "TRAINER_ARGV": FIXTURE_TRAINER,
        "ORCH_ARGV": "--batch_size=8 --num_generations=6",
        "ENGINE_FLAGS": "train_micro_batch_size=16",
    }
    config = BenchConfig.from_env(env)
    assert config.micro_steps == 3  # 48 / 16
    assert "16-row micro-batches (ENGINE_FLAGS train_micro_batch_size)" in config.step_shape.how


def test_a_launcher_step_past_the_benchs_bound_is_refused_naming_micro_steps():
    env = {"TRAINER_ARGV": FIXTURE_TRAINER, "ORCH_ARGV": "--batch_size=4096 --num_generations=16"}
    with pytest.raises(
        ConfigError, match=r"the launcher's step is 8,192 micro-steps .*set MICRO_STEPS"
    ):
        BenchConfig.from_env(env)
