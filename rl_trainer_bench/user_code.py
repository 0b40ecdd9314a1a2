"""Which code is the user's, and how an error raised in it is reported: as theirs, never as a bug.

An engine named by ENGINE (`module:Class`) outside this package is the user's code. When it
raises, at import, in `__init__` or in any contract call, the one error boundary
(`errors.run_guarded`) reports the user's file and line (the innermost frame of the traceback
in the user's package) and exits 2, or with the engine's own code when it called `sys.exit`,
because a bug report against the bench for an error in someone else's engine sends them to the
wrong place. Frames are matched by the module they run in (`__name__`), not by path, so an engine
installed in site-packages is recognised as well as one on PYTHONPATH.

Light on purpose (standard library only): `errors` imports it, and every command imports `errors`.
"""

from __future__ import annotations

import sys
import types

OWN_PACKAGE = "rl_trainer_bench"

_claimed: set[str] = set()  # top-level packages of the engines the user named


def claim(module_name: str) -> None:
    """Mark the package of `module_name` as the user's (never this package or the standard
    library's, which an engine class may inherit from: `builtins.object`, `typing.Protocol`)."""
    package = module_name.partition(".")[0]
    if package and package != OWN_PACKAGE and package not in sys.stdlib_module_names:
        _claimed.add(package)


def _is_claimed(module_name: object) -> bool:
    if not isinstance(module_name, str):
        return False
    return module_name.partition(".")[0] in _claimed


def _innermost_user_frame(
    traceback: types.TracebackType | None,
) -> tuple[str, str, int, str] | None:
    """(module, file, line, function) of the innermost traceback frame in the user's code."""
    found = None
    while traceback is not None:
        frame = traceback.tb_frame
        module = frame.f_globals.get("__name__")
        if _is_claimed(module):
            code = frame.f_code
            found = (str(module), code.co_filename, traceback.tb_lineno, code.co_name)
        traceback = traceback.tb_next
    return found


def _syntax_location(error: BaseException) -> tuple[str, str, int, str] | None:
    """A SyntaxError in a user's file has no frame of its own: its file and line are the error's."""
    if not isinstance(error, SyntaxError) or not error.filename:
        return None
    for package in _claimed:
        if f"/{package}/" in error.filename or error.filename.endswith(f"/{package}.py"):
            return (package, error.filename, error.lineno or 0, "<module>")
    return None


def blame(error: BaseException) -> str | None:
    """One line saying where the user's code raised `error`, or None when it did not."""
    where = _syntax_location(error) or _innermost_user_frame(error.__traceback__)
    if where is None:
        return None
    module, filename, line, function = where
    place = "while it was imported" if function == "<module>" else f"in {function}"
    if isinstance(error, SystemExit):
        what = f"called sys.exit({error.code!r})"
    else:
        detail = " ".join(str(error).split())[:300]
        what = f"raised {type(error).__name__}" + (f": {detail}" if detail else "")
    return (
        f"the engine's code (module {module}) {what} at {filename}:{line} {place}: fix that"
        " engine (not a bug in rl_trainer_bench)"
    )
