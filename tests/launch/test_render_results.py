"""The render points RESULTS_URI under the trainer's durable output folder (a gs:// flag, a
persistent volume), or leaves the results on the pod's disk and says so."""

from __future__ import annotations

from reference_data import launch_render
from render_helpers import FIXTURE

from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan


def _rendered(text: str, **knobs: str):
    return render_with_plan(text, "launch.yaml", RenderKnobs.from_strings(knobs))


def _uri(text: str, **knobs: str) -> str | None:
    return _rendered(text, **knobs).plan.config.results_uri


def test_the_real_launchers_output_directory_holds_the_results():
    rendered = _rendered(launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt").read_text())
    assert rendered.plan.config.results_uri == (
        "gs://atwigg-trellis-europe-west4-dev/maxtext/benchuser/rl-trainer-bench/"
        "benchuser-train-bench"
    )
    assert rendered.results_source == "the trainer's --maxtext_output_directory"


def test_an_empty_dir_is_not_durable_and_the_plan_says_the_results_die_with_the_pod():
    text = FIXTURE.read_text().replace(
        "--mesh_fsdp=8 ", "--mesh_fsdp=8 --maxtext_output_directory=/scratch/out "
    )
    rendered = _rendered(text)
    assert rendered.plan.config.results_uri is None
    assert "lost with the pod" in rendered.plan.results_line()


def test_a_persistent_volume_mounted_in_the_client_holds_the_results():
    text = FIXTURE.read_text().replace(
        "            - name: scratch\n              emptyDir: {}\n",
        "            - name: scratch\n              persistentVolumeClaim:\n"
        "                claimName: runs\n",
    )
    assert _uri(text) == "/scratch/rl-trainer-bench/fixture-train-bench"


def test_the_knob_wins():
    assert _uri(FIXTURE.read_text(), results_uri="gs://mine/b") == "gs://mine/b"
