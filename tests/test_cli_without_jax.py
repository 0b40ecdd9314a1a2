"""Rendering, validating, diffing and planning need no JAX; a command that does names the install.

Each case runs in a fresh interpreter where `import jax` fails as it does on a python without JAX
(numpy, pyyaml and jsonschema only): a finder refuses `jax` and `jaxlib` before any other. The
command must succeed and leave `jax` out of `sys.modules`; a command that needs JAX must exit 2
naming the package and what installs it, never as a bug in the bench.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "testdata" / "launch_dryrun_fixture.yaml"

# Runs each argv of argv[1] (JSON) through the CLI in this process; prints, last, one JSON list of
# [exit code, whether jax was imported] (a child process, as `plan` runs, writes before it).
WITHOUT_JAX = """
import contextlib, io, json, sys

class NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("jax", "jaxlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoJax())
from rl_trainer_bench import cli

results = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    results.append([code, "jax" in sys.modules])
print(json.dumps(results))
"""


def _without_jax(*argvs: list[str]) -> tuple[list[list], str]:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_JAX, json.dumps(argvs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_help_render_validate_diff_and_plan_run_without_jax(tmp_path):
    bench = tmp_path / "bench.yaml"
    results, stderr = _without_jax(
        ["--help"],
        ["render", f"--launch-render={FIXTURE}", f"--output={bench}"],
        ["validate", str(bench)],
        ["render-diff", str(FIXTURE), str(bench)],
        ["run", "--plan"],
        ["plan", str(bench)],  # its pod's `bench_driver.py --plan` is `run --plan`'s entry
    )
    assert results == [[0, False]] * 6, stderr
    assert "internal error" not in stderr


def test_every_commands_help_runs_without_jax():
    """A command's `--help` imports its parser module alone (cli.py), and none needs JAX: on a
    rendering install, `rl-trainer-bench aot --help` still says what `aot` takes."""
    from rl_trainer_bench import cli

    results, stderr = _without_jax(*([command.name, "--help"] for command in cli.COMMANDS))
    assert results == [[0, False]] * len(cli.COMMANDS), stderr


def test_a_command_that_needs_jax_names_it_and_its_install_exit_2():
    results, stderr = _without_jax(["check-engine"], ["aot"])
    assert results == [[2, False], [2, False]], stderr
    lines = stderr.splitlines()
    assert len(lines) == 2, stderr
    for line in lines:
        assert "needs the Python package 'jax', which is not installed" in line
        assert "pip install -e . (the base install" in line
        assert "internal error" not in line
