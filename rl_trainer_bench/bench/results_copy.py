"""Results that survive the pod: RESULTS_DIR copied to RESULTS_URI when the run ends.

A pod's own disk goes with the pod, so a run's files must end up where the trainer's outputs go
(its bucket, or a mounted volume). The files are written to RESULTS_DIR during the run, each step
synced as it ends, and copied once, after the last step: an upload inside the step loop would sit
in the very boundaries the bench times. The step lines in the log carry every step meanwhile.
Writing to `gs://` needs something that speaks to Cloud Storage, and the bench ships none: the
copy uses the first that the trainer's image has, in the order of `GCS_TOOLS`, and the log names
it, or says plainly that the files stayed behind. Nothing here imports JAX.
"""

from __future__ import annotations

import datetime
import importlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from rl_trainer_bench.config.knobs import GCS_PREFIX

GCS_TOOLS = ("gcsfs", "tensorflow.io.gfile", "gcloud storage", "gsutil")


def destination(uri: str, now: datetime.datetime | None = None) -> str:
    """Where one run's files go: a folder named after the copy's UTC time under `uri`, so runs
    of one bench never overwrite each other."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{uri.rstrip('/')}/{stamp}"


def describe(folder: Path, uri: str | None) -> str:
    """The plan's line on where the results will be."""
    logged = "every step's line is in the log as it ends"
    if not uri:
        return (
            f"{folder} on the pod's disk, lost with the pod unless that is a mounted volume: set"
            f" RESULTS_URI to a gs:// folder or a mounted volume; {logged}"
        )
    how = (
        f"with the first of {', '.join(GCS_TOOLS)} that the pod's image has (the log names it,"
        " or says that none was found)"
        if uri.startswith(GCS_PREFIX)
        else "(a folder on a mounted volume)"
    )
    return f"{folder} during the run, copied when it ends to {uri}/<UTC time>/ {how}; {logged}"


def copy_when_asked(folder: Path, uri: str | None, log: Callable[[str], None]) -> None:
    """`folder` copied to `uri`, when the run has a RESULTS_URI and wrote anything."""
    if uri and folder.is_dir():
        copy_results(folder, uri, log)


def copy_results(folder: Path, uri: str, log: Callable[[str], None]) -> bool:
    """Copy every file under `folder` to a fresh folder under `uri`; True when copied. A failure
    is logged, never raised: the run's measurements are in its log either way."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    target = destination(uri)
    if not uri.startswith(GCS_PREFIX):
        try:
            shutil.copytree(folder, target, dirs_exist_ok=True)
        except OSError as error:  # full, read-only or missing volume: the run's exit code stands
            log(f"results: NOT copied to {target} ({error}); the files stay in {folder}")
            return False
        log(f"results: copied {len(files)} files to {target}")
        return True
    for tool in GCS_TOOLS:
        try:
            if _COPIERS[tool](folder, files, target):
                log(f"results: copied {len(files)} files to {target} with {tool}")
                return True
        except Exception as error:  # a tool that exists but fails: say so, try the next
            log(f"results: {tool} could not copy to {target} ({type(error).__name__}: {error})")
    log(
        f"results: NOT copied to {target}: the image has none of {', '.join(GCS_TOOLS)}; the"
        f" files stay in {folder} and go with the pod (the log's step lines remain)"
    )
    return False


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _with_gcsfs(folder: Path, files: list[Path], target: str) -> bool:
    gcsfs = _module("gcsfs")
    if gcsfs is None:
        return False
    filesystem = gcsfs.GCSFileSystem()
    for path in files:
        filesystem.put_file(str(path), f"{target}/{path.relative_to(folder).as_posix()}")
    return True


def _with_tensorflow(folder: Path, files: list[Path], target: str) -> bool:
    gfile = _module("tensorflow.io.gfile")
    if gfile is None:
        return False
    for path in files:
        remote = f"{target}/{path.relative_to(folder).as_posix()}"
        gfile.makedirs(remote.rsplit("/", 1)[0])
        gfile.copy(str(path), remote, overwrite=True)
    return True


def _with_command(command: list[str]) -> Callable[[Path, list[Path], str], bool]:
    def copy(folder: Path, files: list[Path], target: str) -> bool:
        if shutil.which(command[0]) is None:
            return False
        subprocess.run([*command, str(folder), target], check=True, capture_output=True)
        return True

    return copy


_COPIERS = {
    "gcsfs": _with_gcsfs,
    "tensorflow.io.gfile": _with_tensorflow,
    "gcloud storage": _with_command(["gcloud", "storage", "rsync", "--recursive"]),
    "gsutil": _with_command(["gsutil", "-m", "rsync", "-r"]),
}
