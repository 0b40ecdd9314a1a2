"""The plan refuses what the run would: a negative seed, counts past their bounds, a micro-batch
pool too large for the host or a micro-batch too large for the slice's devices; and aot and
check-engine read the trainer argv and judge the mesh with the plan's own parser and check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.bench import entry, micro_batch_memory, plan
from rl_trainer_bench.bench.micro_batch_memory import micro_batch_bytes
from rl_trainer_bench.chips.accelerators import parse_slice
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.errors import ConfigError, UserError
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

GIB = 1024**3
FIXTURE = Path(__file__).parents[1] / "testdata" / "launch_dryrun_fixture.yaml"
HUGE_SEQUENCE = "--max_prompt_length=68719476224 --max_response_length=512"  # 2^36 tokens


def _plan_exit(env: dict[str, str], capsys) -> tuple[int, str]:
    code = entry.main([], {"PLAN_ONLY": "1", **env})
    return code, capsys.readouterr().err


def test_the_397b_cells_micro_batch_is_5_13_gb():
    # 64 rows x 65,536 tokens x (6 arrays x 4 bytes + 60 layers x top-10 x 2 bytes of routes),
    # the size the payload builder writes (README: the production cell's 5.13 GB micro-batch)
    assert micro_batch_bytes(preset("qwen3.5-397b-cell").engine) == 5_133_828_096


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("SEED", "-1", "SEED=-1 is too small: use an integer >= 0"),
        ("STEPS", "99999999999999999999", "STEPS=99999999999999999999 is too large"),
        ("WARMUP_STEPS", "100001", "WARMUP_STEPS=100001 is too large: use an integer <= 100,000"),
        ("MICRO_STEPS", "5000", "MICRO_STEPS=5000 is too large: use an integer <= 4,096"),
        ("SEED", "9" * 5000, "is not an integer"),
    ],
)
def test_plan_refuses_what_the_run_refuses(knob, value, message, capsys):
    code, err = _plan_exit({knob: value}, capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_a_render_refuses_a_seed_its_pod_would_refuse():
    with pytest.raises(UserError, match="SEED=-1 is too small"):
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings({"driver_env": "SEED=-1"}))


def test_a_pool_too_large_for_this_host_is_refused_at_plan_time_with_the_numbers(capsys):
    code, err = _plan_exit({"TRAINER_ARGV": HUGE_SEQUENCE}, capsys)
    assert code == 2
    assert "the micro-batch pool needs 24.00 TiB of host memory (3 x 8.00 TiB: 4 rows of" in err
    assert "68,719,476,736 tokens) and this host has " in err


def test_a_pool_too_large_for_its_filler_names_the_engine_key_to_lower(capsys):
    code, err = _plan_exit({"ENGINE_FLAGS": "extra_host_bytes=99999999999999999999"}, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "lower the engine key extra_host_bytes (ENGINE_FLAGS; 99,999,999,999,999,999,999" in err
    assert "max_prompt_length" not in err
    code, err = _plan_exit(
        {"TRAINER_ARGV": HUGE_SEQUENCE, "ENGINE_FLAGS": "extra_host_bytes=8"}, capsys
    )
    assert (
        code == 2 and "shorten max_prompt_length/max_response_length" in err
    )  # tokens, not filler


def test_the_pool_and_the_devices_are_checked_against_given_sizes():
    config = BenchConfig.from_env(
        {"TRAINER_ARGV": "--max_prompt_length=16383 --max_response_length=1"}
    )  # 4 rows x 16,384 tokens x 32 bytes = 2 MiB each, 3 in the pool
    plan.resolve(config, host_bytes=6 * 1024**2)
    with pytest.raises(ConfigError, match=r"needs 6\.00 MiB of host memory .* has 5\.00 MiB"):
        plan.resolve(config, host_bytes=5 * 1024**2)
    long_rows = BenchConfig.from_env(
        {
            "TRAINER_ARGV": "--max_prompt_length=8589934080 --max_response_length=512",
            "TRAINER_SLICE": "v5p:2x2x2",
        }
    )  # 4 rows x 2^33 tokens x 32 bytes = 1 TiB, 128 GiB on each of 8 devices of 95 GiB
    assert parse_slice("v5p:2x2x2").chip.memory_bytes < 128 * GIB
    with pytest.raises(ConfigError, match=r"puts 128\.00 GiB on each of 8 devices and a v5p"):
        plan.resolve(long_rows)
    # A tpu7x chip holds 192 GiB but shows two devices of 96 GiB each: 128 GiB fits the chip, not
    # the device that receives it.
    on_tpu7x = dataclasses.replace(long_rows, trainer_slice=parse_slice("tpu7x:2x2x1"))
    with pytest.raises(ConfigError, match=r"128\.00 GiB on each of 8 devices and a tpu7x device"):
        plan.resolve(on_tpu7x)


def test_a_plan_for_a_slice_does_not_judge_this_hosts_memory(capsys, monkeypatch):
    monkeypatch.setattr(micro_batch_memory, "host_memory_bytes", lambda: GIB)
    code, err = _plan_exit(
        {
            "TRAINER_ARGV": "--max_prompt_length=67108352 --max_response_length=512",
            "TRAINER_SLICE": "v5p:2x2x2",
        },
        capsys,
    )  # 24 GiB of pool: more than this host (1 GiB, as the test says), nothing to a v5p host
    assert (code, err) == (0, "")


@pytest.mark.parametrize("command", ["aot", "check-engine"])
@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--trainer-argv=--mesh_fsdp='", "does not parse as shell words (No closing quotation)"),
        (
            "--engine-flags=mesh_fsdp=8 mesh_context=1 mesh_expert=1",
            "micro_batch_rows=4: must be a positive multiple of mesh fsdp x expert = 8",
        ),
    ],
)
def test_aot_and_check_engine_refuse_what_the_plan_refuses(command, flag, message, capsys):
    assert cli.main([command, flag]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert cli.main(["run", "--plan", flag]) == 2
    assert message in capsys.readouterr().err


def test_aot_bounds_its_micro_steps_like_the_knob(capsys):
    assert cli.main(["aot", "--micro-steps", "99999999999999999999999"]) == 2
    assert "--micro-steps=99999999999999999999999 is too large: use an integer <= 4,096" in (
        capsys.readouterr().err
    )
