"""The trainer's MaxText keys: read from its command in Tunix's order, each with its fate."""

from __future__ import annotations

import pytest

from rl_trainer_bench.config.engine_keys import engine_config_from, trainer_key_fates
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError

# What the public Qwen3.5-397B tpu7x recipe puts before the trainer's python command (a subset of
# its MAXTEXT_EXTRA_FLAGS, in its order), and its --remat_policy flag.
RECIPE = (
    'MAXTEXT_EXTRA_FLAGS="custom_mesh_and_rule=cp-as-ep use_gdn_kernel=true'
    " decoder_layer_input=device context=remat gdn=remat megablox=true num_moe_token_chunks=4"
    ' ragged_buffer_factor=2.0 num_vocab_tiling=16 mu_dtype=bfloat16" TRAINER_MAXTEXT_ATTENTION=flash'
    " python -m tunix.main --mesh_fsdp=32 --mesh_context=4 --mesh_expert=2 --remat_policy=custom"
)
CELL = PRESETS["qwen3.5-397b-cell"]


def _fates(argv: str, flags: str = "") -> dict[str, str]:
    return {fate.key: fate.describe() for fate in trainer_key_fates(argv, flags)}


def test_the_recipes_keys_are_applied_where_the_engine_has_them():
    config, unapplied = engine_config_from(CELL, RECIPE)
    assert config.moe.ragged_buffer_factor == 2.0 and config.moe.token_chunks == 4
    assert config.optimizer.mu_dtype == "bfloat16"
    assert config.model.remat_policy == "full"
    assert "remat_policy" not in unapplied  # a MaxText key, reported with its fate instead
    assert config.trainer_maxtext_keys[:3] == (
        ("attention", "flash"),
        ("remat_policy", "custom"),
        ("custom_mesh_and_rule", "cp-as-ep"),
    )
    assert config.trainer_maxtext_keys[-1] == ("mu_dtype", "bfloat16")
    assert len(config.trainer_maxtext_keys) == 12


def test_every_key_has_a_fate():
    fates = _fates(RECIPE)
    assert fates["ragged_buffer_factor"].startswith(
        "ragged_buffer_factor=2.0: applied with another meaning (ragged_buffer_factor=2.0;"
        " built-in engine: ceil(factor x tokens x top_k / experts) slots per expert"
    )
    assert fates["mu_dtype"] == "mu_dtype=bfloat16: applied (mu_dtype=bfloat16)"
    assert fates["remat_policy"].startswith("remat_policy=custom: applied (remat_policy=full;")
    assert fates["context"].startswith("context=remat: applied (part of remat_policy=custom")
    assert fates["megablox"] == "megablox=true: no equivalent"
    assert fates["num_vocab_tiling"] == "num_vocab_tiling=16: no equivalent"
    assert fates["attention"] == "attention=flash: no equivalent"
    assert len(fates) == 12


def test_the_trainers_scan_layers_runs_the_built_in_engines_layers_the_same_way():
    """MaxText's scan_layers means what the engine key does: the trainer's value is the engine's,
    and the cell's own default (scanned) where the trainer sets none."""
    config, unapplied = engine_config_from(CELL, 'MAXTEXT_EXTRA_FLAGS="scan_layers=false"')
    assert config.model.scan_layers is False and "scan_layers" not in unapplied
    assert _fates('MAXTEXT_EXTRA_FLAGS="scan_layers=false"') == {
        "scan_layers": "scan_layers=false: applied (scan_layers=false)"
    }
    assert engine_config_from(CELL, RECIPE)[0].model.scan_layers is True


