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
from reference_data import launch_render
from render_helpers import FIXTURE, client_command, client_script, exports, load_manifest

from rl_trainer_bench import cli
from rl_trainer_bench.ab import budget
from rl_trainer_bench.ab.render_command import plan_for_render
from rl_trainer_bench.ab.same_pod import ab_arguments
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.apply_size import stored_annotation_bytes
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render, render_with_plan

ARMS = "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"


def _render(**knobs: str) -> dict:
    return load_manifest(
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings(knobs), plan_ab=plan_for_render)
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


def test_an_arms_key_the_trainers_own_maxtext_key_replaces_says_what_maxtext_runs():
    """MaxText's engine applies the trainer's own keys last: an arm setting one of them to another
    value runs the trainer's in MaxText, and its engine-config line says so; an arm whose value is
    the trainer's is not marked."""
    launch = FIXTURE.read_text().replace(  # the trainer's keys as MaxText reads them
        'MAXTEXT_EXTRA_FLAGS="--remat_policy=full --scan_layers=true"',
        'MAXTEXT_EXTRA_FLAGS="remat_policy=full scan_layers=true"',
    )
    knobs = {"ab_arms": "full:remat_policy=full,minimal:remat_policy=minimal", "engine": "maxtext"}
    rendered = render_with_plan(launch, "f", RenderKnobs.from_strings(knobs), plan_for_render)
    assert list(rendered.ab_lines[1:3]) == [
        "A/B arm full: remat_policy=full; engine config: the plan's above",
        "A/B arm minimal: remat_policy=minimal; engine config: the plan's above with"
        " model.remat_policy=minimal (MaxText runs the trainer's remat_policy=full)",
    ]


def test_the_render_says_what_the_pods_ab_will_do():
    rendered = render_with_plan(
        FIXTURE.read_text(), "f", RenderKnobs.from_strings({"ab_arms": ARMS}), plan_for_render
    )
    first, base, wide, order, design, stops, expected, *_ = rendered.ab_lines
    assert first.startswith(
        "same-pod A/B of base, wide (AB_ARMS), one process (python -m rl_trainer_bench.ab.same_pod)"
    )
    # each arm's engine config as its own plan resolves it, against the bench's plan above: the
    # fixture's preset runs ragged_buffer_factor=1.25 already
    assert (base, wide) == (
        "A/B arm base: ragged_buffer_factor=1.25; engine config: the plan's above",
        "A/B arm wide: ragged_buffer_factor=2; engine config: the plan's above with"
        " moe.ragged_buffer_factor=2.0",
    )
    assert order.startswith("run order: ")
    assert "(4 blocks, each balanced: a drift linear within a block cancels in it" in order
    assert re.search(
        r"these turns are schedule seed \d+'s \(AB_SCHEDULE_SEED\): the pod runs them$", order
    )
    # on the fixture's v5p slice: the accelerator's budget, 4 blocks of 1-step turns; the
    # built-in engine warms each of the two program sets for 1 step, once
    assert design.startswith(
        "A/B design: at most 4 blocks, each setting two turns of 1 scored step(s) per block: at"
        " most 8 scored steps per setting x 2 settings = 16, and 2 warm-up steps (1 per program"
        " set x 2, once, up front); at most 18 steps in all, by the accelerator's default budget"
    )
    # a slice's A/B stops when settled: the render prints the rule and what it expects to spend
    assert stops.startswith(
        "A/B stops when settled: looks after every half-block, from half-block 3 to 8"
    )
    assert expected.startswith("A/B expected stop (ESTIMATE: 4000 simulated runs")
    assert expected.endswith("; at most 8")


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


def test_arms_run_together_are_refused_in_one_line_with_no_output(capsys, tmp_path):
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(FIXTURE), "--output", str(out)]
    assert cli.main([*argv, "--ab-arms", "off,tuned:maxtext.a=b;maxtext.c=d"]) == 2
    err = capsys.readouterr().err
    assert not out.exists() and len(err.strip().splitlines()) == 1
    assert "arm 'tuned' has maxtext.a='b;maxtext.c=d': an engine key's value is one entry" in err


def test_the_summary_says_which_arm_keys_only_the_pods_maxtext_checks():
    knobs = {"ab_arms": "tuned:maxtext.not_a_key=1,base:maxtext.remat_policy=full"}
    rendered = render_with_plan(
        FIXTURE.read_text(),
        "f",
        RenderKnobs.from_strings({**knobs, "engine": "maxtext"}),
        plan_for_render,
    )
    assert rendered.ab_lines[-2:] == (
        "same-pod A/B: arm tuned: MaxText keys not_a_key=1 (in none of the bench's tables):"
        " checked in the pod, by the trainer's image's MaxText before the runtime starts (a key it"
        " refuses stops the pod there, in one line)",
        "same-pod A/B: arm base: MaxText keys remat_policy=full: checked in the pod, by the"
        " trainer's image's MaxText before the runtime starts (a key it refuses stops the pod"
        " there, in one line)",
    )


def test_an_arm_the_pod_would_refuse_is_refused_at_render():
    with pytest.raises(UserError, match="sets no_such_key, which is not an engine key"):
        _render(ab_arms="a:no_such_key=1,b:ragged_buffer_factor=2")


