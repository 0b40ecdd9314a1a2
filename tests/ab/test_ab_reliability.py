"""`ab` takes engine keys in --arms and --knob (the README's example), refuses what it would
otherwise ignore (--order or --blocks with the interleaved design, --blocks with another order,
unknown knobs, unbounded counts), never mixes
a new run's files with an earlier one's, and ends a Ctrl-C or a SIGTERM with an incomplete ab.json
and 130 or 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stand_in_engine import StandInEngine, stand_in_pool
from test_ab_command import run_ab
from test_ab_refusals import InterruptedEngine

from rl_trainer_bench.bench.driver import Bench

REPO = Path(__file__).parents[2]


class EngineConfigs:
    """A Bench factory with the stand-in engine that records the engine config each bench built."""

    def __init__(self):
        self.engine_configs = []
        self.benches = []

    def __call__(self, plan, log):
        def engine(engine_config):
            self.engine_configs.append(engine_config)
            return StandInEngine()

        self.benches.append(
            Bench(
                plan.config,
                log,
                engine_config=plan.engine,
                engine_factory=engine,
                pool=stand_in_pool(3),
            )
        )
        return self.benches[-1]


def test_the_readmes_engine_key_arms_run_each_on_its_own_engine_config(tmp_path):
    benches = EngineConfigs()
    arms = "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"
    argv = ["--arms", arms, "--steps", "1", "--schedule-seed", "0"]  # seed 0: base runs first
    code = run_ab([*argv, "--out", str(tmp_path / "ab")], benches)
    assert code == 0
    # two programs, one bench each, in the arms' order: the first bench's engine is built, the
    # second is built over its state (share_state) for the second config
    assert [c.moe.ragged_buffer_factor for c in benches.engine_configs] == [1.25]
    assert benches.benches[1].engine.config.moe.ragged_buffer_factor == 2.0
    report = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert report["arm_knobs"]["wide"]["ENGINE_FLAGS"] == "ragged_buffer_factor=2"


def test_an_engine_key_knob_reaches_every_arm(tmp_path):
    benches = EngineConfigs()
    argv = ["--knob", "ragged_buffer_factor=2", "--steps", "1", "--out", str(tmp_path / "ab")]
    assert run_ab(argv, benches) == 0
    assert [c.moe.ragged_buffer_factor for c in benches.engine_configs] == [2.0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--design", "interleaved", "--order", "block"],
            "--order block orders separate arms (--design arms)",
        ),
        (["--knob", "FOO=1"], "--knob sets FOO, which is not a driver knob"),
        (["--knob", "no_such_key=1"], "--knob sets no_such_key, which is not an engine key"),
        (["--knob", "ENGINE_FLAGS=no_such_key=1"], "no_such_key would not be applied"),
        (["--arms", "a:no_such_key=1,b:no_such_key=2"], "no_such_key, which is not an engine key"),
        (
            ["--design", "interleaved", "--steps", "99999999999999999999"],
            "argument --steps: --steps=99999999999999999999 is too large: use an integer <= 100,000",
        ),
        (
            ["--warmup-steps", "100001"],
            "--warmup-steps=100001 is too large: use an integer <= 100,000",
        ),
        (["--schedule-seed", "-1"], "argument --schedule-seed: '-1': give a whole number"),
        (["--blocks", "2"], "argument --blocks: '2': give a whole number from 3 to 1,000"),
        (["--order", "mirrored", "--blocks", "4"], "--blocks 4 sets the blocks of --order blocks"),
        (["--design", "interleaved", "--blocks", "4"], "--blocks 4 sets the blocks of separate"),
    ],
)
def test_what_ab_would_ignore_or_choke_on_is_refused_in_one_line(
    argv, message, tmp_path, capsys, monkeypatch
):
    from rl_trainer_bench import cli
    from rl_trainer_bench.ab import same_process

    def no_bench(plan, log):
        raise AssertionError("a bench was built: the refusal came too late")

    monkeypatch.setattr(same_process, "_driver_bench", no_bench)
    out = tmp_path / "ab"
    assert cli.main(["ab", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_ctrl_c_over_an_earlier_complete_run_moves_it_aside_whole(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--steps", "1", "--schedule-seed", "0"]  # seed 0: off runs first, on second
    assert run_ab([*argv, "--out", str(out)]) == 0
    earlier = _files(out)
    assert {"ab.json", "ab.txt", "ab.log", "arm1-off.jsonl"} <= set(earlier)
    engine = InterruptedEngine(at=4)  # after 2 warm-up steps and arm off's 1: arm on's first step

    def make_bench(plan, log):
        return Bench(plan.config, log, engine_factory=lambda _: engine, pool=stand_in_pool(3))

    assert run_ab([*argv, "--out", str(out)], make_bench) == 130
    capsys.readouterr()
    (aside,) = [p for p in out.iterdir() if p.is_dir()]
    assert aside.name.startswith("earlier-") and _files(aside) == earlier
    assert sorted(_files(out)) == ["ab.json", "ab.log", "arm1-off.jsonl"]  # this run's alone
    assert json.loads((out / "ab.json").read_text())["incomplete"] is True
    assert (
        f"moved the earlier run's files in {out} aside to {aside}" in (out / "ab.log").read_text()
    )


ENGINE_MODULE = """
import time
from stand_in_engine import StandInEngine

class SlowEngine(StandInEngine):
    def __init__(self, config):
        super().__init__()

    def fwd_bwd(self, batch):
        time.sleep(0.05)
        super().fwd_bwd(batch)
"""


def test_sigterm_ends_the_ab_like_ctrl_c_with_143(tmp_path):
    (tmp_path / "slow_engine.py").write_text(ENGINE_MODULE)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests"), str(REPO)]),
    }
    argv = ["--engine", "slow_engine:SlowEngine", "--steps", "100", "--knob", "MICRO_STEPS=1"]
    argv += ["--schedule-seed", "0"]  # off runs first
    process = subprocess.Popen(
        [sys.executable, "-m", "rl_trainer_bench.cli", "ab", *argv, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "ab.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "arm off" in log.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "rl-trainer-bench ab: terminated (SIGTERM) in arm off (1/24); 0 of 24 arms" in err
    report = json.loads((out / "ab.json").read_text())
    assert report["incomplete"] is True and report["verdict"] is None
