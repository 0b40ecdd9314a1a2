"""Write a file so that readers see the old content or the new, never a partial one; and refuse an
output folder that cannot be written before any work is spent on what would go in it.

A failed render or an interrupted write must not leave a half-written manifest, report or payload
that someone later reads; writing a temporary file in the same folder and renaming it over the
target is atomic on POSIX file systems. Every file the package writes whole goes through here.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from rl_trainer_bench.errors import STORAGE_ERRNOS, UserError


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Run `write` on a temporary file beside `path`, then rename it over `path`.

    On any error (an interrupt included) the temporary file is removed and the target is left as
    it was. The file gets the permissions a plain `open` would give it (0666 less the umask). A
    target that is not a regular file (a device node, a pipe) is never replaced, and a failed
    write (a full disk, a quota) is the user's one line naming the path, not a traceback.
    """
    path = Path(path)
    refuse_special_file(path, "output file")
    try:
        descriptor, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
    except OSError as error:
        raise _write_error(path, error) from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            raise _write_error(path, error) from None
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) in one rename; on any error the target is left as it was."""
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def _write_error(path: Path, error: OSError) -> UserError:
    return UserError(
        f"cannot write {path} ({error.strerror or error}): free space there or write elsewhere;"
        " nothing was written"
    )


def refuse_special_file(path: Path, name: str) -> None:
    """UserError when `path` exists and is not a regular file: a device node (`/dev/full`), a
    pipe or a socket would be replaced by a regular file, or written into, neither of which the
    user meant. A symbolic link counts as what it points to."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as error:
        raise UserError(f"{name}: cannot use it ({error.strerror}); name another file") from None
    except ValueError:  # no file system path holds a NUL byte
        raise UserError(f"{name}: {str(path)!r} holds a NUL byte; name another file") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{name}: {path} is a folder; name a file in it")
    if not stat.S_ISREG(mode):
        raise UserError(
            f"{name}: {path} is {_kind(mode)}, not a regular file; name a new or regular file"
        )


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "a special file"


def check_output_file(path: str | Path, name: str) -> Path:
    """`path` as a file a command may write, checked before any work: a new path or a regular
    file, in an existing folder this process can write in. UserError naming `name` otherwise
    (an empty name too: an unset shell variable, which would otherwise write nothing)."""
    if not str(path).strip():
        raise UserError(f"{name}: empty; name the file to write")
    path = Path(path)
    refuse_special_file(path, f"{name}={path}")
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"{name}={path}: the folder {folder} does not exist; create it first")
    check_writable_folder(folder, name)
    return path


def move_earlier_run_aside(folder: Path, patterns: Sequence[str]) -> Path | None:
    """Move an earlier run's files in `folder` (those matching the glob `patterns`) into a new
    subfolder `earlier-YYYYmmdd-HHMMSS` (the newest one's modification time), and return it;
    None when there were none. A later run never mixes its files with an earlier one's or
    replaces them: the caller moves them before it writes its own first file."""
    earlier = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    if not earlier:
        return None
    newest = max(p.stat().st_mtime for p in earlier)
    stamp = datetime.datetime.fromtimestamp(newest).strftime("%Y%m%d-%H%M%S")
    aside, suffix = folder / f"earlier-{stamp}", 1
    while aside.exists():
        suffix += 1
        aside = folder / f"earlier-{stamp}-{suffix}"
    aside.mkdir()
    for path in earlier:
        os.replace(path, aside / path.name)
    return aside


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
