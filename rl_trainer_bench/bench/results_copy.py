"""Results that survive the pod: RESULTS_DIR copied to RESULTS_URI as the run goes, and when it ends.

A pod's own disk goes with the pod, so a run's files must end up where the trainer's outputs go
(its bucket, or a mounted volume). The files are written to RESULTS_DIR during the run, each step
synced as it ends (`results_file.py`). A copy only when the run ends would lose them all to a
preemption: a pod gets SIGKILL a grace period after SIGTERM (30 s unless the pod says otherwise),
while a step of the 397B cell takes about 100 s and the process cannot act on SIGTERM until the
device returns. So a separate process (`copying`) copies every file that changed, a few seconds
after it changed, for as long as the run lasts: a step that ended is kept whatever happens to
the step after it. It is a process and not a thread because the timed process's own work
(its GIL, its dispatch of the next step) must not share anything with an upload; it shares only
the host's CPUs, and sleeps between looks. When the run ends, however it ends, the copier stops
and every file is copied once more, so the copy is complete.

Writing to `gs://` needs something that speaks to Cloud Storage, and the bench ships none: the
copy uses the first that the trainer's image has, in the order of `GCS_TOOLS`, and the log names
it, or says plainly that the files stayed behind. Nothing here imports JAX.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rl_trainer_bench.config.knobs import GCS_PREFIX

GCS_TOOLS = ("gcsfs", "tensorflow.io.gfile", "gcloud storage", "gsutil")
# How often the copier looks for files that changed (seconds): a few seconds after a step ends.
FOLLOW_SECONDS = 5.0
# How long the run waits for the copier to stop before it ends it.
_STOP_SECONDS = 10.0

Log = Callable[[str], None]


def destination(uri: str, now: datetime.datetime | None = None) -> str:
    """Where one run's files go: a folder named after the UTC time the run's copying began
    under `uri`, so runs of one bench never overwrite each other."""
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
        else "(a local folder: it outlives the pod only on a mounted durable volume, which the"
        " render checks)"
    )
    return (
        f"{folder} during the run, each file copied to {uri}/<UTC time>/ by a separate process"
        f" within {FOLLOW_SECONDS:g} s of changing (so a step that ended is kept if the pod is"
        f" preempted later), and every file again when the run ends, {how}; {logged}"
    )


@contextlib.contextmanager
def copying(
    folder: Path, uri: str | None, log: Log, interval: float = FOLLOW_SECONDS
) -> Iterator[None]:
    """Copy `folder` to a fresh folder under `uri` as the run inside the block goes, and all of
    it when the block ends, however it ends (nothing without a `uri`)."""
    if not uri:
        yield
        return
    target = destination(uri)
    copier = _start_copier(folder, target, interval)
    log(
        f"results: copying {folder} to {target} as the run goes (pid {copier.pid}, a look every"
        f" {interval:g} s) and when it ends"
    )
    try:
        yield
    finally:
        _stop(copier)
        if folder.is_dir():
            copy_results(folder, uri, log, target)


def _start_copier(folder: Path, target: str, interval: float) -> subprocess.Popen:
    """The copier process: this module's `main`, on this interpreter and this code."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(folder), target, str(interval), str(os.getpid())],
        env=environment,
        stdin=subprocess.DEVNULL,
    )


def _stop(copier: subprocess.Popen) -> None:
    copier.terminate()
    try:
        copier.wait(_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        copier.kill()
        copier.wait()


def copy_results(folder: Path, uri: str, log: Log, target: str | None = None) -> bool:
    """Copy every file under `folder` to `target` (default: a fresh folder under `uri`); True
    when copied. A failure is logged, never raised: the run's measurements are in its log."""
    files = _files(folder)
    target = target or destination(uri)
    copied, message = _copy(folder, files, target)
    log(message)
    return copied


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file())


def _copy(folder: Path, files: list[Path], target: str) -> tuple[bool, str]:
    """Copy `files` (under `folder`) to the same places under `target`: (copied, the log line)."""
    if not target.startswith(GCS_PREFIX):
        try:
            for path in files:
                remote = Path(target) / path.relative_to(folder)
                remote.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, remote)
        except OSError as error:  # full, read-only or missing volume: the run's exit code stands
            return False, f"results: NOT copied to {target} ({error}); the files stay in {folder}"
        return True, f"results: copied {len(files)} files to {target}"
    failures = []
    for tool in GCS_TOOLS:
        try:
            if _COPIERS[tool](folder, files, target):
                return True, f"results: copied {len(files)} files to {target} with {tool}"
        except Exception as error:  # a tool that exists but fails: say so, try the next
            failures.append(f"{tool} could not ({type(error).__name__}: {error})")
    tried = "; ".join(failures) or f"the image has none of {', '.join(GCS_TOOLS)}"
    return False, (
        f"results: NOT copied to {target}: {tried}; the files stay in {folder} and go with the"
        " pod (the log's step lines remain)"
    )


def follow(folder: Path, target: str, interval: float, parent: int, log: Log) -> None:
    """The copier's loop: every `interval` seconds, copy the files of `folder` that changed
    since they were last copied, until the run's process (`parent`) is gone or this process is
    told to stop. A failure is logged once per distinct message and retried at the next look."""
    copied: dict[Path, tuple[int, int]] = {}
    said: set[str] = set()
    while os.getppid() == parent:
        stamps = {path: _stamp(path) for path in _files(folder)} if folder.is_dir() else {}
        changed = [path for path, stamp in stamps.items() if copied.get(path) != stamp]
        if changed:
            ok, message = _copy(folder, changed, target)
            if ok:
                copied.update((path, stamps[path]) for path in changed)
            elif message not in said:
                said.add(message)
                log(message)
        time.sleep(interval)


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


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


def main(argv: list[str]) -> int:
    """The copier process: `FOLDER TARGET INTERVAL PARENT_PID`; SIGTERM ends it (the run then
    copies every file itself)."""
    folder, target, interval, parent = argv
    with contextlib.suppress(KeyboardInterrupt):
        follow(Path(folder), target, float(interval), int(parent), lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
