"""Two processes with 4 CPU devices each (jax.distributed on localhost) train like one with 8.

The pod runs one driver process per host; the mesh spans them. This runs the real driver as
subprocesses, each with its own XLA_FLAGS, and compares the losses each reports with the same
driver on the same knobs in this process, one process of the session's 8 devices (conftest.py),
run while the two compile: a third interpreter would only add its start-up and its compile.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rl_trainer_bench.bench import entry

pytest.importorskip("rl_trainer_bench.engine.builtin.jax_engine")
pytest.importorskip("rl_trainer_bench.payload.build")

REPO = Path(__file__).resolve().parents[2]
# The session's compilation cache (conftest.py): the three drivers compile the same programs.
SHARED_CACHE = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
DEVICE_COUNT = "xla_force_host_platform_device_count"
KNOBS = {
    "PRESET": "cpu-tiny",
    "STEPS": "2",
    "MICRO_STEPS": "2",
    "SEED": "3",
    # No dropless retry: its program, compiled up front, is not what this test compares and was
    # about a third of each driver's compile (7.4 of 17.4 s).
    "ENGINE_FLAGS": "retry_when_tokens_dropped=false",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _session_xla_flags() -> list[str]:
    """The session's compiler flags (conftest.py) but its device count: the drivers compile as
    the in-process tests do, and so share their cache entries."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return [flag for flag in flags if not flag.startswith(f"--{DEVICE_COUNT}=")]


def _driver(results: Path, devices: int, extra: dict[str, str]) -> subprocess.Popen:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        **{k: v for k, v in os.environ.items() if k in SHARED_CACHE},
        "XLA_FLAGS": " ".join([*_session_xla_flags(), f"--{DEVICE_COUNT}={devices}"]),
        "RESULTS_DIR": str(results),
        **KNOBS,
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "rl_trainer_bench.bench.entry"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _losses(results: Path) -> list[float]:
    lines = (results / "results.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_of_eight(tmp_path, capsys):
    address = f"localhost:{_free_port()}"
    workers = [
        _driver(
            tmp_path / f"process{i}",
            4,
            {
                "JAX_COORDINATOR_ADDRESS": address,
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
            },
        )
        for i in range(2)
    ]
    try:
        assert entry.main([], {**KNOBS, "RESULTS_DIR": str(tmp_path / "single")}) == 0
        outputs = [_finish(p) for p in workers]
    finally:
        for worker in workers:
            worker.kill()  # a driver the test gave up on is not left behind
    assert "process 1 of 2" in outputs[1] and "single process" in capsys.readouterr().out
    expected = _losses(tmp_path / "single")
    assert len(expected) == 3
    assert _losses(tmp_path / "process0") == pytest.approx(expected, rel=1e-5)
    assert _losses(tmp_path / "process1") == pytest.approx(expected, rel=1e-5)