def test_the_buffer_keys_say_they_are_applied_with_another_meaning():
    """The built-in engine's buffer is per expert, MaxText's per expert-parallel shard; MaxText
    chunks tokens only on its ring of experts."""
    fates = _fates(RECIPE)
    assert "rows per expert-parallel shard" in fates["ragged_buffer_factor"]
    assert fates["num_moe_token_chunks"].startswith(
        "num_moe_token_chunks=4: applied with another meaning (num_moe_token_chunks=4;"
    )
    assert fates["num_moe_token_chunks"].endswith(
        "off in the trainer's keys: there the key does nothing)"
    )
    ring = _fates('MAXTEXT_EXTRA_FLAGS="use_ring_of_experts=true num_moe_token_chunks=2"')
    assert ring["num_moe_token_chunks"].endswith(
        "on in the trainer's keys: each chunk fills the shards' buffers alone)"
    )
    # the same meaning in both: a dropless factor, a single chunk, and a key set again later
    same = _fates('MAXTEXT_EXTRA_FLAGS="ragged_buffer_factor=-1 num_moe_token_chunks=1"')
    assert (
        same["ragged_buffer_factor"] == "ragged_buffer_factor=-1: applied (ragged_buffer_factor=-1)"
    )
    assert (
        same["num_moe_token_chunks"] == "num_moe_token_chunks=1: applied (num_moe_token_chunks=1)"
    )
    overridden = trainer_key_fates(
        'MAXTEXT_EXTRA_FLAGS="ragged_buffer_factor=2 ragged_buffer_factor=3"'
    )
    assert overridden[0].describe() == (
        "ragged_buffer_factor=2: overridden by a later trainer key (ragged_buffer_factor=2)"
    )


def test_engine_flags_override_a_trainer_key_and_say_so():
    config, _ = engine_config_from(CELL, RECIPE, "ragged_buffer_factor=2.75")
    assert config.moe.ragged_buffer_factor == 2.75
    assert _fates(RECIPE, "ragged_buffer_factor=2.75")["ragged_buffer_factor"] == (
        "ragged_buffer_factor=2.0: overridden by ENGINE_FLAGS (ragged_buffer_factor=2.0)"
    )


def test_the_last_of_two_settings_wins_as_in_maxtext():
    argv = 'NUM_MOE_TOKEN_CHUNKS=2 MAXTEXT_EXTRA_FLAGS="num_moe_token_chunks=4" --mesh_fsdp=8'
    config, _ = engine_config_from(PRESETS["qwen3-30b-a3b-cell"], argv)
    assert config.moe.token_chunks == 4
    fates = trainer_key_fates(argv)
    assert [f.fate for f in fates] == ["overridden by a later trainer key", "applied"]


def test_a_custom_remat_that_keeps_tensors_has_no_equivalent():
    argv = 'MAXTEXT_EXTRA_FLAGS="decoder_layer_input=offload context=device" --remat_policy=custom'
    config, _ = engine_config_from(CELL, argv)
    assert config.model.remat_policy == CELL.engine.model.remat_policy
    remat = _fates(argv)["remat_policy"]
    assert remat.startswith("remat_policy=custom: no equivalent (keeps decoder_layer_input=offload")
    assert _fates(argv)["context"].startswith("context=device: no equivalent")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ('MAXTEXT_EXTRA_FLAGS="ragged_buffer_factor=wide" --x=1', "ragged_buffer_factor='wide'"),
        ('MAXTEXT_EXTRA_FLAGS="mu_dtype=float16" --x=1', "mu_dtype='float16'"),
        ('MAXTEXT_EXTRA_FLAGS="megablox" --x=1', "'megablox' is not key=value"),
        (
            'MAXTEXT_EXTRA_FLAGS="--remat_policy full" --x=1',
            "'--remat_policy' is not key=value; .* written without '--': did you mean"
            r" remat_policy=\.\.\.\?",
        ),
        ("NUM_MOE_TOKEN_CHUNKS=0 --x=1", "num_moe_token_chunks='0'"),
    ],
)
def test_a_bad_trainer_key_is_one_line_naming_it(argv, named):
    with pytest.raises(ConfigError, match=named) as raised:
        engine_config_from(CELL, argv)
    assert "\n" not in str(raised.value)


