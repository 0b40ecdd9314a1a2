"""A key that names a Pallas TPU kernel (expert_compute=sorted_gmm, dropless_compute=gmm,
attention=splash, linear_chunk_inverse=pallas, linear_chunk_kernel=pallas) is refused off a TPU: by the plan, before any work, where the run's platform is
known before JAX starts (a host preset, or JAX_PLATFORMS=cpu); by the engine as it resolves its
methods everywhere else. One line each, naming the key and what runs instead."""

from __future__ import annotations

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.bench.plan import resolve
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin.programs import resolved_methods
from rl_trainer_bench.engine.config import with_value_at
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import ConfigError

# key=value, the dotted field it sets, and a choice the refusal must offer instead
KERNELS = [
    ("expert_compute=sorted_gmm", "moe.expert_compute", "sorted_ragged_dot"),
    ("dropless_compute=gmm", "moe.dropless_compute", "ragged_dot"),
    ("attention=splash", "model.attention", "xla"),
    ("linear_chunk_inverse=pallas", "model.linear_chunk_inverse", "xla"),
    ("linear_chunk_kernel=pallas", "model.linear_chunk_kernel", "xla"),
    ("linear_conv_kernel=pallas", "model.linear_conv_kernel", "xla"),
]
ONE_CONTEXT = "mesh_context=1 mesh_fsdp=4 train_micro_batch_size=8"  # whole rows, as splash needs
# cpu-tiny's Gated DeltaNet heads (16 wide) are narrower than the chunk kernels' TPU blocks, and
# its q, k and v (192 channels) than the convolution kernel's, so there those keys are refused by
# their shapes first (tests/engine/test_delta_rule_kernel.py, test_conv_kernel.py): the plan's
# cases below check them on the chip preset alone
NARROWER_THAN_HOST_PRESET = ("linear_chunk_kernel=pallas", "linear_conv_kernel=pallas")


def _config(preset: str, key_value: str) -> BenchConfig:
    """`preset` with the kernel's key alone among them; cpu-tiny's mesh made one of whole rows
    first, tpu-v5e-1's own kernels set aside."""
    first = (
        "expert_compute=einsum attention=xla linear_chunk_inverse=xla linear_chunk_kernel=xla"
        if preset == "tpu-v5e-1"
        else ONE_CONTEXT
    )
    flags = f"{first} {key_value}"
    return BenchConfig.from_env({"PRESET": preset, "ENGINE_FLAGS": flags})


@pytest.mark.parametrize(("key_value", "path", "instead"), KERNELS)
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_the_engine_refuses_a_tpu_kernel_on_another_platform(key_value, path, instead, platform):
    value = key_value.split("=")[1]
    engine = with_value_at(PRESETS["cpu-tiny"].engine, path, value)
    with pytest.raises(ContractError, match=rf"^engine config {key_value}: .*use {instead}"):
        resolved_methods(engine, platform)
    assert value in resolved_methods(engine, "tpu")


def _plan_cases(settings):
    """Every kernel key under every (id, preset, env) of `settings`, but those a host preset's
    shapes refuse first."""
    return [
        pytest.param(*kernel, preset, env, id=f"{name}-{kernel[0]}")
        for kernel in KERNELS
        for name, preset, env in settings
        if not (preset == "cpu-tiny" and kernel[0] in NARROWER_THAN_HOST_PRESET)
    ]


@pytest.mark.parametrize(
    ("key_value", "path", "instead", "preset", "env"),
    _plan_cases(
        [
            ("host preset", "cpu-tiny", {}),
            ("chip preset on JAX_PLATFORMS=cpu", "tpu-v5e-1", {"JAX_PLATFORMS": "cpu"}),
            ("host preset on JAX_PLATFORMS=cpu", "cpu-tiny", {"JAX_PLATFORMS": "cpu"}),
        ]
    ),
)
def test_the_plan_refuses_it_where_the_run_is_bound_to_the_host_cpu(
    key_value, path, instead, preset, env
):
    config = _config(preset, key_value)
    with pytest.raises(
        ConfigError, match=rf"^engine config {key_value}: .*host's CPU; use {instead}"
    ):
        resolve(config, env=env)


@pytest.mark.parametrize(
    ("key_value", "path", "instead", "preset", "env"),
    _plan_cases(
        [
            ("chip preset", "tpu-v5e-1", {}),
            ("host preset on JAX_PLATFORMS=tpu", "cpu-tiny", {"JAX_PLATFORMS": "tpu"}),
            ("no environment (a render)", "cpu-tiny", None),
        ]
    ),
)
def test_the_plan_leaves_it_to_the_engine_where_a_tpu_may_run_it(
    key_value, path, instead, preset, env
):
    plan = resolve(_config(preset, key_value), env=env)
    assert key_value.split("=")[1] in str(plan.engine)


def test_an_ab_arm_naming_a_tpu_kernel_is_refused_before_any_arm_runs(tmp_path, capsys):
    out = tmp_path / "out"
    arms = "a:expert_compute=sorted_ragged_dot,b:expert_compute=sorted_gmm"
    assert cli.main(["ab", "--preset", "cpu-tiny", "--arms", arms, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "arm b: engine config expert_compute=sorted_gmm: a Pallas TPU kernel" in err
    assert not out.exists()
