"""`rl-trainer-bench --help` imports no command, and `rl-trainer-bench COMMAND --help` imports that
command's parser module and nothing another command would bring.

Each case runs in a fresh interpreter. The reference for a command is Python's own import of its
parser module (the `arguments` half of its row in the table) beside the CLI and the engine contract
(whose error the CLI catches once a command is named): whatever `COMMAND --help` imports past that
closure came from another command's parser, as it would if the CLI built every command's parser.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_trainer_bench import cli

REPO = Path(__file__).resolve().parents[1]

# Imports the modules of argv[1] (JSON), then runs the argv of argv[2] through the CLI and prints,
# last, the package's modules and the heavy third-party packages that the CLI imported past them.
LOADED_PAST = """
import contextlib, importlib, io, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
before = set(sys.modules)
from rl_trainer_bench import cli
with contextlib.redirect_stdout(io.StringIO()):
    code = cli.main(json.loads(sys.argv[2]))
heavy = ("numpy", "jax", "yaml", "jsonschema", "scipy", "matplotlib")
new = sorted(
    name for name in set(sys.modules) - before
    if name.startswith("rl_trainer_bench.") or name.partition(".")[0] in heavy
)
print(json.dumps([code, new]))
"""


def _loaded_past(modules: list[str], argv: list[str]) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_PAST, json.dumps(modules), json.dumps(argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    code, new = json.loads(done.stdout.splitlines()[-1])
    return code, new


def test_help_imports_no_command_and_no_numpy():
    code, new = _loaded_past([], ["--help"])
    assert code == 0
    assert new == [
        "rl_trainer_bench.cli",
        "rl_trainer_bench.engine",
        "rl_trainer_bench.engine.background",
        "rl_trainer_bench.errors",
        "rl_trainer_bench.interrupts",
        "rl_trainer_bench.user_code",
    ]


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda command: command.name)
def test_a_commands_help_imports_its_parser_module_and_nothing_another_brings(command):
    parser_module = command.arguments.partition(":")[0]
    reference = ["rl_trainer_bench.cli", "rl_trainer_bench.engine.contract", parser_module]
    code, new = _loaded_past(reference, [command.name, "--help"])
    assert (code, new) == (0, [])
