"""`rl-trainer-bench plan BENCH.yaml`: the rendered pod's own plan, from its embedded code."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from reference_data import launch_render
from render_helpers import FIXTURE, exports, load_manifest

from rl_trainer_bench import cli
from rl_trainer_bench.launch.dry_run import client_container, literal_env
from rl_trainer_bench.launch.render import CODE_SHA_ANNOTATION, PLAN_SHA_ANNOTATION


def _rendered(tmp_path, *knobs: str):
    bench = tmp_path / "bench.yaml"
    assert cli.main(["render", f"--launch-render={FIXTURE}", f"--output={bench}", *knobs]) == 0
    return bench


def test_plan_prints_the_pods_plan_from_its_code_and_environment(tmp_path, capfd):
    bench = _rendered(tmp_path, "--steps=7", "--driver-env=STAGE_BEFORE_UPDATE=on")
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0].startswith(f"plan: JobSet fixture-train-bench from {bench}: the plan resolved")
    # the fixture's trainer: its model's preset on its 8-chip v5p slice, the knobs as rendered
    assert (
        "plan: cell: qwen3-30b-a3b-cell mesh 8 x 1 x 1 (fsdp x context x expert), micro-batch 8"
        " rows of 4,096 tokens, 4 micro-steps per step"
    ) in lines
    assert "plan: mesh: 8 x 1 x 1 = 8 devices on v5p:2x2x2 (8 chips)" in lines
    assert any(
        line.startswith("plan: step: micro_steps=4 steps=7 warmup_steps=1") for line in lines
    )
    assert any("stage=before_update" in line for line in lines)
    assert lines[-1] == "plan: ok: every knob is valid; nothing ran on a device"


@pytest.mark.parametrize(
    ("annotation", "said"),
    [
        (CODE_SHA_ANNOTATION, "embedded code has sha256"),
        (PLAN_SHA_ANNOTATION, "embedded plan has sha256"),
    ],
)
def test_an_edited_manifest_is_refused_naming_the_annotation(tmp_path, capfd, annotation, said):
    """The embedded code and the embedded plan are each checked against their annotation."""
    bench = _rendered(tmp_path)
    text = bench.read_text()
    sha = text.split(f"{annotation}: ", 1)[1].split()[0]
    bench.write_text(text.replace(sha, "a" * 64))
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and said in err and "the manifest was edited after rendering" in err


def test_a_file_without_a_bench_jobset_is_refused(capfd):
    assert cli.main(["plan", str(FIXTURE)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "holds no bench JobSet" in err


def test_a_maxtext_trainers_pod_plans_from_the_code_and_environment_it_resolves(tmp_path, capfd):
    """The pod chooses MaxText's engine itself (no ENGINE exported) and takes JAX_PLATFORMS from
    its container's own env: the digest is of that engine's code, the runtime is Pathways."""
    launch = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    bench = tmp_path / "bench.yaml"
    assert cli.main(["render", f"--launch-render={launch}", f"--output={bench}"]) == 0
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert (
        "plan: engine: rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine (the trainer runs"
        " MaxText (--trainer_backend=maxtext): its own program)"
    ) in lines
    assert any(
        line.startswith("plan: runtime: pathways (JAX_PLATFORMS=proxy,cpu") for line in lines
    )


def test_an_empty_file_is_refused_asking_for_a_rendered_jobset(tmp_path, capfd):
    empty = tmp_path / "bench.yaml"
    empty.write_text("")
    assert cli.main(["plan", str(empty)]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert line.endswith(
        "is empty: pass a JobSet rendered by `rl-trainer-bench render` (a YAML stream)"
    )


def _python_on_path(folder) -> dict[str, str]:
    """A `python` and `python3` on PATH that are this interpreter, as the trainer's image has."""
    for name in ("python", "python3"):
        interpreter = folder / name
        interpreter.write_text(f'#!/bin/bash\nexec {shlex.quote(sys.executable)} "$@"\n')
        interpreter.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def _pod_plan(bench_file, folder, **env: str) -> subprocess.CompletedProcess:
    """The rendered pod's client command run here in plan-only mode, as the pod runs it: with
    its container's own `env` (JAX_PLATFORMS, ...) and a trainer's image's `python` on PATH."""
    container = client_container(load_manifest(bench_file.read_text()))
    return subprocess.run(
        container["command"],
        # the script unpacks its code into `mktemp -d`: under the test's folder, not the suite's
        env={
            **_python_on_path(folder),
            **literal_env(container),
            "PLAN_ONLY": "1",
            "TMPDIR": str(folder),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_printed_plan_is_the_plan_the_pod_executes(tmp_path, capfd):
    """`plan BENCH.yaml` prints the plan embedded at render time; the pod, running its own script,
    resolves its plan again, finds it equal to the embedded one and prints the same lines."""
    bench = _rendered(tmp_path, "--steps=7", "--driver-env=STAGE_BEFORE_UPDATE=on")
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 0
    printed = [line for line in capfd.readouterr().out.splitlines()[1:]]
    assert printed[-1] == "plan: ok: every knob is valid; nothing ran on a device"
    checked = "plan: checked in the pod: pathwaysutils"
    assert f"{checked} (expected: pathwaysutils importable (the runtime line))" in printed
    stubs = tmp_path / "bin"
    stubs.mkdir()
    image = tmp_path / "image"  # the trainer's image has pathwaysutils (its JAX_PLATFORMS=proxy)
    (image / "pathwaysutils").mkdir(parents=True)
    (image / "pathwaysutils" / "__init__.py").write_text("")
    pod = _pod_plan(bench, stubs, PYTHONPATH=str(image))
    assert pod.returncode == 0, pod.stderr
    pods = [line for line in pod.stdout.splitlines() if line.startswith("plan:")]
    assert len(pods) == len(printed) > 20
    for printed_line, pods_line in zip(printed, pods, strict=True):
        if printed_line.startswith(checked):
            assert (
                pods_line == f"{checked}: pathwaysutils found at {image}/pathwaysutils/__init__.py"
            )
        else:
            assert pods_line == printed_line


def test_a_pod_whose_environment_differs_from_the_render_refuses_naming_the_line(tmp_path):
    bench = _rendered(tmp_path, "--steps=7")
    text = bench.read_text()
    assert "export STEPS=7\n" in text
    bench.write_text(text.replace("export STEPS=7\n", "export STEPS=9\n"))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    pod = _pod_plan(bench, stubs)
    assert pod.returncode == 2, pod.stderr
    (line,) = [x for x in pod.stderr.splitlines() if "differs from the rendered plan" in x]
    assert "rendered 'plan: step: micro_steps=4 steps=7" in line
    assert "the pod's 'plan: step: micro_steps=4 steps=9" in line


def test_what_only_the_image_answers_is_printed_as_checked_in_the_pod_and_checked_there(
    tmp_path, capfd
):
    """A MaxText trainer under Pathways: the plan says what the pod will check in its image;
    this host, with no maxtext, is an image that contradicts the plan, and the pod refuses to
    start in one line, where a silent fallback would time another program."""
    launch = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    bench = tmp_path / "bench.yaml"
    assert cli.main(["render", f"--launch-render={launch}", f"--output={bench}"]) == 0
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 0
    lines = capfd.readouterr().out.splitlines()
    checks = [line for line in lines if line.startswith("plan: checked in the pod: ")]
    assert [line.split(": ")[2].split(" (")[0] for line in checks] == [
        "maxtext",
        "tunix",
        "pathwaysutils",
    ]
    loss = next(line for line in lines if line.startswith("plan: loss: "))
    assert loss.startswith("plan: loss: Tunix's GRPO loss") and "refuses to start" in loss
    assert "tunix is not installed here" not in "\n".join(lines)  # nothing of this host
    stubs = tmp_path / "bin"
    stubs.mkdir()
    pod = _pod_plan(bench, stubs)
    assert pod.returncode == 2, pod.stdout
    refusal = [line for line in pod.stderr.splitlines() if "no importable maxtext" in line]
    assert len(refusal) == 1


def test_plan_of_a_same_pod_ab_prints_the_ab_not_the_plain_benchs_steps(tmp_path, capfd):
    """The pod runs `ab.same_pod`: its plan names the arms and what each changes, the order, the
    design with its cost from aot's estimate read at render, and one state's memory; the step line
    keeps the step's shape and leaves steps and warm-ups to the A/B."""
    report = tmp_path / "aot.json"
    report.write_text(json.dumps({"preset": "p", "time_estimate": {"step_seconds": 100.15}}))
    bench = _rendered(
        tmp_path,
        "--ab-arms=off,on",
        f"--ab-step-time={report}",
        "--ab-step-noise=0.15%",
        "--ab-budget=25min",
    )
    assert exports(load_manifest(bench.read_text()))["AB_STEP_TIME"] == (
        f"100.15s (aot's roofline ESTIMATE in {report}, not a measurement)"
    )
    capfd.readouterr()
    assert cli.main(["plan", str(bench)]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert not any(line.startswith("plan: step: micro_steps=4 steps=") for line in lines)
    assert (
        "plan: step: micro_steps=4 worker=separate; steps, warm-ups and stages: the A/B's" in lines
    )
    assert "plan: A/B arm off: STAGE_BEFORE_UPDATE=off; engine config: the plan's above" in lines
    assert "plan: A/B arm on: STAGE_BEFORE_UPDATE=on; engine config: the plan's above" in lines
    assert any(line.startswith("plan: run order: ") for line in lines)
    # 25 min of 100.15 s steps: 14 steps, less 2 warm-ups at most, 6 per setting: 3 blocks of
    # 1-step turns; the built-in engine warms its one program set for 1 step, and one more for
    # arm on's stage: 14 steps in all
    design = next(line for line in lines if line.startswith("plan: A/B design: "))
    assert (
        "at most 3 blocks, each setting two turns of 1 scored step(s) per block: at most 6 scored"
        in design
    )
    assert design.endswith("14 steps in all, by --budget 25min")
    pod_time = next(line for line in lines if line.startswith("plan: A/B pod time: "))
    assert pod_time.startswith("plan: A/B pod time: expected ")  # it stops when settled
    assert pod_time.endswith(
        "; at most 14 steps x 100.2 s = 23.4 min (ESTIMATE; step time: aot's roofline"
        f" ESTIMATE in {report}, not a measurement), plus start-up and compiles"
    )
    resolves = next(line for line in lines if line.startswith("plan: A/B resolves: "))
    assert "at 0.15% step noise (given by AB_STEP_NOISE)" in resolves
    assert any(
        line.startswith("plan: A/B device memory: one state for every arm") for line in lines
    )
    assert lines[-3].startswith("plan: same-pod A/B: scored as `ab` scores its arms")
    assert lines[-2].startswith("plan: checked in the pod: pathwaysutils")
    assert lines[-1] == "plan: ok: every knob is valid; nothing ran on a device"
    # the turns printed are the ones the pod runs: the render drew their seed and exports it
    order = next(line for line in lines if line.startswith("plan: run order: "))
    assert order.endswith("(AB_SCHEDULE_SEED): the pod runs them")


def test_ab_design_knobs_without_ab_arms_are_refused(tmp_path, capfd):
    bench = tmp_path / "bench.yaml"
    assert (
        cli.main(["render", f"--launch-render={FIXTURE}", f"--output={bench}", "--ab-budget=12"])
        == 2
    )
    (line,) = capfd.readouterr().err.splitlines()
    assert "AB_BUDGET sizes a same-pod A/B: set AB_ARMS too" in line and not bench.exists()
