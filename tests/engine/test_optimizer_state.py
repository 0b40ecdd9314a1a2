"""Adam's first moment in the dtype the trainer's mu_dtype asks for (MaxText's key, same meaning)."""

from __future__ import annotations

import dataclasses

import jax
import optax

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin.programs import state_shapes


def _moments(mu_dtype: str):
    engine = PRESETS["cpu-tiny"].engine
    config = dataclasses.replace(
        engine, optimizer=dataclasses.replace(engine.optimizer, mu_dtype=mu_dtype)
    )
    (adam,) = [
        s
        for s in jax.tree.leaves(
            state_shapes(config).opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(s, optax.ScaleByAdamState)
    ]
    return adam


def test_bfloat16_mu_halves_the_first_moment_and_keeps_the_second_in_float32():
    wide, narrow = _moments("float32"), _moments("bfloat16")
    assert {leaf.dtype.name for leaf in jax.tree.leaves(wide.mu)} == {"float32"}
    assert {leaf.dtype.name for leaf in jax.tree.leaves(narrow.mu)} == {"bfloat16"}
    assert {leaf.dtype.name for leaf in jax.tree.leaves(narrow.nu)} == {"float32"}
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(narrow.mu))
    assert 2 * size == sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(wide.mu))
