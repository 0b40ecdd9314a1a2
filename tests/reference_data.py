"""Reference data the project does not ship: real launcher output, read in place, never copied.

It lies in `shared/reference/` beside the checkout (or beside a folder above it, for a nested
checkout); README's "Run the tests" says so. A test that needs a file of it skips where it is
absent, naming the file and where it was looked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = next(
    (folder / "shared" for folder in REPO.parents if (folder / "shared" / "reference").is_dir()),
    REPO.parent / "shared",
)
LAUNCH_RENDERS = SHARED / "reference" / "launch-renders"


def launch_render(name: str) -> Path:
    """The launcher output `name` of a real run (DRY_RUN), or a skip that names what it needs."""
    path = LAUNCH_RENDERS / name
    if not path.is_file():
        pytest.skip(
            f"needs the real launcher output {name}, looked for in {LAUNCH_RENDERS} (the"
            " reference data beside the checkout; README, 'Run the tests')"
        )
    return path
