"""Engine keys from a trainer argv and key=value engine flags, into an EngineConfig."""

import pytest
from reference_data import launch_render

from rl_trainer_bench.config.engine_keys import (
    ENGINE_KEYS,
    engine_config_from,
    parse_engine_flags,
    parse_trainer_argv,
)
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError


def _client_command() -> str:
    trainer = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    return next(line for line in trainer.read_text().splitlines() if "python -m" in line)


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
    # The argv set a mesh axis, so the mesh is the trainer's: the axes it left out are 1.
    assert (config.mesh.context, config.mesh.expert) == (1, 1)
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


# The keys users and launchers write today; deriving them from the fields must not rename any.
KNOWN_KEYS = [
    "mesh_fsdp", "mesh_context", "mesh_expert", "train_micro_batch_size", "max_prompt_length",
    "max_response_length", "compute_logps_chunk_size", "remat_policy", "scan_layers", "optimizer_learning_rate",
    "optimizer_schedule_type", "optimizer_init_value", "optimizer_peak_value", "optimizer_end_value",
    "optimizer_warmup_steps", "optimizer_decay_steps", "optimizer_b1", "optimizer_b2", "optimizer_eps",
    "optimizer_weight_decay", "optimizer_opt_chain_type", "optimizer_chain_kwargs", "max_grad_norm",
    "optimizer_memory_host_offload", "mu_dtype",
    "epsilon", "epsilon_high", "beta", "ragged_buffer_factor", "dropless_compute", "retry_when_tokens_dropped",
    "expert_compute", "pair_ranking", "router_replay", "num_moe_token_chunks", "prefuse_moe_weights", "keep_moe_gate_up",
    "attention",
    "attention_chunk_size",
    "linear_chunk_size", "linear_chunk_inverse", "linear_chunk_kernel", "linear_chunk_kernel_heads", "keep_delta_rule_outputs",
    "linear_conv_kernel", "dtype",
    "matmul_precision", "logps_gradient",
    "seed", "extra_device_work", "extra_host_bytes",
]  # fmt: skip


def test_engine_keys_are_the_fields_marked_as_keys_plus_the_trainer_spellings():
    assert sorted(ENGINE_KEYS) == sorted(KNOWN_KEYS)
    for key in ENGINE_KEYS.values():
        assert key.help


def test_every_choice_key_lists_its_fields_literal_choices():
    from rl_trainer_bench.engine.config import choices, leaf_fields

    literal = {path: choices(kind) for path, _, kind in leaf_fields() if choices(kind)}
    for name, key in ENGINE_KEYS.items():
        if key.target in literal:
            assert key.kind == "choice:" + "|".join(literal[key.target]), name
    assert ENGINE_KEYS["remat_policy"].kind == "choice:full|minimal|none"


def test_engine_choices_and_model_tables_agree():
    from rl_trainer_bench.engine.builtin import model, moe
    from rl_trainer_bench.engine.config import DroplessCompute, ExpertCompute, RematPolicy, choices

    assert {*model.REMAT_POLICIES, "none"} == set(choices(RematPolicy))
    assert {"auto", *moe.EXPERT_COMPUTE_CHOICES} == set(choices(ExpertCompute))
    assert {"auto", *moe.DROPLESS_COMPUTE_CHOICES} == set(choices(DroplessCompute))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("mesh_fsdp=٣", "mesh_fsdp='٣': expected an integer"),
        ("beta=nan", "beta='nan': expected a number"),
        ("optimizer_chain_kwargs={'max_norm': True}", "a dict literal like"),
        ("optimizer_warmup_steps=-1", "an integer >= 0"),
    ],
)
def test_engine_values_are_ascii_finite_and_in_range(flags, named):
    with pytest.raises(ConfigError, match=named):
        engine_config_from(PRESETS["cpu-tiny"], engine_flags=flags)


def test_config_problems_judge_choices_minimums_and_shapes_in_one_place():
    import dataclasses

    from rl_trainer_bench.engine.config import config_problems

    tiny = PRESETS["cpu-tiny"].engine
    assert config_problems(tiny) == []
    bad_choice = dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, attention="x"))
    assert config_problems(bad_choice) == [
        "model.attention='x': must be one of auto, xla, cudnn, splash"
    ]
    bad_rows = dataclasses.replace(tiny, micro_batch_rows=3)
    assert config_problems(bad_rows) == [
        "micro_batch_rows=3: must be a positive multiple of mesh fsdp x expert = 4"
    ]
    zero_mesh = dataclasses.replace(tiny, mesh=dataclasses.replace(tiny.mesh, context=0))
    assert "mesh.context=0: must be >= 1" in config_problems(zero_mesh)
