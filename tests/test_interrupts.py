"""Ctrl-C and SIGTERM stop a command with 130 and 143, also when library code swallows the
interrupt (as JAX's garbage-collector callback did during a compile)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from stand_in_engine import StandInEngine

from rl_trainer_bench.bench import entry
from rl_trainer_bench.errors import run_guarded


def _signal_and_swallow(signum: int) -> None:
    """Send ourselves `signum` and swallow what it raises, as a library callback would."""
    try:
        os.kill(os.getpid(), signum)
        time.sleep(1)  # the handler runs here, at the latest
    except KeyboardInterrupt:
        pass


class SwallowingCompileEngine(StandInEngine):
    """Its compile is interrupted by SIGNAL, and swallows the interrupt."""

    SIGNAL = signal.SIGINT

    def __init__(self, config):
        super().__init__()

    def compile(self, example):
        _signal_and_swallow(self.SIGNAL)
        return super().compile(example)


class SwallowingCompileTermEngine(SwallowingCompileEngine):
    SIGNAL = signal.SIGTERM


@pytest.mark.parametrize(
    ("engine", "code", "said"),
    [
        ("SwallowingCompileEngine", 130, "bench_driver: interrupted"),
        ("SwallowingCompileTermEngine", 143, "bench_driver: terminated (SIGTERM)"),
    ],
)
def test_an_interrupt_swallowed_during_the_compile_stops_the_run(
    engine, code, said, tmp_path, capsys
):
    env = {
        "STEPS": "1",
        "MICRO_STEPS": "1",
        "RESULTS_DIR": str(tmp_path / "r"),
        "ENGINE": f"test_interrupts:{engine}",
    }
    assert entry.main([], env) == code
    captured = capsys.readouterr()
    assert captured.err == said + "\n"
    assert "step=" not in captured.out
    assert not (tmp_path / "r").exists()


def test_a_swallowed_sigterm_still_ends_a_command_with_143(capsys):
    def body() -> int:
        _signal_and_swallow(signal.SIGTERM)
        return 0

    assert run_guarded("cmd", body) == 143
    assert capsys.readouterr().err == "cmd: terminated (SIGTERM)\n"


def test_the_handlers_are_put_back_after_the_command():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run_guarded("cmd", lambda: 0)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
