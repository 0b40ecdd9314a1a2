"""Write a file so that readers see the old content or the new, never a partial one; and refuse an
output folder that cannot be written before any work is spent on what would go in it.

A failed render or an interrupted write must not leave a half-written manifest, report or payload
that someone later reads; writing a temporary file in the same folder and renaming it over the
target is atomic on POSIX file systems. Every file the package writes whole goes through here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from rl_trainer_bench.errors import UserError


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Run `write` on a temporary file beside `path`, then rename it over `path`.

    On any error (an interrupt included) the temporary file is removed and the target is left as
    it was. The file gets the permissions a plain `open` would give it (0666 less the umask).
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
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


def write_text_atomically(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) in one rename; on any error the target is left as it was."""
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def check_writable_folder(folder: Path, name: str) -> None:
    """UserError, in one line, when files cannot be written in `folder` or in the folder that
    creating it would make: `folder` is a file, lies under a file, or is not writable.

    `name` is the knob or flag the folder came from, for the message. Nothing is created: a run
    refused later leaves no trace, and the caller creates the folder when it first writes there.
    A permission check alone would pass for root on a read-only mount, so the nearest existing
    folder is proven writable by creating (and removing) a file in it.
    """
    folder = Path(folder)
    for parent in (folder, *folder.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == folder else f"lies under the file {parent}"
            raise UserError(f"{name}={folder}: {where}; name a folder")
    existing = next(parent for parent in (folder, *folder.parents) if parent.exists())
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".write-probe."):
            pass
    except OSError as error:
        raise UserError(
            f"{name}={folder}: cannot write in {existing} ({error.strerror}); name a writable folder"
        ) from None
