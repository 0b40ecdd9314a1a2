"""The render points RESULTS_URI under the trainer's durable output folder (a gs:// flag, a
persistent volume), or leaves the results on the pod's disk and says so."""

from __future__ import annotations

import pytest
from reference_data import launch_render
from render_helpers import FIXTURE

from rl_trainer_bench import cli
from rl_trainer_bench.errors import UserError
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


_PVC = (
    "            - name: scratch\n              persistentVolumeClaim:\n"
    "                claimName: runs\n"
)
_EMPTY_DIR = "            - name: scratch\n              emptyDir: {}\n"


@pytest.mark.parametrize("uri", ["/results/x", "/scratch/x", "/scratchy/x", "relative/x"])
def test_a_local_results_uri_no_durable_volume_holds_is_refused(uri, capsys, tmp_path):
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(FIXTURE), "--output", str(out), "--results-uri", uri]
    assert cli.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert not out.exists()
    assert line.endswith(
        f"RESULTS_URI={uri}: no durable volume of the client container main is mounted there (it"
        " mounts no durable volume; durable: persistentVolumeClaim, csi, nfs, gcePersistentDisk),"
        " so the results would go with the pod: set RESULTS_URI to a gs:// folder or a path on a"
        " durable mount"
    )


def test_a_local_results_uri_on_a_durable_mount_is_kept_and_others_name_the_mounts():
    text = FIXTURE.read_text().replace(_EMPTY_DIR, _PVC)
    assert _uri(text, results_uri="/scratch/runs/x") == "/scratch/runs/x"
    with pytest.raises(UserError, match=r"its durable mounts are /scratch \(volume scratch\)"):
        _uri(text, results_uri="/results/x")


def test_the_summary_says_what_a_preemption_keeps(capsys, tmp_path):
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(FIXTURE), "--output", str(out)]
    assert cli.main([*argv, "--results-uri", "gs://b/runs"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "render: results:" in line]
    assert (
        "each file copied to gs://b/runs/<UTC time>/ by a separate process within 5 s" in lines[0]
    )
    assert lines[1] == (
        "render: results: on preemption, each step that ended is copied within 5 s of ending,"
        " also during the grace period; the pod's grace period is 30 s (Kubernetes' default: the"
        " trainer's pod sets none): SIGTERM stops the run at the end of the step in flight, which"
        " is kept only if that step and the final copy end within it"
    )
    real = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    assert cli.main(["render", "--launch-render", str(real), "--output", str(out)]) == 0
    said = capsys.readouterr().err
    assert "the pod's grace period is 360 s (the trainer's)" in said
