"""MEASURE_PEAK on a TPU chip: the one-chip preset's step, bisected beside fillers, gives a bracket
of the resolution's width inside the chip's limit, beside aot's sum for the same programs.

The test session keeps JAX on the host CPU, so the run is a subprocess with the chip's platform;
on a host without a TPU chip it is skipped. Run it alone (one process can hold the chip):
    python -m pytest -q -m tpu_chip tests/bench/test_device_peak_on_chip.py
"""

import json
import os
import subprocess
import sys

import pytest

from rl_trainer_bench.bench.device_peak import RESOLUTION
from rl_trainer_bench.chips import local_chips
from rl_trainer_bench.config.presets import one_chip_preset

pytestmark = [
    pytest.mark.tpu_chip,
    pytest.mark.skipif(
        one_chip_preset(local_chips.local_tpu()) is None,
        reason="needs one TPU chip of a kind with a one-chip preset, openable by this process",
    ),
]


def test_the_one_chip_preset_measures_its_step_peak_on_the_chip(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["RESULTS_DIR"] = str(tmp_path / "results")
    # The preset's buffers drop no pair of its micro-batches (presets.py): the dropless program
    # never runs in its steps, and left out it is neither compiled for the run nor again for
    # aot's figures (two of the test's six compiles)
    env["ENGINE_FLAGS"] = "retry_when_tokens_dropped=false"
    command = ["run", "--steps", "1", "--warmup-steps", "1", "--measure-peak", "on"]
    done = subprocess.run(
        [sys.executable, "-m", "rl_trainer_bench.cli", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "device peak of one step, MEASURED" in done.stdout
    peak = json.loads((tmp_path / "results" / "device_peak.json").read_text())
    measured = peak["measured"]
    assert measured["stopped"] is None
    assert measured["peak_more_than"] is not None  # the chip's limit bounds every step
    assert measured["in_use_before"] <= measured["peak_more_than"] < measured["peak_at_most"]
    assert measured["peak_at_most"] - measured["peak_more_than"] <= RESOLUTION
    assert measured["peak_at_most"] <= measured["limit"]
    assert set(peak["aot_model"]) >= {"fwd_bwd", "update"}
    # the memory model's goal: aot's peak of the step's largest program, its temporaries counted
    # as the buffer assignment's HBM block (read on TPU), within 5% of the measured peak
    assert all("temp_block" in program for program in peak["aot_model"].values())
    predicted = max(program["peak"] for program in peak["aot_model"].values())
    measured_peak = (measured["peak_more_than"] + measured["peak_at_most"]) / 2
    assert abs(predicted - measured_peak) <= 0.05 * measured_peak, (predicted, measured_peak)
