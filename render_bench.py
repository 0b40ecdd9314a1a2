#!/usr/bin/env python3
"""Render a launcher's DRY_RUN output into a single-slice bench JobSet (flags; see `--help`).

The same as `rl-trainer-bench render`, runnable from a checkout without installing the package.
Bad input is one line on stderr and exit code 2; no output file is written then.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_trainer_bench.cli import main  # after the path set-up above
from rl_trainer_bench.errors import exit_process  # likewise

if __name__ == "__main__":
    exit_process(main(["render", *sys.argv[1:]]))
