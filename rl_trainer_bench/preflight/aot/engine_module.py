"""Which engine module the AOT check lowers, and the BESIDE table it counts the peak with.

What such a module must and may have is the contract's (`engine/contract.py`, `AotEngineModule`);
this module finds it from an engine's name and refuses one that lacks it, in one line.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.contract import AOT_FUNCTIONS, aot_optional, missing_methods
from rl_trainer_bench.engine.factory import engine_class
from rl_trainer_bench.errors import UserError


def aot_engine_module(spec: str) -> ModuleType:
    """The module of the engine `spec` names, when it can lower its programs from abstract inputs;
    else a UserError saying which of AOT_FUNCTIONS it lacks."""
    module = sys.modules[engine_class(spec).__module__]
    missing = missing_methods(module, AOT_FUNCTIONS)
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
    return aot_optional(engine, "BESIDE") or residency.BESIDE
