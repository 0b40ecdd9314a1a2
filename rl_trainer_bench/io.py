"""Write a file so that readers see the old content or the new, never a partial one.

A failed render or an interrupted write must not leave a half-written manifest that someone
later applies; writing a temporary file in the same folder and renaming it over the target is
atomic on POSIX file systems.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from rl_trainer_bench.errors import UserError


def write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename; on any error the target is left as it was."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def read_user_bytes(path: str | Path, field: str) -> bytes:
    """The bytes of a file the user named under `field`; a one-line `UserError` when unreadable.

    A missing file, a folder or an unreadable file gets the reason and the fix, never a traceback.
    """
    try:
        return Path(path).read_bytes()
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        reason = getattr(error, "strerror", None) or str(error)
        raise UserError(
            f"{field} {path!r}: cannot read it ({reason}); pass an existing file"
        ) from None


def read_user_text(path: str | Path, field: str) -> str:
    """The UTF-8 text of a file the user named under `field`; one-line `UserError` otherwise.

    Bytes that are not UTF-8 text (a binary or gzipped file passed by mistake) are refused too.
    """
    data = read_user_bytes(path, field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        kind = "gzip data" if data[:2] == b"\x1f\x8b" else "not UTF-8 text"
        raise UserError(
            f"{field} {path}: {kind} (byte {error.start}); pass a plain text file"
        ) from None
