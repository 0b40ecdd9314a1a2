"""render --aot-job: a JobSet that compiles the trainer's programs in the trainer's image on a CPU
node, validated as the bench is, and its pod's script run here: its plan-only mode, its refusals,
its run and the copy of its reports."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from render_helpers import FIXTURE, exports, load_manifest, tpu7x_trainer_launch

from rl_trainer_bench import cli
from rl_trainer_bench.ab import render_command
from rl_trainer_bench.launch.apply_size import stored_annotation_bytes
from rl_trainer_bench.launch.client_command import read_client_command
from rl_trainer_bench.launch.validate import jobset_problems
from rl_trainer_bench.preflight import aot_job_pod

ARMS = "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"
MAXTEXT_ARMS = "full:maxtext.remat_policy=full,minimal:maxtext.remat_policy=minimal"
RECIPE_RESULTS = "gs://atwigg-trellis-europe-west4-dev/maxtext/benchuser/rl-trainer-bench"


def _render(tmp_path: Path, launch: Path = FIXTURE, *flags: str) -> tuple[int, dict]:
    """`rl-trainer-bench render ... --aot-job`: its exit code and the AOT JobSet ({}: none)."""
    aot = tmp_path / "aot.yaml"
    code = cli.main(
        [
            "render",
            f"--launch-render={launch}",
            f"--output={tmp_path / 'bench.yaml'}",
            f"--aot-job={aot}",
            *flags,
        ]
    )
    return code, (load_manifest(aot.read_text()) if aot.exists() else {})


def _pod(job: dict) -> dict:
    (replicated,) = job["spec"]["replicatedJobs"]
    return replicated["template"]["spec"]["template"]["spec"]


def _container(job: dict) -> dict:
    (container,) = _pod(job)["containers"]
    return container


def _exports(job: dict) -> dict[str, str]:
    return read_client_command(_container(job)["command"][2]).env


def _installed(site: Path, name: str, version: str) -> None:
    """An installed distribution in `site`, as pip lays one out: the package and its metadata."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")


