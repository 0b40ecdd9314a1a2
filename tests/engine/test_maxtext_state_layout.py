"""One training state for MaxText's engine under both drivers: the adapter's own calls hold the
Transformer's weights and moments as MaxText lays them out, Tunix's driver one level down, in
Tunix's model adapter (`base`). An A/B of the two drivers shares one state, compared and moved in
the Transformer's layout (`engine/maxtext/state_layout.py`). Against the stand-in, which lays the
wrapped state out as MaxText does, and against maxtext 0.2.5 with Tunix where both import (the
side environment of benchmarks/maxtext/maxtext_venv.sh; skipped elsewhere)."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from maxtext_stand_in import STAND_IN_API, StandInTunixMaxTextEngine

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import StateMismatch, example_payloads_for

QWEN35 = PRESETS["cpu-tiny-qwen3.5"].engine


def small_config(driver: str, folder, vocab_size: int = 128):
    """The Qwen3.5 cell (a model MaxText's Tunix adapter wraps) with a smaller vocabulary,
    MaxText's files in `folder`/`driver`."""
    model = dataclasses.replace(QWEN35.model, vocab_size=vocab_size)
    output_dir = str(folder / driver)
    return dataclasses.replace(QWEN35, model=model, maxtext_driver=driver, output_dir=output_dir)


def weights(adapter):
    return STAND_IN_API.state_avals(adapter.engine)[0]


def leaves(adapter) -> list:
    return jax.tree.leaves(STAND_IN_API.state_avals(adapter.engine))


@pytest.mark.parametrize("first_driver, other_driver", [("maxtext", "tunix"), ("tunix", "maxtext")])
def test_the_two_drivers_train_one_state_each_in_its_own_layout(
    first_driver, other_driver, tmp_path
):
    """Either driver first: the other takes the very arrays (not copies) into its own layout,
    trains them, and hands them back with its train step; a state of other shapes is still
    refused, named in the Transformer's layout."""
    first = StandInTunixMaxTextEngine(small_config(first_driver, tmp_path))
    given = leaves(first)
    other = first.share_state(small_config(other_driver, tmp_path))
    assert [first.wrapped, other.wrapped] == [first_driver == "tunix", other_driver == "tunix"]
    assert list(weights(other)) == (
        ["base"] if other.wrapped else ["embed", "experts", "gate", "head"]
    )
    assert all(a is b for a, b in zip(leaves(other), given, strict=True))
    payload = example_payloads_for(other.config, 1)[0]
    other.compile(payload)
    other.fwd_bwd(payload)
    assert other.update() == 1
    trained = leaves(other)
    first.take_shared_state()
    assert first.train_step == 1
    assert list(weights(first)) == (
        ["base"] if first.wrapped else ["embed", "experts", "gate", "head"]
    )
    assert all(a is b for a, b in zip(leaves(first), trained, strict=True))
    first.compile(payload)
    first.fwd_bwd(payload)
    assert first.update() == 2
    with pytest.raises(StateMismatch, match=r"^\[0\]\['embed'\] has shape \[64, .*needs \[128, "):
        StandInTunixMaxTextEngine(small_config(first_driver, tmp_path, vocab_size=64)).share_state(
            small_config(other_driver, tmp_path)
        )


@pytest.mark.slow
def test_maxtexts_engine_under_tunix_takes_the_state_of_its_own_calls(tmp_path):
    """maxtext 0.2.5 and Tunix: the engine Tunix drives (its model in TunixMaxTextAdapter) is
    built over the state of the one the adapter calls, on the MoE cell's mesh of the bench script
    (benchmarks/maxtext/maxtext_engine.sh), and holds the very arrays, which the first no longer
    holds."""
    pytest.importorskip(
        "maxtext", reason="maxtext is not installed (benchmarks/maxtext/maxtext_venv.sh)"
    )
    pytest.importorskip("tunix.experimental", reason="no Tunix with tunix.experimental")
    from flax import nnx

    from rl_trainer_bench.engine.maxtext.adapter import MaxTextEngine

    cell = dataclasses.replace(QWEN35, mesh=MeshConfig(fsdp=4, context=2, expert=1))
    own = MaxTextEngine(
        dataclasses.replace(cell, maxtext_driver="maxtext", output_dir=str(tmp_path / "own"))
    )
    given = jax.tree.leaves(nnx.state(own.engine.state))
    tunix = own.share_state(
        dataclasses.replace(cell, maxtext_driver="tunix", output_dir=str(tmp_path / "tunix"))
    )
    assert (own.wrapped, tunix.wrapped) == (False, True)
    held = nnx.state(tunix.engine.state)
    assert "base" in held["model"]
    assert all(a is b for a, b in zip(jax.tree.leaves(held), given, strict=True))
    assert not any(
        isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(nnx.state(own.engine.state))
    )
    own.take_shared_state()
    back = jax.tree.leaves(nnx.state(own.engine.state))
    assert all(a is b for a, b in zip(back, given, strict=True))
