"""The rendered pod times the trainer's own cell: its driver's `--plan`, run from the pod's own code.

Each test renders a launcher's output, unpacks the code bundle embedded in the client command,
and runs that bundle's `bench_driver.py --plan` here, with exactly the environment the script
exports, so what is checked is what the pod would print before touching a device.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from render_helpers import (
    FIXTURE,
    REPO,
    client_command,
    exports,
    launch_render,
    load_manifest,
    tpu7x_trainer_launch,
)

from rl_trainer_bench.bench import entry
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.pod_script import SCRIPT_NAME
from rl_trainer_bench.launch.render import render, render_with_plan

UNKNOWN_MODEL = REPO / "tests" / "testdata" / "launch_dryrun_unknown_model.yaml"


def _pod_plan(bench: dict, folder: Path) -> subprocess.CompletedProcess:
    """`bench_driver.py --plan` from the bundle in `bench`'s client script, in its environment."""
    command = client_command(bench)
    assert command[3] == SCRIPT_NAME
    bundle = base64.b64decode("\n".join(command[4:]))
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:xz") as archive:
        archive.extractall(folder, filter="data")
    environment = {**exports(bench), "PATH": os.environ["PATH"], "PYTHONPATH": str(folder)}
    return subprocess.run(
        [sys.executable, str(folder / "bench_driver.py"), "--plan"],
        env=environment,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_397b_launch_renders_a_pod_that_plans_the_397b_cell_on_its_slice(tmp_path):
    name = "tunix-mlperf-397b-256-v5p-trainer.stdout.txt"
    bench = load_manifest(render(launch_render(name).read_text(), name, RenderKnobs()))
    assert "PRESET" not in exports(bench)  # the model comes from the trainer's own flags
    result = _pod_plan(bench, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        "plan: cell: qwen3.5-397b-cell mesh 16 x 8 x 2 (fsdp x context x expert),"
        " micro-batch 32 rows of 65,536 tokens, 8 micro-steps per step"
    ) in lines
    assert "plan: preset: qwen3.5-397b-cell (chosen by --model_name=Qwen3.5-397B-A17B)" in lines
    assert "plan: mesh: 16 x 8 x 2 = 256 devices on v5p:4x8x8 (256 chips)" in lines
    # this trainer sets no MoE buffer keys, so the pod runs its MaxText's defaults for them (not
    # the preset's measured-run values), and the plan forecasts no buffer it cannot know
    assert (
        "plan: moe: ragged_buffer_factor and num_moe_token_chunks: the image's MaxText defaults"
        " (the trainer's command sets none), so no replay is forecast here: the buffer the pod"
        " runs is that MaxText's"
    ) in lines
    assert lines[-1] == "plan: ok: every knob is valid; nothing ran on a device"


def test_a_maxtext_trainers_sharded_head_and_chunked_pass_are_checked_in_the_pod():
    """The trainer chunks its log-probs and names Tunix's sharded head: the pod's Tunix decides
    both, so the plan says what the pod checks, not a fate it cannot know."""
    text = tpu7x_trainer_launch().replace(
        " python -m tunix", " TUNIX_LOGPS_SHARDED_HEAD=local python -m tunix", 1
    )
    plan = render_with_plan(text, "tpu7x", RenderKnobs()).plan
    listed = {f.name: f.fate for f in plan.environment_listed()}
    assert listed["TUNIX_LOGPS_SHARDED_HEAD"] == "checked in the pod"
    facts = dict(plan.engine_facts)
    assert facts["chunked log-prob pass"].startswith(
        "checked in the pod: chunk 512 through Tunix's own chunked pass"
    )


def test_the_tpu7x_launch_plans_the_trainers_cell_with_its_maxtext_keys(tmp_path):
    bench = load_manifest(render(tpu7x_trainer_launch(), "tpu7x", RenderKnobs()))
    assert bench["metadata"]["annotations"].get("rl-trainer-bench/slice") is None  # its own slice
    result = _pod_plan(bench, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        "plan: cell: qwen3.5-397b-cell mesh 32 x 4 x 2 (fsdp x context x expert),"
        " micro-batch 64 rows of 65,536 tokens, 4 micro-steps per step"
    ) in lines
    # its step from its flags: 16 x 16 sequences, each up to a whole 65,536-token packed row,
    # in 64-row micro-batches: at most 256 / 64 = 4 micro-batches, not the preset's 9
    assert (
        "plan: value from the launcher: micro_steps=4 (16 prompts x 16 generations = 256 sequences"
        " per step (the trainer's --mini_batch_size and --num_generations), packed into rows of"
        " --max_seq_token_per_tpu=65536 tokens, at least 1 per row (sequences of up to 65,536"
        " tokens: --max_prompt_length + --max_response_length), in 64-row micro-batches (the"
        " trainer's --train_micro_batch_size); shorter rollouts pack into fewer: at most 4"
        " micro-steps per step; preset qwen3.5-397b-cell has 9)"
    ) in lines
    assert any(line.startswith("plan: model: layers=60 d_model=4096") for line in lines)
    assert "plan: mesh: 32 x 4 x 2 = 256 devices on tpu7x:4x4x8 (128 chips = 256 devices)" in lines
    # the trainer runs MaxText: the pod times MaxText's engine with the trainer's keys, from the
    # image's MaxText (not importable on this host, which the pod's plan says)
    assert (
        "plan: engine: rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine (the trainer runs"
        " MaxText (--trainer_backend=maxtext): its own program)"
    ) in lines
    assert "plan: maxtext: not importable here: the run needs maxtext and Tunix installed" in lines
    assert any(line.startswith("plan: loss: MaxText's router-replay loss") for line in lines)
    assert "plan: trainer MaxText keys: 42 (42 passed to MaxText)" in lines
    # the recipe's factor 2.0 in MaxText's buffer: its ring of experts with the ragged sort
    # chunks each device's 65,536 / 4 = 16,384 tokens into 4 of 4,096; cp-as-ep makes 4 x 2 = 8
    # expert shards, each with int(2.0 x 4,096 x 10) = 81,920 rows for 8 x 4,096 tokens' pairs.
    # The built-in engine's per-expert buffer at the same keys replays every micro-batch.
    assert (
        "plan: moe: ragged_buffer_factor=2 num_moe_token_chunks=4 retry_when_tokens_dropped=true:"
        " P(replay)=0.00 per micro-batch (MaxText's buffer, ring of experts: 81,920 rows per"
        " expert-parallel shard of 8, filled from the 32,768 tokens of its group), forecast by"
        " the shipped synthetic routing profile qwen3.5-397b.json"
        " (its skew chosen to match the measured run's 0 replays at ragged_buffer_factor=2.75"
        " with 2 token chunks, in the built-in engine's buffer: no evidence for that outcome)"
    ) in lines
    for line in (
        "plan: trainer key: ragged_buffer_factor=2.0: passed to MaxText",
        "plan: trainer key: use_tokamax_splash=true: passed to MaxText",
        "plan: trainer key: remat_policy=custom: passed to MaxText",
    ):
        assert line in lines
    assert lines[-1] == "plan: ok: every knob is valid; nothing ran on a device"


def test_the_tpu7x_launch_timed_by_the_built_in_engine_says_it_is_not_the_trainers(tmp_path):
    knobs = RenderKnobs.from_strings({"engine": "builtin"})
    bench = load_manifest(render(tpu7x_trainer_launch(), "tpu7x", knobs))
    result = _pod_plan(bench, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "plan: engine: rl_trainer_bench.engine.builtin.jax_engine:JaxEngine (ENGINE)" in lines
    assert (
        "plan: not the trainer's program: the trainer runs MaxText (--trainer_backend=maxtext);"
        " this run times rl_trainer_bench.engine.builtin.jax_engine:JaxEngine, another program: its step"
        " time is not the trainer's (unset ENGINE to time MaxText's engine)"
    ) in lines
    # the recipe's cp-as-ep rule spreads experts over context x expert = 4 x 2 shards
    assert any("(experts over context x expert = 8 shards)" in line for line in lines)
    assert any("use_tokamax_splash=true" in line for line in lines if "kernels" in line)
    assert any(
        line.startswith("plan: differs: FLOPs: the built-in fwd_bwd executes") for line in lines
    )
    assert "plan: trainer MaxText keys: 42 (10 applied, 32 no equivalent)" in lines


def test_a_known_model_fixture_plans_its_preset_with_lengths_from_the_trainer(tmp_path):
    """The fixture's orchestrator states no lengths; the trainer's flags supply them."""
    bench = load_manifest(render(FIXTURE.read_text(), FIXTURE.name, RenderKnobs()))
    assert "max_prompt_length" not in exports(bench)["ORCH_ARGV"]
    result = _pod_plan(bench, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "plan: cell: qwen3-30b-a3b-cell mesh 8 x 1 x 1 (fsdp x context x expert),"
        " micro-batch 8 rows of 4,096 tokens, 4 micro-steps per step"
    ) in result.stdout.splitlines()
    assert "packing: from ORCH_ARGV" in result.stdout


def test_an_unknown_model_is_refused_at_render_time_naming_preset():
    with pytest.raises(UserError) as raised:
        render(UNKNOWN_MODEL.read_text(), UNKNOWN_MODEL.name, RenderKnobs())
    message = str(raised.value)
    assert (
        "--model_name=Mixtral-8x22B-Instruct is not a model the bench has a preset for" in message
    )
    assert "set PRESET" in message and "\n" not in message


def test_preset_overrides_the_model_mapping(tmp_path):
    knobs = RenderKnobs.from_strings({"driver_env": "PRESET=qwen3-30b-a3b-cell"})
    bench = load_manifest(render(UNKNOWN_MODEL.read_text(), UNKNOWN_MODEL.name, knobs))
    result = _pod_plan(bench, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "plan: preset: qwen3-30b-a3b-cell (chosen by PRESET)" in result.stdout.splitlines()


def test_a_trainer_command_naming_no_model_is_refused_naming_preset():
    text = FIXTURE.read_text().replace("--model_name=Qwen3-30B-A3B ", "")
    with pytest.raises(UserError, match=r"name no model .*set PRESET through DRIVER_ENV"):
        render(text, "f", RenderKnobs())


def test_the_render_summary_names_the_cell_the_pod_plans(capsys, tmp_path):
    from rl_trainer_bench import cli

    out = tmp_path / "bench.yaml"
    assert cli.main(["render", "--launch-render", str(FIXTURE), "--output", str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len([line for line in lines if line.startswith("render: WARNING:")]) == 1
    expected = [
        "render: the pod times qwen3-30b-a3b-cell mesh 8 x 1 x 1 (fsdp x context x expert),"
        " micro-batch 8 rows of 4,096 tokens, 4 micro-steps per step",
        "render: runtime: pathways (JAX_PLATFORMS=proxy,cpu: pathwaysutils.initialize() before any"
        " device work; proxy at the default address (JAX_BACKEND_TARGET unset))",
        "render: libtpu flags: main (client, LIBTPU_INIT_ARGS): --xla_a=1 --xla_b=true",
        "render: libtpu flags: pathways-proxy (proxy): none",
        "render: libtpu flags: pathways-worker (worker): none",
        *[line for line in lines if line.startswith("render: WARNING:")],
        "render: results: bench_results on the pod's disk, lost with the pod unless that is a"
        " mounted volume: set RESULTS_URI to a gs:// folder or a mounted volume; every step's"
        " line is in the log as it ends",
        "render: moe: ragged_buffer_factor=1.25 num_moe_token_chunks=1"
        " retry_when_tokens_dropped=true: P(replay)=1.00 per micro-batch (the built-in engine's"
        " buffer: capacity 320 slots per expert per group of 4,096 tokens): every micro-batch is expected to replay (each of the 4"
        " micro-steps runs fwd_bwd, then fwd_bwd_dropless), forecast by the shipped synthetic"
        " routing profile default.json",
        # 30.5 B parameters over 8 devices: float32 parameters and gradient sum, Adam's two moments
        "render: device memory: state on the device 56.87 GiB per device (parameters 14.22 GiB,"
        " gradient sum 14.22 GiB; optimizer state 28.44 GiB on the device) of 95.00 GiB per v5p"
        " device; the programs' temporaries are known once compiled: rl-trainer-bench aot"
        " --preset qwen3-30b-a3b-cell --target v5p:2x2x2 with this TRAINER_ARGV and ENGINE_FLAGS"
        " (the peak and the 5% margin)",
        # the trainer runs MaxText, but MaxText's engine has no route-replaying decoder for this
        # model: the built-in engine times it, and the summary says how its program differs
        "render: engine: rl_trainer_bench.engine.builtin.jax_engine:JaxEngine (the trainer runs MaxText"
        " (MAXTEXT_EXTRA_FLAGS in its command), but MaxText's engine cannot time this model here:"
        " a routed MoE of plain full-attention layers has no MaxText 0.2.5 decoder that replays"
        " routes (forced routing: qwen3_5, mixtral, gemma4): time a Qwen3.5-shaped preset"
        " (layer_types with linear_attention) or a dense one)",
        "render: loss: the built-in GRPO surrogate with its chunked log-prob pass (engine/builtin/loss.py)",
        "render: not the trainer's program: the trainer runs MaxText (MAXTEXT_EXTRA_FLAGS in its"
        " command); this run times rl_trainer_bench.engine.builtin.jax_engine:JaxEngine, another program:"
        " its step time is not the trainer's",
        "render: differs: kernels: the trainer's: MaxText's defaults for this model; this run's:"
        " XLA attention over query chunks, a capacity-padded einsum for the experts (a grouped"
        " matmul only in the replay)",
        "render: differs: MoE exchange: the trainer's: MaxText's defaults for this model; the"
        " built-in engine's: no expert axis: every device runs every expert on its own tokens",
        # capacity 320 of 4,096 x 8 / 128 = 256 routed pairs per expert (1.25x), over the real
        # tokens of the first micro-batch; attention: every key of a 4,096-token row scored
        "render: differs: FLOPs: the built-in fwd_bwd executes 1.66x the model FLOPs of the pool's"
        " first micro-batch, by shape arithmetic (experts 1.56x the routed work; attention 3.30x"
        " the causal work, every key scored)",
        # the fixture's MAXTEXT_EXTRA_FLAGS spells its keys as flags, which MaxText has no key for
        "render: trainer MaxText keys: 2 (2 no equivalent)",
        "render: trainer key --remat_policy=full: no equivalent (MaxText keys are written without"
        " '--': did you mean remat_policy=full?)",
        "render: trainer key --scan_layers=true: no equivalent (MaxText keys are written without"
        " '--': did you mean scan_layers=true?)",
    ]
    assert lines[1 : 1 + len(expected)] == expected
    # then where each value nobody set comes from, and the trainer's variables' fates
    # (tests/launch/test_render_accounting.py)
    assert lines[1 + len(expected)].startswith("render: value from the launcher: micro_steps=4 (")
    # then what the pod checks in its image before it starts, and the manifest's size
    assert lines[-3].startswith("render: trainer variable: MAXTEXT_EXTRA_FLAGS=")
    assert lines[-2] == (
        "render: checked in the pod: pathwaysutils (expected: pathwaysutils importable (the"
        " runtime line))"
    )
    assert lines[-1].startswith("render: manifest: ")


# ----------------------------------------------------------------------------------------------
# Every value the renderer accepts, the pod's driver accepts
# ----------------------------------------------------------------------------------------------

_SMALL = st.integers(-1, 20).map(str)
_TRAINER_ARGV = st.builds(
    lambda model, fsdp, context, rows, prompt, response: " ".join(
        f"--{flag}={value}"
        for flag, value in (
            ("model_name", model),
            ("mesh_fsdp", fsdp),
            ("mesh_context", context),
            ("train_micro_batch_size", rows),
            ("max_prompt_length", prompt),
            ("max_response_length", response),
        )
        if value is not None
    ),
    st.sampled_from(["Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", "qwen3.5-397b-a17b", "Other-7B"]),
    st.sampled_from(["8", "4", "2", "1", "0", "x", None]),
    st.sampled_from(["1", "2", "4", None]),
    st.sampled_from(["8", "16", "4", "0", None]),
    st.sampled_from(["64", "1024", "0", "٣", None]),
    st.sampled_from(["64", "3072", "1", None]),
)
_ENGINE_FLAGS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "mesh_fsdp",
                "mesh_context",
                "train_micro_batch_size",
                "beta",
                "remat_policy",
                "attention_chunk_size",
                "compute_logps_chunk_size",
                "dtype",
                "seed",
            ]
        ),
        st.sampled_from(["1", "2", "4", "8", "64", "0", "-1", "0.5", "none", "float32", "x"]),
    ),
    max_size=3,
).map(lambda pairs: " ".join(f"{k}={v}" for k, v in pairs))
_DRIVER_ENV = st.lists(
    st.sampled_from(
        [
            "WORKER=fused",
            "STAGE_BEFORE_UPDATE=on",
            "PRESET=cpu-tiny",
            "WARMUP_STEPS=3",
            "SEED=x",
            "STAGE_ISSUE=before_last",
            "DISTINCT_MICRO_BATCHES=2",
            "PLAN_ONLY=0",
            "WORKERS=fused",
        ]
    ),
    max_size=3,
    unique=True,
).map(" ".join)
_KNOBS = st.fixed_dictionaries(
    {},
    optional={
        "steps": _SMALL,
        "micro_steps": _SMALL,
        "profile_steps": st.builds(
            "{}{}{}".format, st.integers(0, 12), st.sampled_from([":", "-"]), st.integers(0, 12)
        ),
        "trainer_argv": _TRAINER_ARGV,
        "orch_argv": st.sampled_from(
            [
                "--num_generations=4",
                "--num_generations=0",
                "--max_prompt_length=16",
                "--max_prompt_length=16 --max_response_length=16",
                "--pad_rows=9",
            ]
        ),
        "engine_flags": _ENGINE_FLAGS,
        "driver_env": _DRIVER_ENV,
        "trainer_slice": st.sampled_from(["v5p:2x2x2", "v5e:2x4", "v5p:2x2x1", "tpu7x:2x2x2"]),
    },
)
FIXTURE_TEXT = FIXTURE.read_text()


@settings(
    max_examples=int(os.environ.get("RENDER_PLAN_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(knobs=_KNOBS)
@example(knobs={})
@example(knobs={"steps": "3", "profile_steps": "1-3", "engine_flags": "beta=0.5 remat_policy=none"})
@example(knobs={"orch_argv": "--num_generations=4", "trainer_slice": "v5e:2x4"})
@example(knobs={"trainer_argv": "--model_name=Qwen3-30B-A3B --mesh_fsdp=8 --max_prompt_length=64"})
def test_every_render_the_renderer_accepts_is_a_pod_whose_driver_accepts_its_knobs(knobs, capsys):
    try:
        bench = load_manifest(render(FIXTURE_TEXT, "fuzz.yaml", RenderKnobs.from_strings(knobs)))
    except UserError as error:
        assert "\n" not in str(error)
        event("refused at render time")
        return
    event("rendered")
    environment = {**exports(bench), "PLAN_ONLY": "1"}
    assert entry.main([], environment) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[-1].startswith("plan: ok")
