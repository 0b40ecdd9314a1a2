"""Shared test helpers for the renderer tests: the fixture, the real renders, the client script."""

from __future__ import annotations

from pathlib import Path

import yaml
from reference_data import launch_render

from rl_trainer_bench.launch.dry_run import client_container
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "testdata" / "launch_dryrun_fixture.yaml"


# libyaml's parser where PyYAML was built with it: a rendered manifest is mostly its code's
# base64, which PyYAML's own scanner reads a character at a time.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_manifest(text: str) -> dict:
    """A rendered manifest's YAML read back, as `yaml.safe_load` reads it."""
    return yaml.load(text, Loader=_LOADER)


def render_fixture(**knobs: str) -> dict:
    text = render(FIXTURE.read_text(), FIXTURE.name, RenderKnobs.from_strings(knobs))
    return load_manifest(text)


def client_script(bench: dict) -> str:
    return client_command(bench)[2]


def client_command(bench: dict) -> list[str]:
    """The client container's whole command: `bash -c SCRIPT NAME` and the code's base64 parts."""
    command = client_container(bench)["command"]
    assert command[:2] == ["bash", "-c"]
    return command


def exports(bench: dict) -> dict[str, str]:
    from rl_trainer_bench.launch.client_command import read_client_command

    return read_client_command(client_script(bench)).env


# The trainer command of the public Qwen3.5-397B recipe for tpu7x:4x4x8 (Tunix's MLPerf DeepSWE
# launcher, mlperf_397b_256_v7x.sh): its MAXTEXT_EXTRA_FLAGS, mesh, batch, lengths and
# REMAT_POLICY=custom (passed as --remat_policy). benchmarks/aot/aot_fit_table.py compiles it too.
TPU7X_TRAINER_ARGV = REPO / "tests" / "testdata" / "tpu7x_recipe_trainer_argv.txt"


def tpu7x_maxtext_extra_flags() -> str:
    from rl_trainer_bench.config.engine_keys import parse_trainer_command

    return parse_trainer_command(TPU7X_TRAINER_ARGV.read_text())[0]["MAXTEXT_EXTRA_FLAGS"]


def tpu7x_trainer_launch() -> str:
    """The v5p 397B launcher output rewritten as the tpu7x recipe's trainer launch: the slice
    (tpu7x 4x4x8: 32 hosts of 4 chips, 2 devices each), the mesh 32 x 4 x 2 over 256 devices,
    64-row micro-batches, custom remat and the recipe's MaxText keys before `python`."""
    text = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt").read_text()
    rewrites = [
        ("gke-tpu-accelerator: tpu-v5p-slice", "gke-tpu-accelerator: tpu7x"),
        ("gke-tpu-topology: 4x8x8", "gke-tpu-topology: 4x4x8"),
        ("--instance_type=tpuv5:4x8x8", "--instance_type=tpu7x:4x4x8"),
        ("completions: 64", "completions: 32"),
        ("parallelism: 64", "parallelism: 32"),
        ("RAIDEN_DEVICES_PER_HOST=4", "RAIDEN_DEVICES_PER_HOST=8"),
        ("--mesh_fsdp=16", "--mesh_fsdp=32"),
        ("--mesh_context=8", "--mesh_context=4"),
        ("--train_micro_batch_size=32", "--train_micro_batch_size=64"),
        ("--remat_policy=full", "--remat_policy=custom"),
        (
            " python -m tunix",
            f' MAXTEXT_EXTRA_FLAGS="{tpu7x_maxtext_extra_flags()}" python -m tunix',
        ),
    ]
    for old, new in rewrites:
        assert old in text, old
        text = text.replace(old, new)
    return text
