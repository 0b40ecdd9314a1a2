"""MaxText engines at rest: one built, one over its state (share_state), one with a state of its own.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=<repo>:<tunix checkout> \
        /tmp/maxtext-bench-venv/bin/python benchmarks/maxtext_shared_state_at_rest.py

Builds MaxText's engine through the adapter on cpu-tiny-qwen3.5 (4 x 2 x 1), then an engine for
another MaxText key (remat_policy=minimal) over its state, then one for that key with a state of
its own, and prints the bytes of `jax.live_arrays()` after each: nothing compiles or runs, so the
figures are the engines' states alone.
"""

from __future__ import annotations

import gc

import jax

from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.maxtext.adapter import MaxTextEngine

SPEC = "rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine"
MESH = "mesh_fsdp=4 mesh_context=2 mesh_expert=1"


def live_bytes() -> int:
    gc.collect()
    return sum(array.nbytes for array in jax.live_arrays() if not array.is_deleted())


def main() -> None:
    cell = PRESETS["cpu-tiny-qwen3.5"]
    config, _ = engine_config_from(cell, "", MESH, SPEC)
    minimal, _ = engine_config_from(cell, "", f"{MESH} maxtext.remat_policy=minimal", SPEC)
    first = MaxTextEngine(config)
    print("one engine", live_bytes(), flush=True)
    sibling = first.share_state(minimal)
    print("and one over its state", live_bytes(), flush=True)
    own = MaxTextEngine(minimal)
    print("and one with a state of its own", live_bytes(), flush=True)
    del sibling, own


if __name__ == "__main__":
    main()