def _run_script(job: dict, tmp_path: Path, site: Path | None, **env: str):
    """The job's client command as the pod runs it, `python` being this interpreter; none of
    this process's PYTHONPATH, nor the TPU_LIBRARY_PATH that the libtpu package sets on import
    (JAX's TPU start-up imports it where it is installed, in an earlier test of this process),
    which would name the host's libtpu rather than the image's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    interpreter = bin_dir / "python"
    interpreter.write_text(f'#!/bin/bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    interpreter.chmod(0o755)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_LIBRARY_PATH")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),  # the script's code folder goes with the test's
        **({"PYTHONPATH": str(site)} if site else {}),
        **env,
    }
    return subprocess.run(
        _container(job)["command"],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("[AotJob]")]


def _tpu7x_launch(tmp_path: Path) -> Path:
    path = tmp_path / "tpu7x-launch.txt"
    path.write_text(tpu7x_trainer_launch())
    return path


# ----------------------------------------------------------------------------------------------
# The JobSet
# ----------------------------------------------------------------------------------------------


def test_the_job_runs_in_the_trainers_image_on_a_cpu_node(tmp_path):
    code, job = _render(tmp_path)
    assert code == 0
    assert jobset_problems(job) == []
    assert job["metadata"]["name"] == "fixture-train-aot"
    assert job["metadata"]["annotations"]["rl-trainer-bench/slice"] == "v5p:2x2x2"
    pod, container = _pod(job), _container(job)
    assert container["image"] == "example.com/trainer:1"
    assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("bench-sa", "high")
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "n2-standard-16"}
    assert not {"tolerations", "affinity", "hostNetwork"} & set(pod)
    assert "google.com/tpu" not in yaml.safe_dump(job)
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "24Gi"},
        "limits": {"memory": "48Gi"},
    }
    assert [e["value"] for e in container["env"] if e["name"] == "JAX_PLATFORMS"] == ["cpu"]
    assert pod["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    assert container["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]
    exports = _exports(job)
    assert exports["TRAINER_SLICE"] == "v5p:2x2x2"
    assert exports["LIBTPU_INIT_ARGS"] == "--xla_a=1 --xla_b=true"
    assert "--model_name=Qwen3-30B-A3B" in exports["TRAINER_ARGV"]
    assert "AB_ARMS" not in exports and "AOT_AB" not in exports
    assert "exec python -m rl_trainer_bench.preflight.aot_job_pod" in container["command"][2]


def test_the_trainers_pull_secrets_travel_with_its_image_and_no_image_is_refused(tmp_path, capsys):
    text = FIXTURE.read_text()
    launch = tmp_path / "launch.yaml"
    pulled = "            serviceAccountName: bench-sa\n            imagePullSecrets:\n"
    launch.write_text(
        text.replace(
            "            serviceAccountName: bench-sa\n", pulled + "            - name: regcred\n"
        )
    )
    _, job = _render(tmp_path, launch)
    assert _pod(job)["imagePullSecrets"] == [{"name": "regcred"}]
    launch.write_text(
        text.replace(
            "              image: example.com/trainer:1\n              resources:",
            "              resources:",
            1,
        )
    )
    (tmp_path / "aot.yaml").unlink()
    code, job = _render(tmp_path, launch)
    assert (code, job) == (2, {})
    assert "names no image, and the AOT job runs in the trainer's image" in capsys.readouterr().err


def test_the_node_selector_knob_names_the_cpu_pool(tmp_path):
    flag = "--aot-node-selector=cloud.google.com/gke-nodepool=cpu-pool"
    _, job = _render(tmp_path, FIXTURE, flag)
    assert _pod(job)["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-pool"}


def test_a_bad_node_selector_is_one_line_and_no_file(tmp_path, capsys):
    for selector, named in [
        ("pool=cpu pool", "'pool'"),
        ("cloud.google.com/gke-nodepool=cpu!", "'cpu!'"),
    ]:
        code, job = _render(tmp_path, FIXTURE, f"--aot-node-selector={selector}")
        assert (code, job) == (2, {})
        assert not (tmp_path / "bench.yaml").exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "AOT_NODE_SELECTOR" in err[0] and named in err[0], err


def test_the_aot_job_and_the_bench_are_never_one_file(tmp_path, capsys):
    same = tmp_path / "x.yaml"
    code = cli.main(
        ["render", f"--launch-render={FIXTURE}", f"--output={same}", f"--aot-job={same}"]
    )
    assert code == 2 and not same.exists()
    assert "AOT_JOB=" in capsys.readouterr().err


def test_the_tpu7x_launchers_job_compiles_its_slice_with_its_keys_and_flags(tmp_path, capsys):
    code, job = _render(tmp_path, _tpu7x_launch(tmp_path))
    assert code == 0
    assert jobset_problems(job) == []
    assert stored_annotation_bytes(job) < 262_144  # what kubectl apply can store
    assert _container(job)["image"] == "gcr.io/cloud-tpu-multipod-dev/atwigg/trellis:latest"
    exports = _exports(job)
    assert exports["TRAINER_SLICE"] == "tpu7x:4x4x8"
    assert "--xla_tpu_scoped_vmem_limit_kib=65536" in exports["LIBTPU_INIT_ARGS"]
    assert "use_gdn_kernel=true gdn_cp_mode=head" in exports["TRAINER_ARGV"]
    assert exports["RESULTS_URI"] == f"{RECIPE_RESULTS}/benchuser-train-aot"
    # The launcher's 400 GiB ephemeral scratch disk: the path stays, the per-pod disk does not.
    assert _pod(job)["volumes"] == [{"name": "scratch-disk", "emptyDir": {}}]
    err = capsys.readouterr().err
    assert "render: aot job: JobSet benchuser-train-aot: aot and hlo-overlap for tpu7x:4x4x8" in err
    assert "named by a tag" in err


# ----------------------------------------------------------------------------------------------
# The pod's script, run here
# ----------------------------------------------------------------------------------------------


def test_plan_only_names_the_images_maxtext_and_libtpu_and_every_command(tmp_path):
    _, job = _render(tmp_path, _tpu7x_launch(tmp_path))
    site = tmp_path / "site"
    _installed(site, "maxtext", "9.1.2")
    _installed(site, "libtpu", "0.0.77")
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 0, result.stderr
    lines = _lines(result)
    assert f"[AotJob] compiles with maxtext 9.1.2 at {site / 'maxtext'}" in lines
    assert f"[AotJob] compiles with libtpu 0.0.77 at {site / 'libtpu'}" in lines
    runs = [line for line in lines if line.startswith("[AotJob] run trainer: ")]
    assert [line.split()[3] for line in runs] == ["aot", "hlo-overlap"]
    for line in runs:
        assert '--preset="qwen3.5-397b-cell" --target="tpu7x:4x4x8"' in line
        assert "use_gdn_kernel=true" in line
    assert lines[-1] == "[AotJob] plan only: nothing compiled"
    assert not (tmp_path / "aot_results").exists()


def test_an_image_without_maxtext_is_refused_in_one_line(tmp_path):
    _, job = _render(tmp_path, _tpu7x_launch(tmp_path))
    site = tmp_path / "site"
    _installed(site, "libtpu", "0.0.77")
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 2
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("aot job: maxtext is not importable in this image (python ")
    assert not any("run trainer" in line for line in _lines(result))


def test_an_image_without_libtpu_is_refused_after_naming_its_maxtext(tmp_path):
    _, job = _render(tmp_path, _tpu7x_launch(tmp_path))
    if importlib.util.find_spec("libtpu") is not None:
        pytest.skip("this interpreter has libtpu; the refusal needs an image without it")
    site = tmp_path / "site"
    _installed(site, "maxtext", "9.1.2")
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 2
    assert f"[AotJob] compiles with maxtext 9.1.2 at {site / 'maxtext'}" in _lines(result)
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("aot job: libtpu is not importable in this image")


def test_the_built_in_engine_needs_no_maxtext(tmp_path):
    _, job = _render(tmp_path)
    site = tmp_path / "site"
    _installed(site, "libtpu", "0.0.77")
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 0, result.stderr
    assert not any("maxtext" in line for line in _lines(result) if "compiles with" in line)


def _runs(result) -> list[tuple[str, str]]:
    """(run, command) of each command the job's plan names, in its order."""
    return [
        (line.split()[2].rstrip(":"), line.split()[3])
        for line in _lines(result)
        if line.startswith("[AotJob] run ")
    ]


