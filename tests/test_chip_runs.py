"""benchmarks/chip/chip_runs.sh's parts agree in its three places: the list a name given is checked
against, the parts `run_part` runs, and the parts its opening describes. A part added to one and
not the others is a part a chip call refuses (the list once lacked two parts `run_part` had, found
only on the chip) or one nobody can read about before spending chip time on it."""

import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "chip" / "chip_runs.sh"


def known_parts(text: str) -> list[str]:
    """The names of the script's `known_parts=( ... )` array."""
    (body,) = re.findall(r"^known_parts=\(([^)]*)\)", text, flags=re.MULTILINE)
    return body.split()


def run_part_arms(text: str) -> set[str]:
    """The names of `run_part`'s case arms (`  name|other)` at two spaces' indent)."""
    body = text[text.index("run_part() {") : text.index("\n}\n", text.index("run_part() {"))]
    arms = re.findall(r"^  ([a-z0-9|-]+)\)", body, flags=re.MULTILINE)
    return {name for arm in arms for name in arm.split("|")}


def described_parts(text: str) -> set[str]:
    """The parts the opening comment describes: `#   name  ~N min ...` lines."""
    return set(re.findall(r"^#   ([a-z0-9-]+) +~", text, flags=re.MULTILINE))


def test_the_parts_checked_run_and_described_are_the_same():
    text = SCRIPT.read_text()
    parts = known_parts(text)
    assert len(parts) > 20 and len(set(parts)) == len(parts)
    assert set(parts) == run_part_arms(text)
    assert set(parts) == described_parts(text)


@pytest.mark.parametrize("given", ["bogus", "conv ragged", "co"])
def test_a_part_not_known_is_refused_in_one_line_before_anything_runs(tmp_path, given):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out), given], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("PART: one of headline-off ") and f"not {given}" in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not out.exists()
