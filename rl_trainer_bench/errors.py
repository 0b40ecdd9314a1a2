"""Bad user input as one line and exit code 2; everything else as a named bug, never a traceback.

A `UserError` reaches the user as one line on stderr and exit code 2; its message names the field
or knob, the value, and the fix. `run_guarded` is the one boundary every entry point (each CLI
command, and `bench_driver.py` in a pod) runs its body in, so the same input gets the same answer
whichever way it arrives:

- a `UserError` (or another type the caller names as the user's, such as the engine contract's
  `ContractError`): its line, exit 2;
- an error raised in the code of an engine the user named (`user_code`): its file and line,
  exit 2, or the engine's own code when it called `sys.exit` with a non-zero one;
- an `OSError` naming a file (missing, a folder, unreadable, a full disk): the path and the
  reason, exit 2, because a path is input too; a full disk or a read-only file system without a
  path is the user's machine too, exit 2;
- a third-party package that is not installed (JAX on a render-only install, libtpu without the
  `[tpu]` extra): the package and what installs it, exit 2, because the installation is the
  user's to complete;
- a closed standard output (`... | head`): nothing more is printed, exit 0, because the reader
  chose to stop reading;
- Ctrl-C or SIGTERM (`interrupts`): one line, exit 130 or 143 (128 + the signal, as shells
  report it), also when library code swallowed the interrupt before the command returned, or
  turned it into an error of its own (JAX wraps one raised in a host callback as an XLA runtime
  error); a second signal ends the process at once;
- anything else is a bug in the bench: one line naming the exception and how to get the
  traceback to report (`RL_TRAINER_BENCH_TRACEBACK=1`), exit 70 (EX_SOFTWARE), so a script can
  tell a bug from a refusal.

A program's entry hands that code to `exit_process`, never straight to `sys.exit`: a run that a
signal ended, or that leaves threads of its own behind (a compile still running on a background
thread when a refusal or an interrupt ends the command), ends without Python's shutdown. That
shutdown tears the interpreter down under threads still inside XLA: when one returns for the
GIL, CPython 3.11 and 3.12 end it with `pthread_exit`, whose unwinding through C++ frames aborts
the process ("terminate called after throwing an instance of ''", "FATAL: exception not
rethrown", SIGABRT), and static destructors run under compiles still using them (SIGSEGV).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from rl_trainer_bench import interrupts, user_code
from rl_trainer_bench.engine import background

TRACEBACK_VARIABLE = "RL_TRAINER_BENCH_TRACEBACK"
EXIT_USER_ERROR = 2
EXIT_BUG = 70
EXIT_INTERRUPTED = 130
# Errors of the machine's storage, not of the bench: a full disk, a quota, a read-only mount.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# What installs each third-party package the bench imports (by its import name), for the one line
# that names a missing one; pyproject.toml's dependencies and extras are the source of these.
_BASE_INSTALL = (
    "pip install -e . (the base install: jax, numpy, optax, pyyaml, absl-py, jsonschema)"
)
INSTALLS = {
    **dict.fromkeys(
        ("jax", "jaxlib", "numpy", "optax", "yaml", "absl", "jsonschema"), _BASE_INSTALL
    ),
    "libtpu": "pip install -e '.[tpu]' (jax[tpu] and its libtpu, for TPU targets)",
    "matplotlib": "pip install -e '.[plot]'",
}


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a knob): one line naming the field and the fix."""


class ConfigError(UserError):
    """Invalid configuration; the message is one line naming the knob, the value and the fix."""


def one_line(text: str) -> str:
    """`text` with its line breaks folded, so a message stays one line in a pod's log."""
    return " ".join(str(text).split())


