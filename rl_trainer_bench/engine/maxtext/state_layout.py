"""One MaxText training state under two drivers: the layout Tunix's model adapter adds, taken off.

MaxText keeps a module's state where the module keeps its parts. Under Tunix's driver the model is
MaxText's `TunixMaxTextAdapter`, which holds the `Transformer` as its one part, `base`: every
parameter sits one level deeper (`['base']['decoder']...` where the adapter's own calls hold
`['decoder']...`), and so does every Adam moment, which mirrors the parameters. The arrays are the
Transformer's either way: same leaves, same shapes, dtypes and shardings, in the same order. So
two engines of one `share_state` family, one per driver, hold one state in two layouts, and "the
same state" is decided, and the state moved, in the Transformer's own layout (`model_layout`):
the adapter's level is dropped where an engine's model is wrapped, nothing else changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from rl_trainer_bench.engine.contract import StateMismatch
from rl_trainer_bench.engine.shared_state import first_difference

# TunixMaxTextAdapter's one part: the Transformer it wraps (`head.transformer_of` reads it too).
ADAPTER_PART = "base"


def model_layout(state: Any, wrapped: bool) -> Any:
    """`state` (a pytree of an engine's training state) in the Transformer's own layout: where the
    model is wrapped, each node holding the adapter's part alone (the model's state, and each
    moment tree mirroring it) is replaced by that part."""
    if not wrapped:
        return state

    def unwrapped(node: Any) -> Any:
        return node[ADAPTER_PART] if _adapter_node(node) else node

    return jax.tree.map(unwrapped, state, is_leaf=_adapter_node)


def moved(held: Any, held_wrapped: bool, taker: Any, taker_wrapped: bool) -> Any:
    """`held`'s leaves in `taker`'s layout: the tree an engine whose state is `taker` (its own
    leaves, shapes where it holds none) sets to take over `held`. StateMismatch naming the first
    difference when the two are not one tree of the same shapes and dtypes in the Transformer's
    layout (their shardings were compared before, as the programs take them: `share_state`).
    Dropping the adapter's level keeps the leaves' order, so the leaves move in order."""
    difference = first_difference(
        _unplaced(model_layout(held, held_wrapped)), _unplaced(model_layout(taker, taker_wrapped))
    )
    if difference is not None:
        raise StateMismatch(difference)
    return jax.tree.unflatten(jax.tree.structure(taker), jax.tree.leaves(held))


def _unplaced(state: Any) -> Any:
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), state)


def _adapter_node(node: Any) -> bool:
    return isinstance(node, Mapping) and list(node) == [ADAPTER_PART]
