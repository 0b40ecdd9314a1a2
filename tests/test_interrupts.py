"""Ctrl-C and SIGTERM stop a command with 130 and 143, also when library code swallows the
interrupt (as JAX's garbage-collector callback did during a compile)."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time

import pytest
from stand_in_engine import StandInEngine

from rl_trainer_bench.bench import entry
from rl_trainer_bench.errors import run_guarded


def _signal(signum: int) -> None:
    """Send ourselves `signum`; its handler runs in here."""
    os.kill(os.getpid(), signum)
    time.sleep(1)  # the handler runs here, at the latest


def _signal_and_swallow(signum: int) -> None:
    """Send ourselves `signum` and swallow what it raises, as a library callback would."""
    with contextlib.suppress(KeyboardInterrupt):
        _signal(signum)


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


def test_an_interrupt_in_a_garbage_collector_callback_stops_the_run_after_it_unprinted(
    capsys, monkeypatch
):
    """JAX's collector callback ran when a Ctrl-C came: Python handed the interrupt raised there
    to `sys.unraisablehook`, which printed "Exception ignored in" and its traceback, and the run
    went on to its next check. Now it stops as soon as the callback is done."""
    unraisable, signalled, went_on = [], [], []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def signalled_in_the_collector(phase: str, info: dict) -> None:
        if phase == "start" and not signalled:
            signalled.append(True)
            _signal(signal.SIGINT)

    def body() -> int:
        gc.callbacks.append(signalled_in_the_collector)
        try:
            gc.collect()
            for _ in range(50):  # up to 5 s for the signal taken again, checked every 0.1 s
                time.sleep(0.1)
            went_on.append(True)
        finally:
            gc.callbacks.remove(signalled_in_the_collector)
        return 0

    assert run_guarded("cmd", body) == 130
    assert capsys.readouterr().err == "cmd: interrupted\n"
    assert unraisable == []
    assert went_on == []


def test_an_interrupt_swallowed_in_a_finalizer_is_not_printed_and_stops_the_command(
    capsys, monkeypatch
):
    """An interrupt raised in a `__del__` cannot propagate: Python hands it to
    `sys.unraisablehook`, which would print it; the command's end raises it instead."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class SignalledWhenCollected:
        def __del__(self) -> None:
            _signal(signal.SIGTERM)

    def body() -> int:
        SignalledWhenCollected()
        return 0

    assert run_guarded("cmd", body) == 143
    assert capsys.readouterr().err == "cmd: terminated (SIGTERM)\n"
    assert unraisable == []


def test_an_error_a_library_made_of_an_interrupt_is_reported_as_the_interrupt(capsys):
    """JAX turns an interrupt raised in a host callback into an XLA runtime error of its own."""

    def body() -> int:
        try:
            _signal(signal.SIGTERM)
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("INTERNAL: CpuCallback error") from interrupt
        return 0

    assert run_guarded("cmd", body) == 143
    assert capsys.readouterr().err == "cmd: terminated (SIGTERM)\n"
