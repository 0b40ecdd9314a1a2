"""Ctrl-C and SIGTERM stop a command, even when library code swallows the interrupt, and a
second one stops it at once.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives; when
that is inside a garbage-collector callback (JAX registers one, and the lowering of the programs
allocates enough to collect often) Python prints it as "Exception ignored" with its traceback
and the program runs on, so an interrupted A/B could finish and exit 0. And SIGTERM, what
Kubernetes and `timeout` send, kills the process by default without writing what an interrupted
run writes. So both signals go through one handler, which records the signal and raises it:

- inside a collector's callback it does not raise: it has the main thread take the signal again
  a moment later, from another thread, until it comes outside the callback;
- one swallowed elsewhere (a `__del__`, a library's `except`) is not printed
  (`sys.unraisablehook` drops exactly these), and `check()`, called where a run moves on (after a
  compile, at each step boundary, while the main thread waits for a background compile, when a
  command returns), raises it again.

The exit code is 128 + the signal's number, as shells report it (130, 143).

Python runs a signal's handler only when the main thread next runs Python code, so one that
arrives while the main thread waits in native code (a compile on it, a wait for a long device
step) acts when that call returns. A second signal does not wait: the signal's C handler writes
its number to a pipe (`signal.set_wakeup_fd`) at once, and a thread reading the pipe ends the
process at the second one, with one line, wherever the cleanup the first started has got to.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)

_pending: list[int] = []  # signals received while `handled` is active, oldest first
_ended_by: list[int] = []  # the signal that ended the last guarded run, once `exit_code` said so
_raised: list[int] = []  # the signal the handler raised in this block: it raises one, once


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); a KeyboardInterrupt, so every place
    that cleans up after Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that stopped the run (130 for a plain KeyboardInterrupt: SIGINT's).

    Asking for it means the interrupt has been dealt with: `check()` no longer raises it, and
    `ended_by_signal()` says the run ended so.
    """
    _pending.clear()
    signum = interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT
    _ended_by[:] = [int(signum)]
    return 128 + int(signum)


def ended_by_signal() -> bool:
    """Whether the last guarded run ended by SIGINT or SIGTERM (its exit code was asked for)."""
    return bool(_ended_by)


def describe(interrupt: KeyboardInterrupt) -> str:
    """`interrupted` for Ctrl-C, `terminated (SIGTERM)` for SIGTERM: the word a log should say."""
    if isinstance(interrupt, Interrupted) and interrupt.signum == signal.SIGTERM:
        return "terminated (SIGTERM)"
    return "interrupted"


def _record_and_raise(signum: int, frame: types.FrameType | None) -> None:
    _pending.append(signum)  # `check()` raises it, at the latest
    if _raised:  # the run is stopping: a second signal is the watch's, which ends the process
        return
    if _in_a_collector_callback(frame) and _watches:
        _watches[-1].take_again(signum)
        return
    _raised.append(signum)
    raise Interrupted(signum)


def _in_a_collector_callback(frame: types.FrameType | None) -> bool:
    """Whether `frame` runs inside one of the garbage collector's callbacks."""
    codes = set()
    for callback in gc.callbacks:
        function = callback.__func__ if isinstance(callback, types.MethodType) else callback
        if isinstance(function, types.FunctionType):
            codes.add(function.__code__)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _dropping_swallowed_interrupts(
    previous: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    """An unraisable hook that drops an `Interrupted` (already recorded: `check()` raises it where
    the run moves on) and hands everything else to `previous`."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            return
        previous(unraisable)

    return hook


class _SignalWatch:
    """A thread reading the pipe the signals' C handler writes each signal's number into, at once,
    whatever the main thread is doing: it ends the process at the second SIGINT or SIGTERM, and
    hands the main thread a signal its handler put off (`take_again`).

    A signal put off is taken again from this thread, a moment later, not from the handler:
    `interrupt_main` there would run the handler again as soon as it returned, inside the same
    callback, nested in itself. Taking it again writes its number into the pipe as a signal does:
    an echo, not counted.
    """

    _TAKE_AGAIN = 0x80  # a byte of the handler's own: 0x80 + the signal; a signal's is below 65
    _TAKE_AGAIN_AFTER_S = 0.01  # the handler has long returned; a collector's callback most likely

    def __init__(self, prog: str):
        self._prog = prog
        self._echoes: list[int] = []
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd's requirement: a full pipe never blocks
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="signal-watch", daemon=True)
        self._thread.start()

    def take_again(self, signum: int) -> None:
        """Called by the handler: the main thread takes `signum` again at its next instruction."""
        with contextlib.suppress(BlockingIOError):  # a full pipe: the run's next check() raises
            os.write(self._write, bytes([self._TAKE_AGAIN + signum]))

    def _watch(self) -> None:
        seen = 0
        while chunk := os.read(self._read, 64):
            for byte in chunk:
                if byte > self._TAKE_AGAIN:
                    time.sleep(self._TAKE_AGAIN_AFTER_S)
                    self._echoes.append(byte - self._TAKE_AGAIN)
                    _thread.interrupt_main(byte - self._TAKE_AGAIN)
                elif byte in self._echoes:
                    self._echoes.remove(byte)
                elif byte in HANDLED:
                    seen += 1
                    if seen >= 2:
                        _end_now(self._prog, byte)

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write)  # the reader sees the end of the pipe and returns
        self._thread.join()
        os.close(self._read)


_watches: list[_SignalWatch] = []  # the innermost `handled` block's last


def _end_now(prog: str, signum: int) -> None:
    """The second signal: one line, and the process ends here, its cleanup left where it was."""
    word = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    line = f"{prog + ': ' if prog else ''}{word} again: stopped at once\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode())
    os._exit(128 + signum)


@contextlib.contextmanager
def handled(prog: str = "") -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` (and are remembered) inside the block; an interrupt
    swallowed by a library callback is not printed; a second signal ends the process at once,
    saying so as `prog`.

    Signal handlers can only be set from the main thread; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _record_and_raise) for signum in HANDLED}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _dropping_swallowed_interrupts(previous_hook)
    _watches.append(_SignalWatch(prog))
    _pending.clear()
    _ended_by.clear()
    _raised.clear()
    try:
        yield
    finally:
        _watches.pop().close()
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()


def pending() -> Interrupted | None:
    """The interrupt that arrived and has not been dealt with yet, if any."""
    return Interrupted(_pending[0]) if _pending else None


def check() -> None:
    """Raise the interrupt that arrived earlier but was swallowed before it could stop the run."""
    interrupt = pending()
    if interrupt is not None:
        raise interrupt
