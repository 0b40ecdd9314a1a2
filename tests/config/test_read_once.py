"""Each command reads its inputs once: the trainer's and orchestrator's commands, ENGINE_FLAGS and
the engine config they resolve to are read at the command's entry into typed objects
(`engine_keys.CommandLine`, `EngineFlags`, `ResolvedEngine`), and every later stage takes those.

The parsers of the raw inputs are wrapped in every module that holds them and counted while a
whole command runs in this process; a stage that parses an input again shows as one count more.
The stand-in engine keeps `run` and `ab` to seconds: the parsers all run before any engine does.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import render_command
from rl_trainer_bench.bench import entry
from rl_trainer_bench.config import engine_keys
from rl_trainer_bench.launch import pod_plan

# The commands' modules, loaded before the parsers are wrapped in every module that holds them.
COMMANDS = (entry, ab_command, render_command, pod_plan)

PARSERS = (
    "parse_trainer_command",
    "parse_trainer_argv",
    "parse_engine_flags",
    "split_maxtext_flags",
    "engine_config_from",
)
FIXTURE = Path(__file__).resolve().parents[1] / "testdata" / "launch_dryrun_fixture.yaml"
STAND_IN = "stand_in_engine:ConfiguredStandInEngine"
TRAINER = "python -m tunix.trainer --max_prompt_length=64 --max_response_length=64"
ORCHESTRATOR = "python -m tunix.orchestrator --batch_size=2 --num_generations=2"
FLAGS = "ragged_buffer_factor=2"
# One command's inputs: the trainer's command and the orchestrator's (each read by
# parse_trainer_command), ENGINE_FLAGS (parsed and split once) and the engine config they resolve.
ONCE = {
    "parse_trainer_command": 2,
    "parse_engine_flags": 1,
    "split_maxtext_flags": 1,
    "engine_config_from": 1,
}


@pytest.fixture
def parsed(monkeypatch):
    """Counts of each parser's calls from here on, in every module that imported it."""
    counts: collections.Counter[str] = collections.Counter()
    originals = {getattr(engine_keys, name): name for name in PARSERS}

    def counting(name, parser):
        def counted(*args, **kwargs):
            counts[name] += 1
            return parser(*args, **kwargs)

        return counted

    wrapped = {id(parser): counting(name, parser) for parser, name in originals.items()}
    for module in [m for n, m in sys.modules.items() if n.startswith("rl_trainer_bench")]:
        for attribute, value in list(vars(module).items()):
            if id(value) in wrapped and callable(value):
                monkeypatch.setattr(module, attribute, wrapped[id(value)])
    return counts


@pytest.fixture
def inputs(monkeypatch):
    for name, value in (
        ("TRAINER_ARGV", TRAINER),
        ("ORCH_ARGV", ORCHESTRATOR),
        ("ENGINE_FLAGS", FLAGS),
        ("PRESET", "cpu-tiny"),
    ):
        monkeypatch.setenv(name, value)


def _run(argv: list[str], counts: collections.Counter[str]) -> dict[str, int]:
    counts.clear()
    assert cli.main(argv) == 0
    return dict(counts)


def test_run_plan_reads_each_input_once(inputs, parsed, capsys):
    assert _run(["run", "--plan"], parsed) == ONCE
    assert "plan: ok: every knob is valid; nothing ran on a device" in capsys.readouterr().out


def test_run_reads_each_input_once(inputs, parsed, tmp_path, capsys):
    argv = ["run", "--engine", STAND_IN, "--steps", "1", "--results-dir", str(tmp_path)]
    assert _run([*argv, "--distinct-micro-batches", "1"], parsed) == ONCE


def test_ab_reads_each_input_once_per_arm(parsed, tmp_path, capsys):
    argv = ["ab", "--preset", "cpu-tiny", "--steps", "1", "--blocks", "3", "--out", str(tmp_path)]
    knobs = {"ENGINE": STAND_IN, "DISTINCT_MICRO_BATCHES": "1", "ENGINE_FLAGS": FLAGS}
    knobs |= {"TRAINER_ARGV": TRAINER, "ORCH_ARGV": ORCHESTRATOR}
    for name, value in knobs.items():  # `ab` takes its knobs as --knob, not from its environment
        argv += ["--knob", f"{name}={value}"]
    arms = 2  # the default arms, off and on
    assert _run(argv, parsed) == {name: count * arms for name, count in ONCE.items()}


def test_render_and_plan_read_each_input_once(parsed, tmp_path, capsys):
    bench = tmp_path / "bench.yaml"
    # The launch's trainer command, read once for its output folder and the pod's plan; the
    # orchestrator's, read once by the pod's plan.
    rendered = _run(["render", f"--launch-render={FIXTURE}", f"--output={bench}"], parsed)
    assert rendered == ONCE
    # `plan` reads the rendered pod's knobs once for its engine; the pod's code plans in its own
    # process, from its own copy of the package.
    assert _run(["plan", str(bench)], parsed) == ONCE
