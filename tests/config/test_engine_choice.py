"""The engine a run times: the trainer's own (MaxText's engine for a MaxText trainer) unless ENGINE
names another, with the reason the plan prints."""

from __future__ import annotations

import pytest

from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT

QWEN35 = "--model_name=Qwen3.5-397B-A17B --mesh_fsdp=16 --mesh_context=8 --mesh_expert=2"
QWEN3_MOE = "--model_name=Qwen3-30B-A3B"


def chosen(argv: str, **knobs: str) -> BenchConfig:
    return BenchConfig.from_env({"TRAINER_ARGV": argv, **knobs})


@pytest.mark.parametrize(
    ("argv", "evidence"),
    [
        (f"python -m app.trainer --trainer_backend=maxtext {QWEN35}", "--trainer_backend=maxtext"),
        (f"python -m app.trainer --trainer_backend MaxText {QWEN35}", "--trainer_backend=MaxText"),
        (
            f"MAXTEXT_EXTRA_FLAGS='num_vocab_tiling=16' python -m app.trainer {QWEN35}",
            "MAXTEXT_EXTRA_FLAGS in its command",
        ),
    ],
)
def test_a_maxtext_trainer_is_timed_by_maxtexts_engine(argv, evidence):
    config = chosen(argv)
    assert config.engine == MAXTEXT
    assert config.engine_source == f"the trainer runs MaxText ({evidence}): its own program"


def test_a_trainer_on_another_backend_or_none_is_timed_by_the_built_in_engine():
    # the backend flag decides: MAXTEXT_EXTRA_FLAGS exported beside another backend is never read
    other = chosen(f"MAXTEXT_EXTRA_FLAGS=a=1 python -m app.t --trainer_backend=vanilla {QWEN35}")
    plain = chosen(f"python -m app.trainer {QWEN35}")
    for config in (other, plain):
        assert config.engine == BUILT_IN
        assert config.engine_source.startswith("the trainer's command does not run MaxText")


def test_engine_overrides_the_trainers_engine_by_name_or_short_name():
    argv = f"python -m app.trainer --trainer_backend=maxtext {QWEN35}"
    assert (
        chosen(argv, ENGINE="builtin").engine,
        chosen(argv, ENGINE="builtin").engine_source,
    ) == (
        BUILT_IN,
        "ENGINE",
    )
    assert chosen(f"python -m app.trainer {QWEN35}", ENGINE="maxtext").engine == MAXTEXT
    assert chosen(argv, ENGINE="my_pkg.adapter:Mine").engine == "my_pkg.adapter:Mine"


def test_a_maxtext_model_its_engine_cannot_time_falls_to_the_built_in_engine_saying_why():
    config = chosen(f"python -m app.trainer --trainer_backend=maxtext {QWEN3_MOE}")
    assert config.engine == BUILT_IN
    assert config.engine_source.startswith(
        "the trainer runs MaxText (--trainer_backend=maxtext), but MaxText's engine cannot time"
        " this model here: a routed MoE of plain full-attention layers"
    )


def test_warm_up_defaults_to_what_the_chosen_engine_needs_and_a_set_value_wins():
    maxtext_trainer = f"python -m app.trainer --trainer_backend=maxtext {QWEN35}"
    # MaxText's first metrics log compiles eager ops one step late: two warm-up steps
    assert chosen(maxtext_trainer).warmup_steps == 2
    assert chosen(f"python -m app.trainer {QWEN35}", ENGINE="maxtext").warmup_steps == 2
    assert chosen(maxtext_trainer, ENGINE="builtin").warmup_steps == 1
    assert chosen(maxtext_trainer, WARMUP_STEPS="1").warmup_steps == 1
    assert chosen(f"python -m app.trainer {QWEN35}", WARMUP_STEPS="3").warmup_steps == 3
