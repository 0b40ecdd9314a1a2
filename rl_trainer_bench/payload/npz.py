"""Micro-batch files: a payload as `.npz` with its digests, written atomically, read back checked."""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib

import numpy as np

from rl_trainer_bench.engine.contract import OPTIONAL_PAYLOAD_FIELDS, PAYLOAD_FIELDS, Payload
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import write_atomically
from rl_trainer_bench.payload.digests import digest_mismatches, with_digests


def check_out_folder(path: str) -> str:
    """The folder `path` will be written in; UserError when it does not exist (checked before work)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--out {path}: folder {folder} does not exist; create it first")
    return folder


def save_npz(payload: Payload, path: str) -> None:
    """Write every array under its contract name, plus `name` and `digests`, atomically."""
    check_out_folder(path)
    write_atomically(
        path,
        lambda out: np.savez(
            out,
            **payload.arrays(),
            name=np.array(payload.name),
            digests=np.array([f"{k}={v}" for k, v in sorted(payload.digests.items())]),
        ),
    )


def load_npz(path: str, *, verify: bool = True) -> Payload:
    """A Payload from `save_npz`'s file, carrying the digests stored in it.

    With `verify`, every stored digest must match its array's content (UserError otherwise), so
    the payload's digests are true. Without it the stored digests are kept as they are, possibly
    stale, for `check` to report (`digest_mismatches`): recomputing them first would hide a change.
    A file without digests (from elsewhere) gets them computed. A file that is not a readable
    `.npz`, lacks a required array, or carries digests not written as `name=hex` is a UserError.
    """
    contents = _read_npz(path)
    required = [f for f in PAYLOAD_FIELDS if f not in OPTIONAL_PAYLOAD_FIELDS]
    missing = [f for f in required if f not in contents]
    if missing:
        raise UserError(
            f"micro-batch file {path}: no array {', '.join(missing)}; a payload holds "
            f"{', '.join(required)} (see `rl-trainer-bench payload`)"
        )
    arrays = {k: v for k, v in contents.items() if k in PAYLOAD_FIELDS}
    stored = _stored_digests(contents.get("digests"), path)
    name = contents.get("name")
    name = str(name) if name is not None and name.ndim == 0 else os.path.basename(path)
    payload = Payload(**arrays, name=name)
    if not stored:
        return with_digests(payload)
    payload = dataclasses.replace(payload, digests=stored)
    if verify:
        stale = digest_mismatches(payload)
        if stale:
            raise UserError(
                f"micro-batch file {path}: {'; '.join(stale)}: the file was modified or corrupted"
            )
    return payload


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """Every array of an .npz archive; UserError for anything that is not a whole, plain one."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise UserError(
                f"micro-batch file {path}: a single .npy array; pass the .npz that `payload` writes"
            )
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        if isinstance(error, UserError):
            raise
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(
            f"micro-batch file {path}: not a readable .npz ({reason}); pass the file `payload` wrote"
        ) from None


def _stored_digests(entries: np.ndarray | None, path: str) -> dict[str, str]:
    """The `digests` entry of a payload file as {array: hex}; {} when the file has none."""
    if entries is None or (entries.ndim == 1 and entries.size == 0):
        return {}
    malformed = UserError(
        f"micro-batch file {path}: malformed digests (expected a list of 'array=hex' strings); "
        "rebuild the file with `rl-trainer-bench payload`"
    )
    if entries.ndim != 1 or entries.dtype.kind != "U":
        raise malformed
    digests = {}
    for entry in entries.tolist():
        name, sep, digest = entry.partition("=")
        if not sep or name not in PAYLOAD_FIELDS or name in digests or not _is_hex(digest):
            raise malformed
        digests[name] = digest
    return digests


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)
