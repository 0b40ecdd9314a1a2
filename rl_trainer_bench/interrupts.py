"""Ctrl-C and SIGTERM stop a command, even when library code swallows the interrupt.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives; when
that is inside a garbage-collector callback (JAX registers one) the exception is printed as
"ignored" and the program runs on, so an interrupted A/B could finish and exit 0. And SIGTERM,
what Kubernetes and `timeout` send, kills the process by default without writing what an
interrupted run writes. So both signals go through one handler that records the signal before it
raises: the raise stops the run where it can, and `check()`, called at the points where a run
moves on (after a compile, at each step boundary, when a command returns), raises it again if it
was swallowed. The exit code is 128 + the signal's number, as shells report it (130, 143).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)

_pending: list[int] = []  # signals received while `handled` is active, oldest first


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); a KeyboardInterrupt, so every place
    that cleans up after Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that stopped the run (130 for a plain KeyboardInterrupt: SIGINT's).

    Asking for it means the interrupt has been dealt with: `check()` no longer raises it.
    """
    _pending.clear()
    signum = interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT
    return 128 + int(signum)


def describe(interrupt: KeyboardInterrupt) -> str:
    """`interrupted` for Ctrl-C, `terminated (SIGTERM)` for SIGTERM: the word a log should say."""
    if isinstance(interrupt, Interrupted) and interrupt.signum == signal.SIGTERM:
        return "terminated (SIGTERM)"
    return "interrupted"


def _record_and_raise(signum: int, frame: object) -> None:
    _pending.append(signum)
    raise Interrupted(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` (and are remembered) inside the block.

    Signal handlers can only be set from the main thread; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _record_and_raise) for signum in HANDLED}
    _pending.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()


def check() -> None:
    """Raise the interrupt that arrived earlier but was swallowed before it could stop the run."""
    if _pending:
        raise Interrupted(_pending[0])
