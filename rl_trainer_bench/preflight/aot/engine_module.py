"""Which engine module the AOT check lowers: one with the abstract-input functions, and its BESIDE.

The check lowers an engine's programs from `jax.ShapeDtypeStruct` inputs without building the
engine (which would allocate its weights), so it needs functions from the engine's module, not an
engine object.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from rl_trainer_bench.errors import UserError

# What aot needs from an engine's module to lower its programs from abstract inputs, without
# building the engine (which would allocate its weights): the built-in engine's module has them.
AOT_FUNCTIONS = ("lower_programs", "abstract_state", "payload_spec")


def aot_engine_module(spec: str) -> ModuleType:
    """The module of the engine `spec` names, when it can lower its programs from abstract inputs;
    else a UserError saying which of AOT_FUNCTIONS it lacks."""
    from rl_trainer_bench.engine.factory import engine_class

    module = sys.modules[engine_class(spec).__module__]
    missing = [name for name in AOT_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise UserError(
            f"ENGINE={spec}: aot lowers an engine's programs from abstract inputs, which needs"
            f" {', '.join(AOT_FUNCTIONS)} in its module; {module.__name__} lacks"
            f" {', '.join(missing)}: check this engine with `check-engine` and time it with `run`"
        )
    return module


def beside_table(engine: ModuleType | None) -> Any:
    """Which state parts sit beside each program: the engine module's BESIDE, else the built-in
    engine's (`residency.BESIDE`)."""
    from rl_trainer_bench.engine import residency

    return getattr(engine, "BESIDE", residency.BESIDE)
