"""README's command for the chip tests runs where pytest-xdist is not installed (a TPU host's
python often lacks it): pytest's own options in pyproject name no xdist option, which pytest
would refuse without the plugin ("unrecognized arguments: --dist")."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_readmes_chip_command_collects_the_chip_tests_without_xdist():
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"`python -m pytest ([^`]*-m tpu_chip[^`]*)`", readme)
    argv = [*command.split(), "-p", "no:xdist", "--collect-only"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    collected = done.stdout
    for chip_test in ("test_device_peak_on_chip.py", "test_moe_on_chip.py"):
        assert chip_test in collected
    assert "test_local_chips.py" not in collected  # only the chip's tests
