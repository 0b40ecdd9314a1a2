"""Shared test helpers for the renderer tests: the fixture, the real renders, the client script."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_trainer_bench.launch.dry_run import client_container
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "testdata" / "launch_dryrun_fixture.yaml"
# ../shared beside the repository root (a checkout's parent, or further up for nested checkouts).
SHARED = next(
    (folder / "shared" for folder in REPO.parents if (folder / "shared" / "reference").is_dir()),
    REPO.parent / "shared",
)
LAUNCH_RENDERS = SHARED / "reference" / "launch-renders"


def real_render(name: str) -> Path:
    path = LAUNCH_RENDERS / name
    if not path.is_file():
        pytest.skip(f"reference launch renders absent ({path})")
    return path


def render_fixture(**knobs: str) -> dict:
    text = render(FIXTURE.read_text(), FIXTURE.name, RenderKnobs.from_strings(knobs))
    return yaml.safe_load(text)


def client_script(bench: dict) -> str:
    command = client_container(bench)["command"]
    assert command[:2] == ["bash", "-c"]
    return command[2]


def exports(bench: dict) -> dict[str, str]:
    from rl_trainer_bench.launch.client_command import read_client_command

    return read_client_command(client_script(bench)).env


# The MAXTEXT_EXTRA_FLAGS of the public Qwen3.5-397B trainer recipe for tpu7x:4x4x8 (Tunix's
# MLPerf DeepSWE launcher, mlperf_397b_256_v7x.sh), with its REMAT_POLICY=custom as the flag the
# launcher passes it as.
TPU7X_MAXTEXT_EXTRA_FLAGS = (
    "custom_mesh_and_rule=cp-as-ep use_gdn_kernel=true gdn_cp_mode=head"
    " decoder_layer_input=device context=remat gdn=remat gdn_conv=remat gdn_states=remat"
    " megablox=true sparse_matmul=true use_tokamax_gmm=true use_gmm_v2=true"
    " use_gmm_v2_heuristic_tiling=true merge_gating_gmm=false use_ring_of_experts=true"
    " num_moe_token_chunks=4 use_ragged_sort=true use_custom_sort_vjp=false"
    " ragged_buffer_factor=2.0 use_tokamax_splash=true use_splash_scheduler=true sa_block_q=512"
    " sa_block_kv=1024 sa_block_kv_compute=512 sa_block_q_dkv=1024 sa_block_kv_dkv=2048"
    " sa_block_kv_dkv_compute=1024 sa_fuse_reciprocal=false sa_use_base2_exp=true"
    " dq_reduction_steps=3 context_parallel_load_balance=false allow_split_physical_axes=false"
    " num_vocab_tiling=16 mu_dtype=bfloat16 checkpoint_storage_concurrent_gb=96"
    " checkpoint_storage_use_ocdbt=false checkpoint_storage_use_zarr3=false"
)


def tpu7x_trainer_launch() -> str:
    """The v5p 397B launcher output rewritten as the tpu7x recipe's trainer launch: the slice
    (tpu7x 4x4x8: 32 hosts of 4 chips, 2 devices each), the mesh 32 x 4 x 2 over 256 devices,
    64-row micro-batches, custom remat and the recipe's MaxText keys before `python`."""
    text = real_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt").read_text()
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
        (" python -m tunix", f' MAXTEXT_EXTRA_FLAGS="{TPU7X_MAXTEXT_EXTRA_FLAGS}" python -m tunix'),
    ]
    for old, new in rewrites:
        assert old in text, old
        text = text.replace(old, new)
    return text