def test_a_command_without_maxtext_keys_keeps_the_field_empty():
    config, _ = engine_config_from(CELL, "--mesh_fsdp=32 --mesh_context=4 --mesh_expert=2")
    assert config.trainer_maxtext_keys == ()
    assert trainer_key_fates("--mesh_fsdp=32") == []


def test_a_maxtext_key_written_as_a_flag_is_named_with_its_bare_spelling():
    fates = _fates('MAXTEXT_EXTRA_FLAGS="--remat_policy=full megablox=true" --x=1')
    assert fates["--remat_policy"] == (
        "--remat_policy=full: no equivalent (MaxText keys are written without '--': did you mean"
        " remat_policy=full?)"
    )
    assert fates["megablox"] == "megablox=true: no equivalent"  # no hint where none is due


def test_a_trainers_unset_policy_is_left_to_its_maxtext_not_taken_from_the_preset():
    """The 397B preset chooses mu_dtype=bfloat16 and the measured run's MoE buffers; a MaxText
    trainer whose command sets none of them runs its MaxText's defaults, so MaxText's engine gets
    no key for them, while a key the trainer sets is passed, and a cell with no trainer (no argv)
    is the preset's own."""
    from rl_trainer_bench.engine.factory import MAXTEXT
    from rl_trainer_bench.engine.maxtext import keys as maxtext_keys

    preset = PRESETS["qwen3.5-397b-cell"]
    argv = "python3 -m tunix.cli.grpo_main --model_name=Qwen3.5-397B-A17B"
    unset, _ = engine_config_from(preset, argv, engine=MAXTEXT)
    keys, _ = maxtext_keys.translated_keys(unset)
    for key in ("mu_dtype", "ragged_buffer_factor", "num_moe_token_chunks", "adam_b1"):
        assert key not in keys
    assert keys["base_emb_dim"] == 4096  # the model is the cell's
    given, _ = engine_config_from(
        preset, "MAXTEXT_EXTRA_FLAGS='mu_dtype=bfloat16' " + argv, engine=MAXTEXT
    )
    assert maxtext_keys.translated_keys(given)[0]["mu_dtype"] == "bfloat16"
    assert "optimizer.mu_dtype" not in given.maxtext_defaults
    no_trainer, _ = engine_config_from(preset, engine=MAXTEXT)
    assert maxtext_keys.translated_keys(no_trainer)[0]["mu_dtype"] == "bfloat16"
    built_in, _ = engine_config_from(preset, argv)
    assert built_in.maxtext_defaults == ()


@pytest.mark.parametrize(
    ("written", "joined"), [("true", True), ("false", False), ("yes", True), ("N", False)]
)
def test_the_trainers_prefuse_flag_sets_the_engines_expert_layout(written, joined):
    """--prefuse_moe_weights is a Tunix flag it hands MaxText as its own key (as the v5p launcher
    writes it): the built-in engine applies it, a MaxText engine gets it passed, as the boolean
    Tunix's argparse makes of `yes` or `N` too."""
    argv = f"python -m tunix.main --mesh_fsdp=32 --prefuse_moe_weights={written}"
    config, unapplied = engine_config_from(CELL, argv)
    assert config.moe.prefuse_moe_weights is joined
    assert "prefuse_moe_weights" not in unapplied
    passed = "true" if joined else "false"
    assert config.trainer_maxtext_keys == (("prefuse_moe_weights", passed),)
    assert _fates(argv)["prefuse_moe_weights"] == (
        f"prefuse_moe_weights={passed}: applied (prefuse_moe_weights={passed})"
    )


def test_a_trainer_flag_the_engine_cannot_read_names_the_flag_and_where_to_fix_it():
    with pytest.raises(ConfigError) as refused:
        engine_config_from(CELL, "python -m tunix.main --prefuse_moe_weights=maybe")
    assert str(refused.value) == (
        "the trainer's MaxText key prefuse_moe_weights='maybe' (engine key"
        " prefuse_moe_weights='maybe': expected true or false): fix it in the trainer's command"
        " (its MAXTEXT_EXTRA_FLAGS, variables or flags)"
    )