def test_a_same_pod_ab_is_compiled_as_it_runs(tmp_path):
    """Two arms of a MaxText key: one `aot --ab-arms` over the pod's knobs (its verdict is the
    A/B's: one state beside each program set), and hlo-overlap once per program set, each with
    the arm's key over the pod's ENGINE_FLAGS; not an `aot` per setting."""
    _, job = _render(tmp_path, _tpu7x_launch(tmp_path), f"--ab-arms={MAXTEXT_ARMS}")
    site = tmp_path / "site"
    _installed(site, "maxtext", "9.1.2")
    _installed(site, "libtpu", "0.0.77")
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 0, result.stderr
    assert _runs(result) == [
        ("ab-arms", "aot"),
        ("full", "hlo-overlap"),
        ("minimal", "hlo-overlap"),
    ]
    aot, full, minimal = [line for line in _lines(result) if line.startswith("[AotJob] run ")]
    assert f'--ab-arms="{MAXTEXT_ARMS}"' in aot
    assert '--preset="qwen3.5-397b-cell" --target="tpu7x:4x4x8"' in aot
    assert "use_gdn_kernel=true" in aot and "--engine-flags" not in aot
    assert aot.endswith('--output="aot_results/aot-ab-arms.json"')
    assert '--engine-flags="maxtext.remat_policy=full"' in full
    assert '--engine-flags="maxtext.remat_policy=minimal"' in minimal
    assert "use_gdn_kernel=true" in minimal


def test_settings_that_compile_alike_share_a_program_set(tmp_path):
    """off and after differ in STAGE_AFTER_UPDATE alone: one program set; on stages the
    micro-batch, which `aot` counts and hlo-overlap's programs do not change: its own set in the
    `aot --ab-arms`, the same hlo-overlap."""
    site = tmp_path / "site"
    _installed(site, "libtpu", "0.0.77")
    _, job = _render(tmp_path, FIXTURE, "--ab-arms=off,on,after")
    table = json.loads(_exports(job)["AOT_AB"])
    assert [item["settings"] for item in table["program_sets"]] == [["off", "after"], ["on"]]
    assert table["program_sets"][1]["knobs"] == {"STAGE_BEFORE_UPDATE": "on"}
    result = _run_script(job, tmp_path, site, PLAN_ONLY="1")
    assert result.returncode == 0, result.stderr
    assert _runs(result) == [("ab-arms", "aot"), ("off+after+on", "hlo-overlap")]


def test_the_render_plans_the_ab_once_and_the_job_compiles_its_printed_arms(
    tmp_path, capsys, monkeypatch
):
    calls, planner = [], render_command.plan_for_render

    def counted(env, pod):
        calls.append(env["AB_ARMS"])
        return planner(env, pod)

    monkeypatch.setattr(render_command, "plan_for_render", counted)
    code, job = _render(tmp_path, _tpu7x_launch(tmp_path), f"--ab-arms={MAXTEXT_ARMS}")
    assert code == 0
    assert calls == [MAXTEXT_ARMS]
    err = capsys.readouterr().err
    printed = [
        line.split()[3].rstrip(":")
        for line in err.splitlines()
        if line.startswith("render: A/B arm ")
    ]
    assert (
        "render: aot job: compiles the same-pod A/B as it runs: one `aot --ab-arms` (one state for"
        " every arm, each program set compiled beside it: full; minimal)"
    ) in err
    table = json.loads(_exports(job)["AOT_AB"])
    compiled = [name for item in table["program_sets"] for name in item["settings"]]
    assert printed == compiled == ["full", "minimal"]
    bench = load_manifest((tmp_path / "bench.yaml").read_text())
    assert table["arms"] == exports(bench)["AB_ARMS"]


