"""One call run off the caller's thread, its result (or its error) taken when it is needed.

An engine compiles several programs that need nothing of each other: its step's programs (about a
minute each for the two `fwd_bwd` programs of tpu-v5e-1 on a TPU host), its initial state's (random
draws for every parameter: 49 s of TPU compile on a 2-core host) and its parameter digest's
(benchmarks/reports/ab-turn-overhead_cpu-v5e_2026-12-06.md). Compiled side by side, they take the
host's other cores instead of wall time: XLA's compile releases the GIL, and JAX compiles from
several threads.

The thread is a daemon: a Ctrl-C during the compile ends the process without waiting for it.
The caller waits in short joins, checking for an interrupt between them, so one that a library
callback swallowed while the compile ran still stops the run at once (`interrupts.check`); the
process then ends without Python's shutdown (`errors.exit_process`), which would tear the
interpreter down under the compile still running here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from rl_trainer_bench import interrupts

T = TypeVar("T")
# How often a caller waiting for the thread looks for a swallowed interrupt.
_CHECK_EVERY_S = 0.1


_started: list[threading.Thread] = []  # every Background's thread, for `running()`


def running() -> bool:
    """Whether a Background's call is still running (a compile an interrupt or a refusal left)."""
    _started[:] = [thread for thread in _started if thread.is_alive()]
    return bool(_started)


class Background(Generic[T]):
    """`call()` started on a thread of its own; `result()` waits for it and returns its value or
    raises its error (in the caller's thread, as if it had been called there)."""

    def __init__(self, call: Callable[[], T], name: str):
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _started.append(self._thread)

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as error:  # handed to the caller by result()
            self._error = error

    def result(self) -> T:
        while self._thread.is_alive():
            self._thread.join(_CHECK_EVERY_S)
            interrupts.check()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
