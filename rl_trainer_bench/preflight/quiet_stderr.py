"""Keep libtpu's start-up noise off the user's screen, and every other line on it.

On a host without a TPU, building a slice's topology makes libtpu's C++ logging write warnings to
file descriptor 2 (it cannot find the accelerator type or the worker hostnames, then logs an
`E0000 ... INVALID_ARGUMENT` about the hostname it was given) on every run. They say nothing about
the cell and read like failures, so `aot` and `hlo-overlap` drop them. Python's `sys.stderr` cannot
catch them: they bypass it. So file descriptor 2 is pointed at a pipe read by a separate filter
process that writes every other line to the real stderr as it arrives. Being a separate process, it
keeps forwarding what is still in the pipe when this process aborts, so a fatal error from the same
library still reaches the user.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

# Lines libtpu writes on every start on a host without a TPU (libtpu 0.0.42).
NOISE = (
    re.compile(r"could not determine TPU accelerator type"),
    re.compile(r"could not determine TPU worker hostnames"),
    re.compile(r"unexpected worker hostname .* TPU_WORKER_HOSTNAMES"),
    re.compile(r"^WARNING: Logging before InitGoogle\(\) is written to STDERR$"),
)
# What follows a dropped line as part of the same message: its source-location trace.
_TRACE = re.compile(r"^=== Source Location Trace: ===\s*$|^\S+\.(cc|h):\d+\s*$")


def without_noise(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The lines that are not libtpu start-up noise (nor the trace printed under a noise line)."""
    in_dropped_message = False
    for line in lines:
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if any(pattern.search(text) for pattern in NOISE):
            in_dropped_message = True
            continue
        if in_dropped_message and _TRACE.match(text):
            continue
        in_dropped_message = False
        yield line


def filter_stream(source: BinaryIO, sink: BinaryIO) -> None:
    """Copy `source` to `sink` line by line without the noise, flushing each line (bytes pass
    through unchanged, whatever their encoding)."""
    for line in without_noise(source):
        sink.write(line)
        sink.flush()


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """File descriptor 2 through the noise filter for the duration of the block.

    Python's own writes to `sys.stderr` (progress lines) take the same path, so their order with
    the library's lines is kept.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; from {__name__} import filter_stream; "
                "filter_stream(sys.stdin.buffer, sys.stdout.buffer)",
            ],
            stdin=read_end,
            stdout=saved,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    except OSError:  # no filter process: show everything rather than lose anything
        os.close(read_end)
        os.close(write_end)
        os.close(saved)
        yield
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the last write end: the filter reads to the end and exits
        os.close(saved)
        child.wait()
