"""Ctrl-C and SIGTERM while the engine's programs compile side by side end in the bench's one line
and the signal's exit code, with nothing from the runtime after it.

The compile runs on background threads inside XLA; a process that let Python's shutdown run under
them aborted ("terminate called after throwing an instance of ''", exit 134) or crashed (exit 139),
and an interrupt that landed in JAX's garbage-collector callback printed its traceback as
"Exception ignored". Each case here starts `ab` on cpu-tiny in a process of its own, with no
compilation cache so its programs really compile, waits for the compile to start and signals it
a set time later (inside the compile: `bench1 compiled` never comes). A second signal ends the
process at once, with one line: while the main thread waits in native code, where the first one's
handler cannot run, and during the cleanup the first one started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPILING = "compiling bench1"
# What the runtime printed when the process ended under the compile, each seen before the fix.
CRASH_WORDS = ("terminate called", "FATAL", "Fatal Python error", "Traceback", "Exception ignored")


def _interrupted_ab(tmp_path: Path, signum: int, after_s: float) -> tuple[int, str]:
    """`ab` signalled `after_s` seconds into its compile: (exit code, output after the signal)."""
    out = str(tmp_path / "out")
    env = {
        **os.environ,
        "JAX_ENABLE_COMPILATION_CACHE": "false",  # a cache hit would leave no compile to stop
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "rl_trainer_bench.cli", "ab", "--steps", "1", "--out", out],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        before = []
        for line in process.stdout:
            before.append(line)
            if COMPILING in line:
                break
        else:
            pytest.fail(f"ab ended before its compile: {''.join(before)[-2000:]}")
        time.sleep(after_s)
        process.send_signal(signum)
        after, _ = process.communicate(timeout=120)
    finally:
        process.kill()  # a run the signal did not end is not left behind
    return process.returncode, after


@pytest.mark.parametrize(
    ("signum", "after_s"),
    [(signal.SIGINT, 0.2), (signal.SIGINT, 1.0), (signal.SIGINT, 2.0), (signal.SIGTERM, 0.8)],
    ids=["sigint-at-0.2s", "sigint-at-1s", "sigint-at-2s", "sigterm-at-0.8s"],
)
def test_a_signal_in_the_compile_ends_in_one_line_and_its_exit_code(tmp_path, signum, after_s):
    code, after = _interrupted_ab(tmp_path, signum, after_s)
    word = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    assert code == 128 + signum, after
    assert not any(crash in after for crash in CRASH_WORDS), after
    assert "bench1 compiled" not in after  # the signal came inside the compile
    said = [line for line in after.splitlines() if not line.startswith(("[ab", "[TrainerBench]"))]
    assert said == [
        f"rl-trainer-bench ab: {word} while setting up; 0 of 24 arms finished, written to"
        f" {tmp_path / 'out' / 'ab.json'} marked incomplete (no verdict)"
    ], after
    report = json.loads((tmp_path / "out" / "ab.json").read_text())
    assert report["incomplete"] is True and report["verdict"] is None


# A run whose main thread waits in native code, as for a long device step: a program that never
# ends (a loop whose condition stays true), so the first signal's handler never gets to run.
WAITING_IN_NATIVE_CODE = """
import jax
import numpy as np

from rl_trainer_bench.errors import exit_process, run_guarded


def body():
    forever = jax.jit(lambda x: jax.lax.while_loop(lambda v: v < np.inf, lambda v: v / 2 + 1, x))
    forever.lower(np.float32(0)).compile()
    print("waiting in the device call", flush=True)
    forever(np.float32(0)).block_until_ready()


exit_process(run_guarded("prog", body))
"""


def test_a_second_ctrl_c_ends_the_run_at_once_while_it_waits_in_native_code():
    process = subprocess.Popen(
        [sys.executable, "-c", WAITING_IN_NATIVE_CODE],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout.readline() == "waiting in the device call\n"
        time.sleep(1)  # the call's dispatch is behind it: the main thread waits in native code
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)
        signalled = time.monotonic()
        process.send_signal(signal.SIGINT)
        after, _ = process.communicate(timeout=30)
    finally:
        process.kill()  # the program never ends by itself
    assert time.monotonic() - signalled < 10
    assert process.returncode == 130, after
    assert after == "prog: interrupted again: stopped at once\n"


# A run whose cleanup after the first Ctrl-C is slow, and gets a second one.
SLOW_CLEANUP = """
import os
import signal
import time

from rl_trainer_bench.errors import exit_process, run_guarded


def body():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again during the cleanup
        time.sleep(5)
        raise


exit_process(run_guarded("prog", body))
"""


def test_a_second_ctrl_c_during_the_cleanup_says_one_line():
    """The second signal is the watch's alone: the handler does not raise it in the cleanup as
    well, which printed the first's line beside the watch's."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SLOW_CLEANUP], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 5
    assert done.returncode == 130, done.stderr
    assert done.stderr == "prog: interrupted again: stopped at once\n"
