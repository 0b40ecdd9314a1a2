"""The program sets an A/B compiles, for `aot --ab-arms`: each setting's knobs as its arm runs them.

A same-pod A/B runs every arm's programs against one state, so whether it fits is whether each
arm's programs fit beside that state: `aot` compiles every distinct program set the arms ask for,
each with exactly the knobs its arm runs with (`plan.arm_knobs`, the A/B's own composition of the
shared knobs and the arm's), and refuses the A/B when one does not fit. Settings that differ only
in knobs no compile sees (WORKER, STAGE_AFTER_UPDATE, ...), or that write one value two ways
(`off` sets STAGE_BEFORE_UPDATE=off, `after` leaves it at its default, off), share one program set:
each set is a compile of the 397B cell's programs, half an hour on a CPU host.
"""

from __future__ import annotations

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab.arms import parse_arms
from rl_trainer_bench.ab.plan import arm_knobs
from rl_trainer_bench.config.engine_keys import parse_engine_flags
from rl_trainer_bench.config.knobs import DRIVER_KNOBS

# The knobs that change what `aot` compiles or counts (the staged micro-batch beside the replay
# and the update, the micro-steps of the predicted step).
COMPILED_KNOBS = ("ENGINE", "TRAINER_ARGV", "ENGINE_FLAGS", "STAGE_BEFORE_UPDATE", "MICRO_STEPS")


def program_sets(arms: str, engine_flags: str) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """(the settings that compile it, its knobs) of every distinct program set of `arms` (`ab
    --arms`' grammar), over `aot`'s own ENGINE_FLAGS."""
    base = {"ENGINE_FLAGS": engine_flags} if engine_flags else {}
    found: dict[tuple[str, ...], tuple[list[str], dict[str, str]]] = {}
    for arm in parse_arms(arms, run_orders.WRITTEN):
        knobs = arm_knobs(base, arm)
        compiled = {name: knobs[name] for name in COMPILED_KNOBS if name in knobs}
        settings, _ = found.setdefault(_compiled_meaning(compiled), ([], compiled))
        if arm.setting not in settings:
            settings.append(arm.setting)
    return [(tuple(settings), knobs) for settings, knobs in found.values()]


def _compiled_meaning(knobs: dict[str, str]) -> tuple[str, ...]:
    """What a compile reads of `knobs`: each compiled knob's value as the knob table reads it
    (unset: its default), ENGINE_FLAGS as the engine keys it sets (the last of a key winning)."""
    return tuple(
        repr(sorted(parse_engine_flags(knobs.get(name, "")).items()))
        if name == "ENGINE_FLAGS"
        else repr(DRIVER_KNOBS[name].read(knobs))
        for name in COMPILED_KNOBS
    )
