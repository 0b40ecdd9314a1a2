"""The bench pod's client script: unpack the embedded bench code and run its driver under PID-1 care.

It keeps the launcher's PID-1 wrapper behaviour (SIGTERM forwarded to the workload, a polling loop
so bash runs the trap promptly, core dumps off, start/end lines and the workload's exit code), and
replaces the trainer's python line with the bench driver. Every value the driver receives is
exported through `shell_quote`, so spaces, quotes, `$()` and backticks arrive literally and nothing
the user typed is evaluated by the shell; a value holding a NUL byte, which no script or
environment can carry, is refused naming its variable (`shell_writable`). Variable names need no
quoting: each is a knob's, or an identifier the renderer's readers accepted (`DRIVER_ENV`'s names,
the trainer script's `NAME=value` words). The code travels base64-encoded as the script's
positional arguments (`code_bundle.bundle_parts`: one argument cannot hold it), which the shell
passes on without expanding, and the trainer's interpreter unpacks it.
"""

from __future__ import annotations

from collections.abc import Mapping

from rl_trainer_bench.bench.plan_document import CODE_DIR_VARIABLE
from rl_trainer_bench.config.values import shell_quote, shell_writable

# `$0` of the script: what `ps` and the shell's own messages call it.
SCRIPT_NAME = "rl-trainer-bench-pod"
DRIVER_MODULE = "rl_trainer_bench.bench.entry"
# With AB_ARMS the pod runs a same-pod A/B instead of one bench run (`ab/same_pod.py`).
AB_ARMS = "AB_ARMS"
SAME_POD_AB_MODULE = "rl_trainer_bench.ab.same_pod"
# Unpacks the base64 tar.xz on stdin (lines; b64decode skips the newlines) into the folder argv[1]
# with nothing but Python's standard library (`code_bundle.bundle`); the data filter where the
# Python has one (3.12, and 3.8-3.11 patch releases from 2023).
UNPACK = (
    "import base64, io, sys, tarfile; "
    "archive = tarfile.open(fileobj=io.BytesIO(base64.b64decode(sys.stdin.buffer.read())), mode='r:xz'); "
    "archive.extractall(sys.argv[1], **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))"
)


def bench_script(
    *,
    interpreter: str,
    environment: Mapping[str, str],
    has_driver_script: bool,
    trainer_jobset: str,
    entry_module: str | None = None,
) -> str:
    """The `bash -c` script of the bench's client container; its positional arguments are the
    code's base64 parts (`code_bundle.bundle_parts`). `entry_module` runs instead of the driver
    (the AOT job's pod, `launch/aot_job.py`)."""
    shell_writable("the trainer's interpreter", interpreter)
    exports = "\n".join(
        f"export {name}={shell_quote(shell_writable(name, value))}"
        for name, value in environment.items()
    )
    driver = (
        f'"${CODE_DIR_VARIABLE}/bench_driver.py"' if has_driver_script else f"-m {DRIVER_MODULE}"
    )
    if AB_ARMS in environment:
        driver = f"-m {SAME_POD_AB_MODULE}"
    if entry_module is not None:
        driver = f"-m {entry_module}"
    runs = entry_module or "bench driver"
    return f"""\
# rl-trainer-bench: the trainer of JobSet {trainer_jobset} replaced by the embedded {runs},
# with the trainer's environment and flags (TRAINER_ARGV) and the bench knobs as environment.
# PID 1 wrapper: forwards SIGTERM to the bench so the grace period ends it cleanly; the polling
# sleep keeps bash awake to run the trap.
echo "Program Start: $(date)"
_sigterm() (kill -SIGTERM $! 2>/dev/null)
trap _sigterm SIGTERM
ulimit -c 0

(
set -eu
export {CODE_DIR_VARIABLE}="$(mktemp -d)"
printf '%s\n' "$@" | {shell_quote(interpreter)} -c {shell_quote(UNPACK)} "${CODE_DIR_VARIABLE}"
export PYTHONPATH="${CODE_DIR_VARIABLE}${{PYTHONPATH:+:$PYTHONPATH}}"
{exports}
exec {shell_quote(interpreter)} {driver}
) & PID=$!

while kill -0 $PID 2>/dev/null; do
  sleep 1
done
wait $PID
EXIT_CODE=$?

echo "Program End: $(date)"
echo "EXIT_CODE=$EXIT_CODE"
exit $EXIT_CODE
"""
