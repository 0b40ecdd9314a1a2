"""Every variable of the trainer's environment gets a fate; the values nobody set name their source."""

from __future__ import annotations

import pytest

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.config.trainer_env import environment_fates, fate_of
from rl_trainer_bench.config.value_sources import unset_values


@pytest.mark.parametrize(
    ("name", "fate"),
    [
        ("TUNIX_LOGPS_SHARDED_HEAD", "not reproduced"),
        ("PREFUSE_MOE_WEIGHTS", "not reproduced"),
        ("MAXTEXT_EXTRA_FLAGS", "carries MaxText keys"),
        ("REMAT_POLICY", "carries MaxText keys"),
        ("LIBTPU_INIT_ARGS", "applied"),
        ("RAIDEN_DEVICES_PER_HOST", "outside the timed step"),
        ("CKPT_USE_OCDBT", "outside the timed step"),
        ("JOBSET_NAME", "runtime plumbing"),
        ("JAX_PLATFORMS", "runtime plumbing"),
        ("KUBERNETES_SERVICE_HOST", "runtime plumbing"),
        ("MY_SERVICE_PORT_8080_TCP_ADDR", "runtime plumbing"),
        ("TUNIX_NEW_KNOB", "not known to the bench"),
    ],
)
def test_each_variable_has_its_fate(name, fate):
    assert fate_of(name, "1", {}).fate == fate


def test_the_sharded_head_is_checked_in_the_pod_where_tunixs_loss_may_run():
    """Under Tunix's driver the image's Tunix runs its chunked pass and reads the variable; the
    plan cannot see that Tunix, so the pod checks it."""
    fate = fate_of("TUNIX_LOGPS_SHARDED_HEAD", "local", {}, tunix_loss=True)
    assert fate.fate == "checked in the pod"
    assert "logps_sharded_head" in fate.why and "chunked_logps" in fate.why
    assert fate_of("PREFUSE_MOE_WEIGHTS", "true", {}, tunix_loss=True).fate == "not reproduced"


def test_a_variable_the_engine_has_as_a_key_is_compared_with_what_the_engine_runs():
    same = fate_of("MAX_GRAD_NORM", "0.125", {"max_grad_norm": "0.125"})
    other = fate_of("MAX_GRAD_NORM", "0.125", {"max_grad_norm": "1.0"})
    assert (same.fate, other.fate) == ("matches the engine", "not reproduced")
    assert "max_grad_norm=0.125 in ENGINE_FLAGS" in other.why


def test_only_the_variables_the_renderer_named_are_the_trainers():
    env = {"BENCH_TRAINER_ENV": "TUNIX_LOGPS_SHARDED_HEAD A", "A": "x", "HOME": "/root"}
    fates = environment_fates(env, {})
    assert [(f.name, f.value, f.fate) for f in fates] == [
        ("TUNIX_LOGPS_SHARDED_HEAD", "", "not reproduced"),
        ("A", "x", "not known to the bench"),
    ]


def _sources(preset: str, argv: str = "", flags: str = "") -> dict[str, tuple[str, str]]:
    cell = PRESETS[preset]
    from rl_trainer_bench.config.engine_keys import engine_config_from

    engine, _ = engine_config_from(cell, argv, flags)
    return {v.key: (v.value, v.source) for v in unset_values(cell, engine, argv, flags)}


def test_values_nobody_set_come_from_the_preset_or_the_engine_default():
    sources = _sources("cpu-tiny")
    assert sources["ragged_buffer_factor"] == ("2.0", "preset")  # cpu-tiny's own
    assert sources["retry_when_tokens_dropped"] == ("true", "engine default")
    assert sources["mesh_fsdp"] == ("2", "preset")


def test_keys_the_trainer_or_engine_flags_set_are_not_listed():
    sources = _sources(
        "cpu-tiny", "MAXTEXT_EXTRA_FLAGS=mu_dtype=bfloat16 --mesh_fsdp=8", "beta=0.04"
    )
    assert not {"mesh_fsdp", "mesh_context", "mesh_expert", "mu_dtype", "beta"} & set(sources)
    assert "epsilon" in sources


def test_the_397b_presets_values_carry_their_reasons():
    cell = PRESETS["qwen3.5-397b-cell"]
    from rl_trainer_bench.config.engine_keys import engine_config_from

    engine, _ = engine_config_from(cell, "--mesh_fsdp=16 --mesh_context=8 --mesh_expert=2")
    found = {
        v.key: v
        for v in unset_values(cell, engine, "--mesh_fsdp=16 --mesh_context=8 --mesh_expert=2")
    }
    assert found["mu_dtype"].describe() == "mu_dtype=bfloat16 (the public tpu7x recipe's)"
    assert found["ragged_buffer_factor"].source == "preset"


def test_a_presets_reason_goes_with_its_value_only():
    """For MaxText's engine the 397B cell keeps the trainer's optimizer placement (the engine's
    default): that value is not the preset's, and the preset's reason for offloading is not its."""
    cell = PRESETS["qwen3.5-397b-cell"]
    from rl_trainer_bench.config.engine_keys import engine_config_from
    from rl_trainer_bench.engine.factory import MAXTEXT

    engine, _ = engine_config_from(cell, engine=MAXTEXT)
    (offload,) = [v for v in unset_values(cell, engine) if v.key == "optimizer_memory_host_offload"]
    assert offload.describe() == "optimizer_memory_host_offload=false"
    assert offload.source == "engine default"
