"""Engine keys from a trainer argv and key=value engine flags, into an EngineConfig."""

from pathlib import Path

import pytest

from rl_trainer_bench.config.engine_keys import (
    ENGINE_KEYS,
    engine_config_from,
    parse_engine_flags,
    parse_trainer_argv,
)
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError

# The shared reference data sits in `shared/` beside the repository (or beside its parent folder).
_RENDER = "shared/reference/launch-renders/tunix-mlperf-397b-256-v5p-trainer.stdout.txt"
TRAINER_RENDER = next(
    (p / _RENDER for p in Path(__file__).resolve().parents[2:5] if (p / _RENDER).exists()),
    Path(_RENDER),
)


def _client_command() -> str:
    if not TRAINER_RENDER.exists():
        pytest.skip("reference launch render (../shared) is absent")
    return next(line for line in TRAINER_RENDER.read_text().splitlines() if "python -m" in line)


def test_trainer_argv_of_the_real_launcher_is_read_past_env_and_python():
    flags = parse_trainer_argv(_client_command())
    assert flags["mesh_fsdp"] == "16" and flags["mesh_context"] == "8"
    assert flags["optimizer_chain_kwargs"] == "{'max_norm': 0.125}"
    assert "PYTHONUNBUFFERED" not in flags and "m" not in flags


def test_real_launcher_argv_lands_in_the_engine_config_and_lists_what_it_ignores():
    config, unapplied = engine_config_from(PRESETS["qwen3.5-397b-cell"], _client_command())
    assert (config.mesh.fsdp, config.mesh.context, config.mesh.expert) == (16, 8, 2)
    assert config.micro_batch_rows == 32 and config.seq_len == 4096 + 61440
    assert config.optimizer.max_grad_norm == 0.125
    assert config.optimizer.schedule == "warmup_cosine_decay_schedule"
    assert config.optimizer.warmup_steps == 50
    assert "mesh_tp" in unapplied and "model_name" in unapplied
    assert unapplied == sorted(unapplied)
    assert not set(unapplied) & set(ENGINE_KEYS)


def test_argv_forms_and_quotes():
    flags = parse_trainer_argv(
        "A=1 B='x y' python3 -m pkg.main --a=1 --b 2 --c='p q' --flag --d=\"r\""
    )
    assert flags == {"a": "1", "b": "2", "c": "p q", "flag": "true", "d": "r"}
    assert parse_trainer_argv(["--x=1", "--x=2"]) == {"x": "2"}


def test_stray_argv_token_is_refused_by_name():
    with pytest.raises(ConfigError, match="'stray'"):
        parse_trainer_argv("--a=1 --b=2 stray")


def test_engine_flags_split_on_whitespace_and_commas_last_wins():
    flags = parse_engine_flags(
        "beta=0.1, epsilon=0.3 beta=0.2,optimizer_chain_kwargs={'max_norm': 2}"
    )
    assert flags == {"beta": "0.2", "epsilon": "0.3", "optimizer_chain_kwargs": "{'max_norm': 2}"}
    with pytest.raises(ConfigError, match="not key=value"):
        parse_engine_flags("beta")


def test_engine_flags_apply_after_the_argv():
    config, unapplied = engine_config_from(
        PRESETS["cpu-tiny"], "--mesh_fsdp=4 --unknown_knob=1", "mesh_fsdp=2 ragged_buffer_factor=-1"
    )
    assert config.mesh.fsdp == 2 and config.moe.ragged_buffer_factor == -1
    assert unapplied == ["unknown_knob"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("mesh_fsdp=0", "mesh_fsdp='0': expected a positive integer"),
        ("beta=high", "beta='high': expected a number"),
        ("expert_compute=magic", "expert_compute='magic': expected one of auto, einsum"),
        ("retry_when_tokens_dropped=maybe", "expected true or false"),
        ("optimizer_chain_kwargs={'norm':1}", "a dict literal like"),
        ("max_prompt_length=10", "without max_response_length"),
    ],
)
def test_bad_engine_values_name_key_value_and_allowed_form(flags, named):
    with pytest.raises(ConfigError, match=named):
        engine_config_from(PRESETS["cpu-tiny"], engine_flags=flags)
