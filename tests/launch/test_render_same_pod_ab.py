"""AB_ARMS renders a pod that runs a same-pod A/B: its arms in one process with the `ab` design,
from the pod's own embedded code; what binds at start-up is refused for one process.
"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
import tarfile

import pytest
import yaml
from reference_data import launch_render
from render_helpers import FIXTURE, client_command, client_script, exports

from rl_trainer_bench import cli
from rl_trainer_bench.ab.same_pod import ab_arguments, plan_lines
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render, render_with_plan

ARMS = "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"


def _render(**knobs: str) -> dict:
    return yaml.safe_load(
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings(knobs), check_pod=plan_lines)
    )


def _bundle_names(bench: dict) -> list[str]:
    data = base64.b64decode("\n".join(client_command(bench)[4:]))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as archive:
        return archive.getnames()


def test_the_pod_runs_the_same_pod_ab_entry_with_its_code():
    bench = _render(ab_arms=ARMS)
    assert exports(bench)["AB_ARMS"] == ARMS
    assert "-m rl_trainer_bench.ab.same_pod" in client_script(bench)
    assert "rl_trainer_bench/ab/same_pod.py" in _bundle_names(bench)
    plain = _render()
    assert "rl_trainer_bench.ab" not in client_script(plain)
    assert not any(name.startswith("rl_trainer_bench/ab/") for name in _bundle_names(plain))


def test_the_render_says_what_the_pods_ab_will_do():
    rendered = render_with_plan(
        FIXTURE.read_text(), "f", RenderKnobs.from_strings({"ab_arms": ARMS}), plan_lines
    )
    line = rendered.ab_lines[0]
    assert line.startswith(
        "same-pod A/B of base, wide (AB_ARMS), one process, one training state, 3 scored steps"
        " per arm, at least 1 warm-up steps per bench once, up front; run order: "
    )
    assert "(6 blocks, each balanced: a drift linear within a block cancels in it" in line
    assert re.search(r"these turns are schedule seed \d+'s, and the pod's run draws its own$", line)


def test_an_arm_that_sets_a_start_up_bound_knob_is_refused_naming_separate_pods(capsys, tmp_path):
    out = tmp_path / "bench.yaml"
    code = cli.main(
        [
            "render",
            "--launch-render",
            str(FIXTURE),
            "--output",
            str(out),
            "--ab-arms",
            "a:XLA_FLAGS=--xla_x=1,b:ragged_buffer_factor=2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "XLA_FLAGS, which binds when the process starts" in err
    assert "ab --from-logs" in err


def test_an_arm_the_pod_would_refuse_is_refused_at_render():
    with pytest.raises(UserError, match="would not be applied"):
        _render(ab_arms="a:no_such_key=1,b:ragged_buffer_factor=2")


def test_the_pods_knobs_are_every_arms(tmp_path):
    env = {
        "AB_ARMS": "off,on",
        "TRAINER_ARGV": "--model_name=Qwen3-30B-A3B --mesh_fsdp=8",
        "ENGINE_FLAGS": "beta=0.04",
        "STEPS": "3",
        "RESULTS_DIR": str(tmp_path / "r"),
        "JAX_PLATFORMS": "proxy,cpu",
    }
    args = ab_arguments(env)
    assert (args.preset, args.arms, args.steps, str(args.out)) == (
        "qwen3-30b-a3b-cell",
        "off,on",
        3,
        str(tmp_path / "r"),
    )
    assert args.knob == [
        "TRAINER_ARGV=--model_name=Qwen3-30B-A3B --mesh_fsdp=8",
        "ENGINE_FLAGS=beta=0.04",
    ]


def test_the_rendered_pods_own_code_plans_its_ab(tmp_path):
    bench = _render(ab_arms=ARMS)
    data = base64.b64decode("\n".join(client_command(bench)[4:]))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as archive:
        archive.extractall(tmp_path, filter="data")
    environment = {**exports(bench), "PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "rl_trainer_bench.ab.same_pod"],
        env={**environment, "PLAN_ONLY": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "plan: ok: every knob is valid; nothing ran on a device" in lines
    assert lines[-2].startswith("plan: same-pod A/B of base, wide (AB_ARMS), one process")


def test_the_397b_pods_ab_is_planned_for_the_pods_host_and_fits_kubectl_apply():
    # The 397B pool needs about 24 GiB of host memory: judged on the pod's host, never on the
    # machine that renders; and the manifest, with the A/B's code, stays under the 262,144 bytes
    # of annotations `kubectl apply` keeps.
    path = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    text = render(path.read_text(), path.name, RenderKnobs(ab_arms="off,on"), plan_lines)
    assert len(text.encode()) < 262_144
    assert yaml.safe_load(text)["metadata"]["name"] == "benchuser-train-bench"
