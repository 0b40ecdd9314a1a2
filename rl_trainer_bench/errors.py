"""Bad user input as one line and exit code 2; everything else as a named bug, never a traceback.

A `UserError` reaches the user as one line on stderr and exit code 2; its message names the field
or knob, the value, and the fix. `run_guarded` is the one boundary every entry point (each CLI
command, and `bench_driver.py` in a pod) runs its body in, so the same input gets the same answer
whichever way it arrives:

- a `UserError` (or another type the caller names as the user's, such as the engine contract's
  `ContractError`): its line, exit 2;
- an `OSError` naming a file (missing, a folder, unreadable, a full disk): the path and the
  reason, exit 2, because a path is input too;
- a closed standard output (`... | head`): nothing more is printed, exit 0, because the reader
  chose to stop reading;
- Ctrl-C: one line, exit 130 (128 + SIGINT, as shells report it);
- anything else is a bug in the bench: one line naming the exception and how to get the
  traceback to report (`RL_TRAINER_BENCH_TRACEBACK=1`), exit 70 (EX_SOFTWARE), so a script can
  tell a bug from a refusal.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

TRACEBACK_VARIABLE = "RL_TRAINER_BENCH_TRACEBACK"
EXIT_USER_ERROR = 2
EXIT_BUG = 70
EXIT_INTERRUPTED = 130


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
    try:
        code = int(body() or 0)
        sys.stdout.flush()
        return code
    except SystemExit as done:  # --help, or argparse's one-line refusal: already printed
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    except BrokenPipeError:  # the reader stopped reading: nothing is wrong with the input
        return 0
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted")
        return EXIT_INTERRUPTED
    except user_errors as error:
        _say(f"{prog}: {error}")
        return EXIT_USER_ERROR
    except OSError as error:
        if error.filename is None:
            return _bug(prog, error)
        _say(f"{prog}: {error.filename}: {error.strerror or error}")
        return EXIT_USER_ERROR
    except Exception as error:  # the boundary: whatever escaped is a bug, reported as one
        return _bug(prog, error)


def _bug(prog: str, error: BaseException) -> int:
    if os.environ.get(TRACEBACK_VARIABLE):
        raise error
    _say(
        f"{prog}: internal error, a bug in rl_trainer_bench: {type(error).__name__}: "
        f"{one_line(str(error))[:300]}; rerun with {TRACEBACK_VARIABLE}=1 and report the "
        "command line and the traceback"
    )
    return EXIT_BUG


def _say(line: str) -> None:
    with contextlib.suppress(BrokenPipeError, ValueError):
        print(one_line(line), file=sys.stderr, flush=True)
