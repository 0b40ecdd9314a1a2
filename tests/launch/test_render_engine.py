"""The render's ENGINE knob: the pod times the named engine, and the render says what its image needs."""

from __future__ import annotations

import pytest
from reference_data import launch_render
from render_helpers import FIXTURE, exports, load_manifest, render_fixture

from rl_trainer_bench import code_digest
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch import render
from rl_trainer_bench.launch.knobs import RenderKnobs

STAND_IN = "stand_in_engine:ConfiguredStandInEngine"


def test_render_puts_the_engine_in_the_pod_and_says_what_the_image_needs():
    assert exports(render_fixture(engine=STAND_IN))["ENGINE"] == STAND_IN
    assert "ENGINE" not in exports(render_fixture())
    assert "the trainer's image must have stand_in_engine" in render.engine_requirement(STAND_IN)


def test_render_refuses_a_malformed_engine_and_engine_in_driver_env():
    with pytest.raises(UserError, match="ENGINE='maxtxt' is not module:Class"):
        RenderKnobs.from_strings({"engine": "maxtxt"})
    with pytest.raises(UserError, match="DRIVER_ENV sets ENGINE"):
        RenderKnobs.from_strings({"driver_env": f"ENGINE={STAND_IN}"})


# The fixture's trainer on Qwen3.5, a model MaxText's engine times, in each way a launcher says
# (or does not say) that its trainer runs MaxText.
_EXTRA = 'MAXTEXT_EXTRA_FLAGS="--remat_policy=full --scan_layers=true" '
_QWEN35 = ("--model_name=Qwen3-30B-A3B", "--model_name=Qwen3.5-397B-A17B")


def _qwen35_fixture(backend_flag: bool, extra_flags: bool) -> str:
    text = FIXTURE.read_text().replace(*_QWEN35)
    if not extra_flags:
        text = text.replace(_EXTRA, "")
    if backend_flag:
        text = text.replace(
            "--worker_id=fixture-train", "--worker_id=fixture-train --trainer_backend=maxtext"
        )
    return text


@pytest.mark.parametrize(
    ("backend_flag", "extra_flags", "engine", "because"),
    [
        (True, False, MAXTEXT, "the trainer runs MaxText (--trainer_backend=maxtext)"),
        (False, True, MAXTEXT, "the trainer runs MaxText (MAXTEXT_EXTRA_FLAGS in its command)"),
        (True, True, MAXTEXT, "the trainer runs MaxText (--trainer_backend=maxtext)"),
        (False, False, BUILT_IN, "the trainer's command does not run MaxText"),
    ],
)
def test_the_pod_times_the_trainers_engine_and_embeds_its_code(
    backend_flag, extra_flags, engine, because
):
    rendered = render.render_with_plan(
        _qwen35_fixture(backend_flag, extra_flags), "fixture", RenderKnobs()
    )
    text, pod_plan = rendered.yaml, rendered.plan
    facts = dict(pod_plan.engine_facts)
    assert pod_plan.config.engine == engine and facts["engine"].startswith(f"{engine} ({because}")
    assert ("maxtext config" in facts) == (engine == MAXTEXT)
    bench = load_manifest(text)
    assert "ENGINE" not in exports(bench)  # the pod resolves the same engine from the same argv
    # the embedded code is the chosen engine's closure: the adapter travels only with MaxText
    sha = bench["metadata"]["annotations"]["rl-trainer-bench/code-sha256"]
    assert sha == code_digest.code_sha256(engine=engine)
    adapter = code_digest.default_root() / "rl_trainer_bench/engine/maxtext/adapter.py"
    assert (adapter in code_digest.code_files(engine=engine)) == (engine == MAXTEXT)


def test_engine_builtin_overrides_a_maxtext_trainer_and_the_summary_says_what_differs(capsys):
    text = _qwen35_fixture(backend_flag=True, extra_flags=False)
    pod_plan = render.render_with_plan(
        text, "fixture", RenderKnobs.from_strings({"engine": "builtin"})
    ).plan
    facts = dict(pod_plan.engine_facts)
    assert facts["engine"] == f"{BUILT_IN} (ENGINE)"
    assert facts["not the trainer's program"].startswith(
        "the trainer runs MaxText (--trainer_backend=maxtext)"
    )
    assert {"differs: kernels", "differs: MoE exchange", "differs: FLOPs"} <= set(facts)
    assert "maxtext config" not in facts


def test_rendering_and_planning_either_engine_import_no_jax():
    launch_render(
        "tunix-mlperf-397b-256-v5p-trainer.stdout.txt"
    )  # skips where the reference is absent
    child = """
import sys
from render_helpers import tpu7x_trainer_launch
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan
for engine in ({}, {"engine": "builtin"}):
    render_with_plan(tpu7x_trainer_launch(), "tpu7x", RenderKnobs.from_strings(engine))
print("jax imported:", "jax" in sys.modules)
"""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, "-c", child],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([str(here), *sys.path])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "jax imported: False"


@pytest.mark.parametrize(
    ("flags", "kernels"),
    [
        (
            {},
            "XLA attention over query chunks, the chunked Gated DeltaNet in XLA, a capacity-padded"
            " einsum for the experts (a grouped matmul only in the replay)",
        ),
        (
            {"engine_flags": "expert_compute=sorted_gmm attention=splash mesh_context=1"},
            "Pallas' splash attention kernel, the chunked Gated DeltaNet in XLA, the routed pairs"
            " sorted by expert through gmm, drops as in E x C buffers",
        ),
        (
            {"engine_flags": "linear_chunk_inverse=pallas"},
            "XLA attention over query chunks, the chunked Gated DeltaNet in XLA with its triangular"
            " inverses in a Pallas kernel, a capacity-padded einsum for the experts (a grouped"
            " matmul only in the replay)",
        ),
        (
            {
                "engine_flags": "linear_chunk_inverse=pallas linear_chunk_kernel=pallas mesh_context=1"
            },
            "XLA attention over query chunks, the chunked Gated DeltaNet in Pallas kernels, forward"
            " and backward, a capacity-padded einsum for the experts (a grouped matmul only in the"
            " replay)",
        ),
        (
            {"engine_flags": "linear_conv_kernel=pallas mesh_context=1"},
            "XLA attention over query chunks, the chunked Gated DeltaNet in XLA, its short"
            " convolutions in a Pallas kernel, forward and backward, a capacity-padded einsum for"
            " the experts (a grouped matmul only in the replay)",
        ),
    ],
)
def test_the_kernels_line_names_the_built_in_kernels(flags, kernels):
    text = _qwen35_fixture(backend_flag=True, extra_flags=False)
    knobs = RenderKnobs.from_strings({"engine": "builtin", **flags})
    facts = dict(render.render_with_plan(text, "fixture", knobs).plan.engine_facts)
    assert facts["differs: kernels"].endswith(f"this run's: {kernels}")


def test_the_kernels_line_knows_every_attention_choice():
    from rl_trainer_bench.bench.engine_plan import ATTENTION_KERNELS
    from rl_trainer_bench.engine.config import AttentionImpl, choices

    assert set(ATTENTION_KERNELS) == set(choices(AttentionImpl))


def test_the_kernels_line_knows_every_linear_chunk_inverse():
    from rl_trainer_bench.bench.engine_plan import GATED_DELTANET_KERNELS
    from rl_trainer_bench.engine.config import LinearChunkInverse, choices

    assert set(GATED_DELTANET_KERNELS) == set(choices(LinearChunkInverse))
