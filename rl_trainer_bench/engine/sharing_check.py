"""`check-engine`'s check of an engine that declares `share_state`: one state, however many engines.

A same-process A/B builds every arm after the first over the first arm's training state
(`share_state`) and hands the state to whichever engine steps next (`take_shared_state`). The
promise is one set of parameters, gradient sum and optimizer state on the device; an engine that
keeps a copy breaks it without failing anything else: a second engine that allocates a state of
its own, or an engine that gave its state away and still references the arrays, so whatever the
taker's update does not donate outlives the step that replaced it. On the 397B cell either is
tens of GiB per device beside the programs, found only when the pod runs out of memory.

So the check counts bytes, not references: with the engine compiled and stepped, it builds a
second engine over its state for the same config, steps it, hands the state back, steps the first
again, and compares the bytes of every live array (`jax.live_arrays`) at each point with the
bytes before the second engine existed. A second engine may add what its programs keep beside
the state (a metric, a completion marker); a copy of any part of the state is far more.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import jax

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import Payload, optional

# What check-engine says of an engine without share_state (ab/one_state.py refuses its arms
# that change a program: each would need a state of its own).
NO_SHARING = (
    "no share_state: an A/B whose arms change this engine's programs runs one setting per pod"
    " (scored with ab --from-logs)"
)
# What a second engine may add beside the shared state, as a share of the state's bytes: its
# metrics and markers are a few scalars; the smallest copy worth catching (one parameter-sized
# tree of the three an Adam state holds) is a third of it.
ALLOWED_GROWTH = 0.05


def live_bytes() -> int:
    """The bytes of every live array of this process, whatever its devices."""
    gc.collect()
    total = 0
    for array in jax.live_arrays():
        if not array.is_deleted():
            total += array.nbytes
    return total


@dataclasses.dataclass(frozen=True)
class SharingCheck:
    """What the check found: failures (one line each, naming the method), and what it measured."""

    failures: list[str]
    measured: str


def check_sharing(
    engine: Any, config: EngineConfig, payloads: list[Payload], state_bytes: int
) -> SharingCheck:
    """Build a second engine over `engine`'s state, step each in turn, count the bytes held.

    `engine` has been compiled and stepped; `state_bytes` is what building it added to the live
    arrays (its state). An engine without `share_state` passes, saying so.
    """
    share = optional(engine, "share_state")
    if share is None:
        return SharingCheck([], NO_SHARING)
    if optional(engine, "take_shared_state") is None:
        return SharingCheck(
            ["share_state without take_shared_state: the contract needs both"],
            "share_state not checked",
        )
    allowed = ALLOWED_GROWTH * state_bytes
    before, start = live_bytes(), engine.train_step
    try:
        second = share(config)
    except Exception as error:  # the engine's own config must share: any refusal is a failure
        return SharingCheck(
            [f"share_state(its own config) raised {type(error).__name__}: {error}"],
            "share_state refused",
        )
    second.compile(payloads[0])  # a state of its own, if it makes one, is whole once this returns
    growth = {"built": live_bytes() - before}
    failures = []
    if growth["built"] > allowed:
        failures.append(
            f"share_state: building the second engine added {_share(growth['built'], state_bytes)}"
            " to the live arrays: it allocated a state of its own instead of training the first's"
        )
    for name, stepping, expected in (("second", second, start + 1), ("first", engine, start + 2)):
        stepping.compile(payloads[0])
        stepping.take_shared_state()
        for payload in payloads:
            stepping.fwd_bwd(payload)
        stepped = stepping.update()
        stepping.get_metrics()
        growth[name] = live_bytes() - before
        if stepped != expected:
            failures.append(
                f"take_shared_state: the {name} engine's update returned train step {stepped},"
                f" not {expected}: it did not step the state the other engine left"
            )
        if growth[name] > allowed and growth["built"] <= allowed:
            giver = "first" if name == "second" else "second"
            failures.append(
                f"take_shared_state: after the {name} engine's step the live arrays hold"
                f" {_share(growth[name], state_bytes)} more than before the second engine was"
                f" built: the {giver} engine, which gave the state away, still holds arrays of it"
                " (drop them when another engine takes the state)"
            )
    measured = (
        f"share_state: a second engine over the state ({state_bytes:,} bytes) stepped, then the"
        f" first again; live arrays beside the first engine's: {growth['built']:+,} bytes once"
        f" built, {growth['second']:+,} after its step, {growth['first']:+,} after the first's"
    )
    return SharingCheck(failures, measured)


def _share(grown: int, state_bytes: int) -> str:
    if state_bytes <= 0:
        return f"{grown:,} bytes"
    return f"{grown:,} bytes ({grown / state_bytes:.0%} of the state's {state_bytes:,})"
