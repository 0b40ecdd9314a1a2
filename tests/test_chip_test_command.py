"""README's command for the chip tests runs where pytest-xdist is not installed (a TPU host's
python often lacks it): pytest's own options in pyproject name no xdist option, which pytest
would refuse without the plugin ("unrecognized arguments: --dist")."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHIP_TEST_FILES

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


def test_every_chip_test_sits_in_a_file_the_chip_command_collects(request):
    """Under `-m tpu_chip` the session collects only the chip test files (conftest.py): a chip test
    anywhere else would be left out of README's chip command without a word."""
    chip_tests = [
        item.nodeid for item in request.session.items if item.get_closest_marker("tpu_chip")
    ]
    if not chip_tests:
        pytest.skip("this session collected no chip test: run it with the suite")
    outside = [node for node in chip_tests if not Path(node.split("::")[0]).match(CHIP_TEST_FILES)]
    assert not outside, f"chip tests outside {CHIP_TEST_FILES} files: {outside}"
