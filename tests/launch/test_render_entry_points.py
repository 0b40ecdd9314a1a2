"""render_bench.py (flags) and render_bench.sh (environment): same output, same one-line errors."""

import os
import subprocess
import sys

import pytest
from render_helpers import FIXTURE, REPO

from rl_trainer_bench import cli
from rl_trainer_bench.launch.knobs import RENDER_KNOBS

KNOB_VALUES = {
    "LAUNCH_RENDER": str(FIXTURE),
    "STEPS": "4",
    "DRIVER_ENV": "A='x $(id)'",
    "TRAINER_SLICE": "v5p:2x2x4",
    "ENGINE_FLAGS": "mesh_context=2",  # the trainer's 8-device mesh doubled to fill 16 chips
}


def _run(argv, env_extra=None):
    env = {**os.environ, "PYTHON": sys.executable, **(env_extra or {})}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_shell_and_python_entry_points_render_the_same_bench(tmp_path):
    flags = [f"--{k.lower().replace('_', '-')}={v}" for k, v in KNOB_VALUES.items()]
    by_flags = _run([sys.executable, "render_bench.py", *flags])
    by_env = _run(["bash", "render_bench.sh"], KNOB_VALUES)
    assert by_flags.returncode == by_env.returncode == 0, by_env.stderr
    assert by_flags.stdout == by_env.stdout
    assert "kind: JobSet" in by_flags.stdout


def test_shell_entry_point_passes_every_knob_as_its_flag(tmp_path):
    """Every knob of the renderer's table, set in the environment, reaches render_bench.py as its
    flag: an interpreter that records what render_bench.py is given stands in for the render."""
    recorder = tmp_path / "python"
    recorder.write_text(
        f'#!/bin/sh\nif [ "$1" = "{REPO / "render_bench.py"}" ]; then shift; printf "%s\\n" "$@";'
        f' else exec {sys.executable} "$@"; fi\n'
    )
    recorder.chmod(0o755)
    env = {knob.env: f"v {knob.env}" for knob in RENDER_KNOBS}
    result = _run(["bash", "render_bench.sh"], {**env, "PYTHON": str(recorder)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{knob.flag}=v {knob.env}" for knob in RENDER_KNOBS]


@pytest.mark.parametrize(
    "env_extra",
    [
        {"TRAINER_SLICE": "v9:8x8"},
        {"STEPS": "-3"},
        {"BENCH_NAME": "x" * 40},
        {"LAUNCH_RENDER": "/nonexistent/launch.yaml"},
    ],
)
def test_bad_knob_is_one_line_exit_2_and_no_output_file(tmp_path, env_extra):
    output = tmp_path / "bench.yaml"
    result = _run(["bash", "render_bench.sh"], {**KNOB_VALUES, "OUTPUT": str(output), **env_extra})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_knob_in_the_environment_is_refused_naming_the_knob(tmp_path):
    output = tmp_path / "bench.yaml"
    result = _run(["bash", "render_bench.sh"], {**KNOB_VALUES, "OUTPUT": str(output), "STEP": "3"})
    assert result.returncode == 2 and not output.exists()
    assert result.stderr == (
        "rl-trainer-bench render: STEP is not a knob: did you mean STEPS?"
        " (set in the environment; rename it)\n"
    )


def test_unknown_flag_is_one_line_exit_2():
    result = _run([sys.executable, "render_bench.py", "--stepz=3"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_output_file_is_written_whole(tmp_path):
    output = tmp_path / "bench.yaml"
    result = _run(["bash", "render_bench.sh"], {**KNOB_VALUES, "OUTPUT": str(output)})
    assert result.returncode == 0, result.stderr
    assert output.read_text().startswith("apiVersion: jobset.x-k8s.io/v1alpha2")
    assert [p.name for p in tmp_path.iterdir()] == ["bench.yaml"]


@pytest.mark.parametrize("knob", ["--output", "--aot-job"])
def test_an_output_naming_the_launch_render_it_reads_is_refused(knob, tmp_path, capsys):
    """The launcher's DRY_RUN output may be its only copy: a render never writes over it."""
    launch = tmp_path / "launch.yaml"
    launch.write_text(FIXTURE.read_text())
    (tmp_path / "sub").mkdir()
    other_spelling = tmp_path / "sub" / ".." / "launch.yaml"
    argv = ["render", "--launch-render", str(launch), knob, str(other_spelling)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    name = knob.removeprefix("--").replace("-", "_").upper()
    assert f"{name}={other_spelling} is the LAUNCH_RENDER file the render reads" in err
    assert launch.read_text() == FIXTURE.read_text()


def test_stdin_is_read_as_bytes_and_non_utf8_is_one_line(tmp_path):
    command = [sys.executable, "render_bench.py", "--launch-render", "-", "--steps", "4"]
    good = subprocess.run(
        command, cwd=REPO, input=FIXTURE.read_bytes(), capture_output=True, timeout=120
    )
    assert good.returncode == 0 and b"kind: JobSet" in good.stdout
    bad = subprocess.run(
        command, cwd=REPO, input=b"kind: \xff\xfe\n", capture_output=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stdout == b""
    assert b"not UTF-8" in bad.stderr and bad.stderr.count(b"\n") == 1
