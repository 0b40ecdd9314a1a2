"""One training state, several engines: the family `share_state` makes, and the check of "same state".

Arms of a same-process A/B that differ in a program (a MaxText key, an engine key) each need their
own compiled programs, but not their own parameters, gradient sum and optimizer state: two copies
of those would put two states on the device, 2 x 20 GiB per device for the 397B cell beside
forward-backward temporaries of 72-80 GiB on a 96 GiB chip. An engine's `share_state(config)`
(engine/contract.py) builds another engine over the state it holds; the engines of one state form
a family in which exactly one, the last to take the state, holds live arrays: the others' arrays
were donated to its programs. An engine steps only while it holds the state
(`take_shared_state`, called by the bench off the clock), so a stale array is never read.

"The same state" is what the programs take, compared leaf by leaf: the same tree, and in each leaf
the same shape, dtype and sharding (the memory kind included). A list of key names would miss a
key that changes a shape and refuse one that does not.
"""

from __future__ import annotations

from typing import Any

import jax

from rl_trainer_bench.engine.contract import ContractError


class StateFamily:
    """The engines over one training state, and which of them holds it now."""

    def __init__(self, holder: Any):
        self.holder = holder

    def check_holds(self, engine: Any) -> None:
        """ContractError when `engine` is asked to step while another engine of its family holds
        the state: its own arrays are stale (donated to the other engine's programs)."""
        if self.holder is not engine:
            raise ContractError(
                f"{type(engine).__name__} was asked to step while another engine of its"
                " share_state family holds the training state: call take_shared_state() first"
            )


def first_difference(held: Any, wanted: Any) -> str | None:
    """Where two training states differ, in one phrase, or None when every leaf agrees.

    `held` and `wanted` are pytrees of arrays or `jax.ShapeDtypeStruct`s (with shardings): the
    tree, then each leaf's shape, dtype and sharding (memory kind included) are compared.
    """
    held_leaves = jax.tree_util.tree_flatten_with_path(held)[0]
    wanted_leaves = jax.tree_util.tree_flatten_with_path(wanted)[0]
    held_paths = [jax.tree_util.keystr(path) for path, _ in held_leaves]
    wanted_paths = [jax.tree_util.keystr(path) for path, _ in wanted_leaves]
    if held_paths != wanted_paths:
        only = [p for p in held_paths if p not in wanted_paths]
        only += [p for p in wanted_paths if p not in held_paths]
        return f"the state's leaves differ (at {only[0] if only else 'their order'})"
    for path, (_, have), (_, want) in zip(held_paths, held_leaves, wanted_leaves, strict=True):
        if tuple(have.shape) != tuple(want.shape):
            return f"{path} has shape {list(have.shape)}, the arm needs {list(want.shape)}"
        if have.dtype != want.dtype:
            return f"{path} is {have.dtype}, the arm needs {want.dtype}"
        have_sharding, want_sharding = _sharding(have), _sharding(want)
        if not _equivalent(have_sharding, want_sharding, len(have.shape)):
            return f"{path} is laid out as {have_sharding}, the arm needs {want_sharding}"
    return None


def _sharding(leaf: Any) -> Any:
    return getattr(leaf, "sharding", None)


def _equivalent(have: Any, want: Any, ndim: int) -> bool:
    """Same devices, same split and same memory kind; an unsharded side agrees with anything
    only when both are unsharded."""
    if have is None or want is None:
        return have is None and want is None
    return bool(have.is_equivalent_to(want, ndim))
