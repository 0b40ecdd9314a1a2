"""The arguments `aot` and `hlo-overlap` share: which cell, compiled for which devices.

Apart from the compiling modules on purpose: both commands' parsers read these, and a parser
answers `--help` on a python without JAX, where the modules that compile import it at their top.
"""

from __future__ import annotations

from rl_trainer_bench.chips import accelerators
from rl_trainer_bench.config.knobs import add_preset_flag

# `--target local`: this process's devices (targets.py), not a TPU slice's topology.
LOCAL = "local"
# `--layers 0` / `AOT_LAYERS=0`: compile the preset's full depth, extrapolating nothing (depth.py).
FULL_DEPTH = 0


def add_target_arguments(parser) -> None:
    """Which cell, compiled for which devices, at which depth."""
    add_preset_flag(parser, "the cell to compile")
    parser.add_argument(
        "--target",
        default=LOCAL,
        help=f"'local' (this process's devices) or a TPU slice: {accelerators.known_slice_forms()}",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=FULL_DEPTH,
        help="compile at N and 2N layers and extrapolate to the preset's depth"
        f" ({FULL_DEPTH}: full depth)",
    )