def run_guarded(
    prog: str,
    body: Callable[[], int | None],
    user_errors: tuple[type[BaseException], ...] = (UserError,),
) -> int:
    """Run `body` and turn how it ends into an exit code, printing at most one line on stderr."""
    with interrupts.handled(prog):
        try:
            code = int(body() or 0)
            interrupts.check()
            sys.stdout.flush()
            return code
        except SystemExit as done:  # --help, argparse's one-line refusal, or an engine's exit
            return _system_exit(prog, done)
        except BrokenPipeError:  # the reader stopped reading: nothing is wrong with the input
            return 0
        except KeyboardInterrupt as interrupt:
            return _interrupted(prog, interrupt)
        except ModuleNotFoundError as error:
            return _missing_module(prog, error)
        except user_errors as error:
            _say(f"{prog}: {error}")
            return EXIT_USER_ERROR
        except OSError as error:
            return _os_error(prog, error)
        except Exception as error:  # the boundary: whatever escaped is a bug, reported as one
            if interrupts.pending() is not None:  # unless a signal caused it (below)
                return _interrupted(prog, interrupts.pending())
            return _bug(prog, error)


def _interrupted(prog: str, interrupt: KeyboardInterrupt) -> int:
    _say(f"{prog}: {interrupts.describe(interrupt)}")
    return interrupts.exit_code(interrupt)


def exit_process(code: int) -> NoReturn:
    """End the program with `code`: with Python's shutdown after a run that ended normally and
    left no thread behind; otherwise at once, its output flushed first (the module's docstring
    says why). Only a program's entry calls it: it never returns."""
    if not interrupts.ended_by_signal() and not background.running():
        sys.exit(code)
    for signum in interrupts.HANDLED:  # a late Ctrl-C cannot print a traceback from here on
        signal.signal(signum, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _system_exit(prog: str, done: SystemExit) -> int:
    """A `sys.exit` keeps its code; one in a user's engine is named, and never reads as success."""
    code = done.code if isinstance(done.code, int) else int(done.code is not None)
    blamed = user_code.blame(done)
    if blamed is None:
        return code
    _say(f"{prog}: {blamed}")
    return code or EXIT_USER_ERROR


def _missing_module(prog: str, error: ModuleNotFoundError) -> int:
    """A third-party package that is not installed is the installation's, not a bug: named with
    what installs it. A module of this package that is missing is a bug (a broken install or
    bundle is reported, not explained away); one the user's engine imports is theirs."""
    package = (error.name or "").partition(".")[0]
    if not package or package == user_code.OWN_PACKAGE or user_code.blame(error) is not None:
        return _bug(prog, error)
    install = INSTALLS.get(package, f"install the package that provides {package!r}")
    _say(
        f"{prog}: this command needs the Python package {package!r}, which is not installed in"
        f" this environment ({sys.executable}): {install}"
    )
    return EXIT_USER_ERROR


def _os_error(prog: str, error: OSError) -> int:
    blamed = user_code.blame(error)
    if blamed is not None:
        _say(f"{prog}: {blamed}")
    elif error.filename is not None:
        _say(f"{prog}: {error.filename}: {error.strerror or error}")
    elif error.errno in STORAGE_ERRNOS:
        _say(f"{prog}: {error.strerror}: free space on that disk or write somewhere else")
    else:
        return _bug(prog, error)
    return EXIT_USER_ERROR


def _bug(prog: str, error: BaseException) -> int:
    if os.environ.get(TRACEBACK_VARIABLE):
        raise error
    blamed = user_code.blame(error)
    if blamed is not None:
        _say(f"{prog}: {blamed}; rerun with {TRACEBACK_VARIABLE}=1 for the traceback")
        return EXIT_USER_ERROR
    _say(
        f"{prog}: internal error, a bug in rl_trainer_bench: {type(error).__name__}: "
        f"{one_line(str(error))[:300]}; rerun with {TRACEBACK_VARIABLE}=1 and report the "
        "command line and the traceback"
    )
    return EXIT_BUG


def _say(line: str) -> None:
    with contextlib.suppress(BrokenPipeError, ValueError):
        print(one_line(line), file=sys.stderr, flush=True)
