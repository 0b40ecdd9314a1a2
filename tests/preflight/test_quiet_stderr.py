"""libtpu's start-up noise is dropped at file descriptor 2; every other line still shows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rl_trainer_bench.preflight.quiet_stderr import without_noise

# As libtpu 0.0.42 writes them on a host without a TPU (one run of `aot --target v5e:2x2`).
NOISE = [
    "Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
    "accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so "
    "may not properly initialize.",
    "WARNING: Logging before InitGoogle() is written to STDERR",
    "E0000 00:00:1796112359.448605   12609 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected "
    "worker hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env "
    "var TPU_WORKER_HOSTNAMES. Expecting a valid hostname or IP address without port number.",
    "=== Source Location Trace: === ",
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327",
]
REAL = [
    "E0000 00:00:1796112360.000000   12609 tpu_compiler.cc:99] INTERNAL: compile failed",
    "=== Source Location Trace: === ",
    "learning/45eac/tfrc/compiler/tpu_compiler.cc:99",
    "aot: fwd_bwd at 60 layers compiled in 201.3 s",
]


def _lines(lines: list[str]) -> list[bytes]:
    return [(line + "\n").encode() for line in lines]


def test_noise_goes_and_real_errors_stay_with_their_trace():
    assert list(without_noise(_lines(NOISE + REAL + NOISE))) == _lines(REAL)


def _run_with_filter(body: str) -> subprocess.CompletedProcess:
    """A child process that enters the filter, writes to fd 2 as C++ logging does, then `body`."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu
        with quiet_libtpu():
            os.write(2, {"".join(line + chr(10) for line in NOISE + REAL).encode()!r})
            print("python line", file=sys.stderr)
            {body}
        """
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=environment, timeout=60
    )


@pytest.mark.parametrize("ending", ["pass", "os.abort()"])
def test_fd_2_is_filtered_and_nothing_real_is_lost_even_on_abort(ending):
    """The filter is its own process: what libtpu wrote just before an abort still arrives."""
    result = _run_with_filter(ending)
    shown = result.stderr.decode().splitlines()
    assert shown == [*REAL, "python line"]
    assert (result.returncode == 0) == (ending == "pass")


# The dropless program (compiled for replays) left out: one compile fewer, the same start-up
NO_DROPLESS = ["--engine-flags", "retry_when_tokens_dropped=false"]


@pytest.mark.tpu_aot
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "own_line"),
    [
        (["aot"], "aot: fwd_bwd at 2 layers"),
        (["hlo-overlap", "--summary-only"], None),
    ],
)
def test_tpu_slice_commands_show_no_start_up_noise(command, own_line):
    pytest.importorskip("libtpu")
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "JAX_PLATFORMS": "cpu",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_trainer_bench.cli",
            *command,
            "--target",
            "v5e:2x2",
            *NO_DROPLESS,
        ],
        capture_output=True,
        env=environment,
        timeout=900,
    )
    errors = result.stderr.decode()
    assert result.returncode == 0, errors
    for fragment in ("TPU_WORKER_HOSTNAMES", "accelerator type", "INVALID_ARGUMENT", "InitGoogle"):
        assert fragment not in errors
    if own_line:
        assert own_line in errors  # the tool's own lines still show