@pytest.mark.parametrize(
    ("knob", "text"),
    [
        ("ab_schedule_seed", "-1"),
        ("ab_budget", "0"),
        ("ab_schedule_seed", "0x10"),
        ("ab_expect_effect", "0"),
        ("ab_expect_effect", "1,x"),
    ],
)
def test_a_design_knob_the_pod_would_refuse_is_named_as_the_render_takes_it(knob, text):
    # the pod's `ab` reads these as its flags; the user wrote the render's knob, so that is named
    with pytest.raises(UserError, match=rf": {knob.upper()}(: |=)'{text}'"):
        _render(ab_arms="off,on", **{knob: text})


def test_a_stop_the_pod_does_not_know_is_named_as_the_render_takes_it():
    with pytest.raises(UserError, match=r"AB_STOP: invalid choice: 'never'"):
        _render(ab_arms="off,on", ab_stop="never")


def test_the_pods_knobs_are_every_arms(tmp_path):
    env = {
        "AB_ARMS": "off,on",
        "TRAINER_ARGV": "--model_name=Qwen3-30B-A3B --mesh_fsdp=8",
        "ENGINE_FLAGS": "beta=0.04",
        "STEPS": "3",
        "AB_BUDGET": "18",
        "AB_STEP_TIME": "42s (a prior pod)",
        "RESULTS_DIR": str(tmp_path / "r"),
        "JAX_PLATFORMS": "proxy,cpu",
    }
    args, run = ab_arguments(env)
    assert (args.preset, args.arms, run.steps, run.blocks, str(args.out)) == (
        "qwen3-30b-a3b-cell",
        "off,on",
        3,
        3,  # 18 scored steps per setting in turns of 3: two turns a block
        str(tmp_path / "r"),
    )
    assert run.design.step_time == budget.Figure(42.0, "a prior pod")
    # the flags as the pod's environment gives them; what they leave open is the run's
    assert (args.steps, args.blocks, args.min_effect, args.schedule_seed) == (3, None, None, None)
    assert (run.min_effect, 0 <= run.schedule_seed < 2**32) == (0.5, True)
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
    assert lines[-1] == "plan: ok: every knob is valid; nothing ran on a device"
    assert any(
        line.startswith("plan: same-pod A/B of base, wide (AB_ARMS), one process") for line in lines
    )
    assert "plan: ok: every knob is valid; nothing ran on a device" in lines
    assert any(line.startswith("plan: same-pod A/B of base, wide (AB_ARMS)") for line in lines)


@pytest.mark.parametrize("engine", ["", "builtin"])  # the trainer's MaxText; the larger closure
def test_the_397b_pods_ab_is_planned_for_the_pods_host_and_fits_kubectl_apply(engine):
    # The 397B pool needs about 24 GiB of host memory: judged on the pod's host, never on the
    # machine that renders; and the manifest, with the A/B's code, stays under the 262,144 bytes
    # of annotations `kubectl apply` keeps.
    path = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    knobs = RenderKnobs.from_strings({"ab_arms": "off,on", "engine": engine})
    text = render(path.read_text(), path.name, knobs, plan_for_render)
    assert stored_annotation_bytes(load_manifest(text)) < 262_144
    assert load_manifest(text)["metadata"]["name"] == "benchuser-train-bench"


def test_the_ab_holds_one_state_for_arms_of_two_program_sets():
    """base and wide compile two program sets against one state: the A/B's memory line counts the
    plain bench's state once, and names the command that compiles both sets for the slice."""
    rendered = render_with_plan(
        FIXTURE.read_text(), "f", RenderKnobs.from_strings({"ab_arms": ARMS}), plan_for_render
    )
    state = re.search(r"state on the device (\S+ \S+) per device", rendered.plan.device_memory())
    (memory,) = [line for line in rendered.ab_lines if line.startswith("A/B device memory: ")]
    assert memory.startswith(f"A/B device memory: one state for every arm, {state[1]} per device")
    assert f"--target v5p:2x2x2 --ab-arms {ARMS} with" in memory  # a word bash reads as one


def test_the_render_reads_the_step_time_file_into_the_pods_knob_leaving_its_flags_as_parsed(
    tmp_path,
):
    """A step-time source file (here aot's report) is read on the rendering machine, as the pod
    has no copy of it: the pod's AB_STEP_TIME is its figure with the file named, and the render's
    own flags keep the path."""
    from rl_trainer_bench.ab import render_command

    prior = tmp_path / "aot.json"
    prior.write_text('{"time_estimate": {"step_seconds": 100.0}}')
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(FIXTURE), "--output", str(out)]
    argv += ["--ab-arms", "off,on", "--ab-step-time", str(prior)]
    args = cli.build_parser(argv).parse_args(argv)
    parsed = dict(vars(args))
    assert render_command.run(args) == 0
    assert vars(args) == parsed
    step_time = exports(load_manifest(out.read_text()))["AB_STEP_TIME"]
    assert step_time == f"100s (aot's roofline ESTIMATE in {prior}, not a measurement)"
