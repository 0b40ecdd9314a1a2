"""The renderer on real launcher output (skipped where ../shared is absent)."""

import shlex

import pytest
from render_helpers import exports, launch_render, load_manifest

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.client_command import read_client_command
from rl_trainer_bench.launch.diff import diff, unexpected
from rl_trainer_bench.launch.dry_run import client_container, find_trainer, read_documents
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render
from rl_trainer_bench.launch.validate import jobset_problems

EXPECTED = {"names", "restarts", "command", "provenance"}


# Qwen3-1.7B has no preset: PRESET picks one, and the micro-batch fills the trainer's 8-way mesh.
_GSM8K_KNOBS = {
    "driver_env": "PRESET=qwen3-30b-a3b-cell",
    "engine_flags": "train_micro_batch_size=8 compute_logps_chunk_size=128",
}


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        ("tunix-gsm8k-start.yaml", _GSM8K_KNOBS),
        ("tunix-mlperf-397b-256-v5p-trainer.stdout.txt", {}),
    ],
)
def test_real_launch_renders_to_a_valid_bench_that_changes_only_what_it_should(name, knobs):
    text = launch_render(name).read_text()
    trainer = find_trainer(read_documents(text, name), name)
    bench = load_manifest(render(text, name, RenderKnobs.from_strings(knobs)))
    assert jobset_problems(bench) == []
    assert unexpected(diff(trainer, bench), EXPECTED) == []
    launch = read_client_command(client_container(trainer)["command"])
    env = exports(bench)
    words = shlex.split(env["TRAINER_ARGV"])
    carried = words[: len(words) - len(launch.argv)]
    assert words[len(carried) :] == launch.argv
    # before the flags, the variables that carry MaxText keys, exactly as the trainer had them
    assert all(launch.env[word.split("=")[0]] == word.partition("=")[2] for word in carried)
    if "397b" in name:
        assert [word.split("=")[0] for word in carried] == [
            "TRAINER_MAXTEXT_ATTENTION",
            "FLOAT32_GATE_LOGITS",
            "FLOAT32_LOGITS",
        ]
    for key, value in launch.env.items():
        assert env[key] == value


def test_397b_trainer_keeps_its_libtpu_flags_and_moves_to_a_new_slice():
    name = "tunix-mlperf-397b-256-v5p-trainer.stdout.txt"
    text = launch_render(name).read_text()
    knobs = RenderKnobs.from_strings(
        {
            "trainer_slice": "tpu7x:4x4x8",
            "libtpu_flags": "--xla_tpu_scoped_vmem_limit_kib=98304",
            "engine_flags": "mesh_fsdp=16",  # 16 x 8 x 2 fills the 128 chips' 256 devices
        }
    )
    bench = load_manifest(render(text, name, knobs))
    flags = exports(bench)["LIBTPU_INIT_ARGS"].split()
    assert "--xla_tpu_scoped_vmem_limit_kib=98304" in flags
    assert "--xla_tpu_scoped_vmem_limit_kib=65536" not in flags
    assert "--xla_tpu_aggressive_opt_barrier_removal=true" in flags
    assert len(flags) == 13
    workers = bench["spec"]["replicatedJobs"][1]["template"]["spec"]
    assert (workers["completions"], workers["parallelism"]) == (32, 32)
    assert jobset_problems(bench) == []


def test_a_real_launch_of_a_model_without_a_preset_is_refused_naming_preset():
    name = "tunix-gsm8k-start.yaml"
    with pytest.raises(UserError, match=r"--model_name=Qwen3-1\.7B is not a model .* set PRESET"):
        render(launch_render(name).read_text(), name, RenderKnobs())


def test_rollout_only_launch_is_refused_listing_what_was_found():
    name = "tunix-mlperf-397b-256-v5p-rollout.stdout.txt"
    with pytest.raises(UserError) as raised:
        render(launch_render(name).read_text(), name, RenderKnobs())
    message = str(raised.value)
    assert "no trainer JobSet" in message and "starts a Pathways trainer" in message
    assert "--trainer-jobset" not in message  # naming one of them would be refused too
    assert all(f"benchuser-roll-{i} (no Pathways head)" in message for i in range(4))