def test_an_aot_ab_arms_child_compiles_only_the_rendered_program_sets(capsys):
    """The pod's `aot --ab-arms` takes AOT_AB's program sets, found by the A/B's own code for
    these arms over these ENGINE_FLAGS: without it, or for other arms, one line, exit 2."""
    argv = ["aot", "--preset=cpu-tiny", "--target=v5p:2x2x2", "--ab-arms=off,on"]
    table = {
        "arms": "off,after",
        "engine_flags": "",
        "program_sets": [{"settings": ["off", "after"], "knobs": {}}],
    }
    for env, named in [
        ({}, "AOT_AB), and this pod has none"),
        ({"AOT_AB": json.dumps(table)}, "found for --ab-arms='off,after'"),
        ({"AOT_AB": "[]"}, "AOT_AB: expected a JSON object"),
    ]:
        assert aot_job_pod.main(argv, env) == 2
        (error,) = capsys.readouterr().err.strip().splitlines()
        assert named in error, error


def test_a_job_whose_code_was_edited_is_refused(tmp_path):
    _, job = _render(tmp_path)
    command = _container(job)["command"]
    command[2] = command[2].replace("export BENCH_CODE_SHA256=", "export BENCH_CODE_SHA256=0")
    result = _run_script(job, tmp_path, None, PLAN_ONLY="1")
    assert result.returncode == 2
    assert "the manifest was edited after rendering" in result.stderr


def _run_job_copying_its_reports(tmp_path: Path, *flags: str):
    """The fixture's job (rendered with `flags`) run here with a stand-in libtpu and RESULTS_URI
    a local folder (the fixture's trainer has no durable output: the pod is told one): its result
    and the one folder its reports were copied to."""
    destination = tmp_path / "results"
    destination.mkdir()
    _, job = _render(tmp_path, FIXTURE, *flags)
    site = tmp_path / "site"
    _installed(site, "libtpu", "0.0.77")
    result = _run_script(job, tmp_path, site, RESULTS_URI=str(destination))
    (copied,) = destination.iterdir()
    return result, copied


def test_the_job_runs_every_command_and_copies_its_reports(tmp_path):
    """Without a real libtpu here no TPU topology can be built: each compile fails with its one
    line, the job still runs every command, writes each report and its summary, copies them to
    RESULTS_URI and exits with the commands' worst status."""
    result, copied = _run_job_copying_its_reports(tmp_path)
    assert result.returncode == 2, result.stderr
    assert "cannot build the TPU topology on this host" in result.stderr
    files = sorted(path.name for path in copied.iterdir())
    assert files == [
        "aot-job.txt",
        "aot-trainer.txt",
        "hlo-overlap-trainer.txt",
    ]
    summary = (copied / "aot-job.txt").read_text().splitlines()
    assert summary[0].startswith("jax ")
    assert [line.rsplit(": ", 1)[1] for line in summary[-2:]] == ["exit 2", "exit 2"]
    assert "[AotJob] run trainer: hlo-overlap exit 2" in result.stdout


def test_the_ab_job_runs_one_aot_of_the_rendered_program_sets(tmp_path):
    """The A/B's job, run: its one `aot` child checks the A/B with the program sets the render
    planned (it names the first set's arm in its refusal: no TPU topology here), then one
    hlo-overlap per set; a report for each and the summary, copied to RESULTS_URI."""
    result, copied = _run_job_copying_its_reports(tmp_path, f"--ab-arms={ARMS}")
    assert result.returncode == 2, result.stderr
    assert "rl-trainer-bench aot: --ab-arms: arm(s) base: --target v5p:2x2x2: " in result.stderr
    assert sorted(path.name for path in copied.iterdir()) == [
        "aot-ab-arms.txt",
        "aot-job.txt",
        "hlo-overlap-base.txt",
        "hlo-overlap-wide.txt",
    ]
    summary = (copied / "aot-job.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary[-3:]] == [
        "run ab-arms",
        "run base",
        "run wide",
    ]


def test_plan_runs_the_jobs_own_plan_only_mode(tmp_path, capfd):
    _render(tmp_path)
    code = cli.main(["plan", str(tmp_path / "aot.yaml")])
    out = capfd.readouterr().out
    assert "plan: JobSet fixture-train-aot from" in out
    assert "[AotJob] compiles with jax " in out
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    assert code == (0 if has_libtpu else 2)


def test_rendering_and_validating_the_job_import_no_jax(tmp_path):
    from test_cli_without_jax import _without_jax

    aot = tmp_path / "aot.yaml"
    results, stderr = _without_jax(
        [
            "render",
            f"--launch-render={FIXTURE}",
            f"--output={tmp_path / 'b.yaml'}",
            f"--aot-job={aot}",
        ],
        ["validate", str(aot)],
    )
    assert results == [[0, False]] * 2, stderr
