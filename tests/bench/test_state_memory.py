"""The plan's device memory line: the state per device from the parameter count, checked against
the shard shapes JAX lays out and against libtpu's figures for the production cell."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import pytest

from rl_trainer_bench.bench import plan
from rl_trainer_bench.bench.state_memory import state_memory
from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.builtin import programs, sharding
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT

REPO = Path(__file__).resolve().parents[2]
RECIPE_ARGV = (Path(__file__).parents[1] / "testdata" / "tpu7x_recipe_trainer_argv.txt").read_text()


def test_cpu_tiny_state_matches_its_shards_on_8_devices():
    engine = preset("cpu-tiny").engine
    mesh = sharding.make_mesh(engine.mesh, jax.devices()[: engine.mesh.size])
    sharded = residency.state_bytes(
        programs.abstract_state(engine, mesh), {}, stage_before_update=False
    )
    state = state_memory(engine)
    assert state.params == pytest.approx(sharded["params"], rel=1e-3)
    assert state.grad_sum == pytest.approx(sharded["grad_accum"], rel=1e-3)
    assert state.optimizer == pytest.approx(sharded["opt_state"], rel=1e-3)
    assert not state.optimizer_on_host


def test_the_397b_cell_at_the_recipes_keys_has_libtpus_state():
    """libtpu's shard shapes for the cell on tpu7x:4x4x8 (256 devices, mu_dtype=bfloat16), from
    benchmarks/results/aot_fit_table-trainer-keys.json: parameters 6,192,943,044 B per device,
    optimizer state 9,289,414,574 B (a float32 second moment, a bfloat16 first, two counters)."""
    engine = dataclasses.replace(
        preset("qwen3.5-397b-cell").engine,
        optimizer=dataclasses.replace(
            preset("qwen3.5-397b-cell").engine.optimizer, memory_host_offload=False
        ),
    )
    state = state_memory(engine)
    assert abs(state.params - 6_192_943_044) < 64 * 1024
    assert abs(state.optimizer - 9_289_414_574) < 64 * 1024
    assert state.on_device == state.params + state.grad_sum + state.optimizer


def _device_memory_line(
    argv: str, flags: str = "", trainer_slice: str = "tpu7x:4x4x8", engine: str = ""
) -> str:
    env = {
        "TRAINER_ARGV": argv,
        "ENGINE_FLAGS": flags,
        "TRAINER_SLICE": trainer_slice,
        "ENGINE": engine,
    }
    config = plan.environment_config({k: v for k, v in env.items() if v})
    lines = plan.resolve(config).lines()
    (line,) = [line for line in lines if line.startswith("plan: device memory:")]
    return line


def test_the_plan_shows_the_state_against_the_device_and_names_the_compile():
    line = _device_memory_line(RECIPE_ARGV, "optimizer_memory_host_offload=false")
    assert "state on the device 20.19 GiB per device" in line
    assert "optimizer state 8.65 GiB on the device" in line
    assert "of 96.00 GiB per tpu7x device" in line
    assert "rl-trainer-bench aot --preset qwen3.5-397b-cell --target tpu7x:4x4x8" in line
    # MaxText's engine with no key for the placement: the trainer's MaxText default, which the
    # figure can only assume (the recipe sets mu_dtype, so only the placement is assumed)
    unset = _device_memory_line(RECIPE_ARGV)
    assumed = (
        " [an estimate at the preset's optimizer_memory_host_offload=false; the pod runs the"
        " image's MaxText defaults for them]"
    )
    assert unset == line.replace(") of 96.00", ")" + assumed + " of 96.00")
    offloaded = _device_memory_line(RECIPE_ARGV, engine="builtin")  # the preset's placement
    assert "state on the device 11.54 GiB per device" in offloaded
    assert "optimizer state 8.65 GiB in host memory" in offloaded
    unsliced = _device_memory_line(RECIPE_ARGV, trainer_slice="")
    assert "no TRAINER_SLICE" in unsliced and "aot" not in unsliced


def _plan_lines(env: dict[str, str]) -> list[str]:
    return plan.resolve(plan.environment_config({"PRESET": "qwen3.5-397b-cell", **env})).lines()


def test_where_the_preset_differs_from_the_trainer_the_plan_says_so_until_a_key_overrides_it():
    differs = "plan: preset differs from the trainer: optimizer_memory_host_offload=true: "
    lines = _plan_lines({"TRAINER_SLICE": "tpu7x:4x4x8"})
    (line,) = [line for line in lines if line.startswith(differs)]
    assert "HBM temporary block, which no chip has confirmed yet" in line
    assert any("optimizer state 8.65 GiB in host memory" in line for line in lines)
    for env in (
        {"ENGINE_FLAGS": "optimizer_memory_host_offload=false"},
        {
            "TRAINER_ARGV": 'MAXTEXT_EXTRA_FLAGS="optimizer_memory_host_offload=false" python -m trainer.main'
        },
    ):
        lines = _plan_lines({"TRAINER_SLICE": "tpu7x:4x4x8", **env})
        assert not [line for line in lines if line.startswith("plan: preset differs")]
        assert any("optimizer state 8.65 GiB on the device" in line for line in lines)


def test_the_preset_reason_quotes_no_device_figures_and_cites_report_sections_that_exist():
    """A figure measured on one slice goes stale in another's plan (a v5p plan quoting a tpu7x
    device's memory): the reason says why, and its figures stay in the report sections it
    names."""
    differs = "plan: preset differs from the trainer: "
    (line,) = [
        line for line in _plan_lines({"TRAINER_SLICE": "v5p:4x8x8"}) if line.startswith(differs)
    ]
    assert not re.search(r"\d\s*(GiB|GB|MiB)", line)
    (report,) = re.findall(r"benchmarks/reports/[\w.-]+\.md", line)
    headings = [h for h in (REPO / report).read_text().splitlines() if h.startswith("#")]
    cited = re.findall(r'"([^"]+)"', line.partition(report)[2])
    assert len(cited) == 2
    for section in cited:
        assert any(section in heading for heading in headings), section


def test_a_difference_for_the_built_in_engines_memory_leaves_maxtexts_program_as_the_trainers():
    """The preset keeps the optimizer state in host memory for the built-in engine's fit only:
    MaxText's engine times the trainer's placement, and the plan has nothing to say about it."""
    cell = preset("qwen3.5-397b-cell")
    maxtext, _ = engine_config_from(cell, engine=MAXTEXT)
    built_in, _ = engine_config_from(cell, engine=BUILT_IN)
    assert maxtext.optimizer.memory_host_offload is False
    assert built_in.optimizer.memory_host_offload is True
    lines = _plan_lines({"TRAINER_SLICE": "tpu7x:4x4x8", "ENGINE": "maxtext"})
    assert not [line for line in lines if line.startswith("plan: preset differs")]
    assert any("optimizer state 8.65 GiB on the device" in line for line in lines)
    asked, _ = engine_config_from(
        cell, engine_flags="optimizer_memory_host_offload=true", engine=MAXTEXT
    )
    assert asked.optimizer.memory_host_offload is True  # a key the user sets still holds
