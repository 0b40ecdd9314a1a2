"""MaxText keys set through ENGINE_FLAGS (`maxtext.KEY=VALUE`, how an A/B arm sets one): applied
after the trainer's own keys, as one more word of its MAXTEXT_EXTRA_FLAGS."""

from __future__ import annotations

import pytest

from rl_trainer_bench.bench import plan
from rl_trainer_bench.config.engine_keys import engine_config_from, trainer_key_fates
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError

TRAINER = "MAXTEXT_EXTRA_FLAGS='ragged_buffer_factor=2.0 megablox=true' python -m app.trainer"


def test_a_maxtext_key_in_engine_flags_follows_the_trainers_and_wins():
    config, unapplied = engine_config_from(
        PRESETS["cpu-tiny"], TRAINER, "maxtext.ragged_buffer_factor=3.0"
    )
    assert config.trainer_maxtext_keys == (
        ("ragged_buffer_factor", "2.0"),
        ("megablox", "true"),
        ("ragged_buffer_factor", "3.0"),
    )
    assert config.moe.ragged_buffer_factor == 3.0 and unapplied == []
    fates = [
        fate.describe() for fate in trainer_key_fates(TRAINER, "maxtext.ragged_buffer_factor=3.0")
    ]
    assert fates[0] == (
        "ragged_buffer_factor=2.0: overridden by a later trainer key (ragged_buffer_factor=2.0)"
    )
    assert fates[-1].startswith(
        "ragged_buffer_factor=3.0: applied with another meaning (ragged_buffer_factor=3.0;"
    )
    assert fates[-1].endswith("; set by ENGINE_FLAGS)")


@pytest.mark.parametrize("flags", ["maxtext.=1", "maxtext.a.b=1"])
def test_a_malformed_maxtext_key_is_refused(flags):
    with pytest.raises(ConfigError, match=r"write maxtext\.KEY=VALUE"):
        engine_config_from(PRESETS["cpu-tiny"], "", flags)


def test_the_built_in_engine_refuses_a_maxtext_key_it_has_no_equivalent_for():
    config = BenchConfig.from_env(
        {"PRESET": "cpu-tiny", "ENGINE_FLAGS": "maxtext.mu_dtype=bfloat16 maxtext.megablox=false"}
    )
    with pytest.raises(ConfigError) as raised:
        plan.resolve(config)
    message = str(raised.value)
    assert message.startswith(
        "ENGINE_FLAGS maxtext.megablox=false: the built-in engine has no equivalent; it applies"
        " maxtext.ragged_buffer_factor, maxtext.num_moe_token_chunks,"
    )
    assert "maxtext.remat_policy; time MaxText's engine (ENGINE=maxtext)" in message
    # the trainer's own keys without an equivalent are listed, not refused
    trainer = BenchConfig.from_env(
        {"PRESET": "cpu-tiny", "TRAINER_ARGV": TRAINER, "ENGINE": "builtin"}
    )
    assert "trainer key: megablox=true: no equivalent" in " ".join(plan.resolve(trainer).lines())


def test_maxtexts_engine_gets_the_key_last_and_the_plan_says_where_it_came_from():
    config = BenchConfig.from_env(
        {
            "PRESET": "cpu-tiny-qwen3.5",
            "TRAINER_ARGV": TRAINER,
            "ENGINE_FLAGS": "maxtext.megablox=false",
        }
    )
    resolved = plan.resolve(config)
    assert resolved.engine.trainer_maxtext_keys[-1] == ("megablox", "false")
    assert "plan: trainer key: megablox=true: overridden by a later trainer key" in resolved.lines()
    assert (
        "plan: trainer key: megablox=false: passed to MaxText (set by ENGINE_FLAGS)"
        in resolved.lines()
    )
