"""MaxText engines at rest: one built, one over its state (share_state), one with a state of its own.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=<repo>:<tunix checkout> \
        /tmp/maxtext-bench-venv/bin/python benchmarks/closed/maxtext_shared_state_at_rest.py

Builds MaxText's engine through the adapter on cpu-tiny-qwen3.5 (4 x 2 x 1), then an engine for
another MaxText key (remat_policy=minimal) over its state, then hands the state back to the first
engine, then builds one for that key with a state of its own. After each it prints the bytes of
`jax.live_arrays()` at rest and their peak while it ran (sampled every 0.2 s, `ab_one_state`'s
sampler), and the bytes of arrays the engine that does not hold the state still holds: nothing
compiles or runs, so the figures are the engines' states alone.

Closed (benchmarks/closed/README.md); its report: benchmarks/reports/ab-one-state_cpu_2026-12-04.md.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ab"))
from ab_one_state import LiveBytes, rest_bytes

from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.maxtext.adapter import MaxTextEngine

SPEC = "rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine"
MESH = "mesh_fsdp=4 mesh_context=2 mesh_expert=1"


def held_by(engine: MaxTextEngine) -> int:
    """Bytes of the arrays in the weights and moments of `engine`'s MaxText engine."""
    leaves = jax.tree.leaves(engine.api.state_avals(engine.engine))
    return sum(leaf.nbytes for leaf in leaves if isinstance(leaf, jax.Array))


def config_for(keys: str):
    config, _ = engine_config_from(PRESETS["cpu-tiny-qwen3.5"], "", f"{MESH} {keys}", SPEC)
    return dataclasses.replace(config, maxtext_driver="maxtext")


def main() -> None:
    with LiveBytes() as live:
        first = MaxTextEngine(config_for(""))
    print(f"one engine: at rest {rest_bytes():,}, peak {live.peak:,}", flush=True)
    with LiveBytes() as live:
        sibling = first.share_state(config_for("maxtext.remat_policy=minimal"))
    print(
        f"and one over its state: at rest {rest_bytes():,}, peak {live.peak:,};"
        f" the giving engine's state holds {held_by(first):,}",
        flush=True,
    )
    first.take_shared_state()
    print(
        f"state handed back: at rest {rest_bytes():,}; the other engine's state holds"
        f" {held_by(sibling):,}",
        flush=True,
    )
    with LiveBytes() as live:
        own = MaxTextEngine(config_for("maxtext.remat_policy=minimal"))
    print(f"and one with a state of its own: at rest {rest_bytes():,}, peak {live.peak:,}")
    del sibling, own


if __name__ == "__main__":
    main()
