"""One way to build an engine from its name, for every command that builds one.

An engine is named as `module:Class` (the ENGINE knob, `--engine`) and built as
`Class(engine_config)`, so `check-engine`, `run`, `ab`, `aot` and the pod all exercise the same
object for the same name. The module is imported only when named: an adapter whose package is not
installed costs nothing until someone asks for it (docs/engine.md).
"""

from __future__ import annotations

import importlib
import inspect

from rl_trainer_bench import user_code
from rl_trainer_bench.engine.contract import CONSTRUCTOR, ContractError, constructor_problem

BUILT_IN = "rl_trainer_bench.engine.builtin.jax_engine:JaxEngine"
MAXTEXT = "rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine"
# Short names ENGINE also takes: `builtin` (CPU, CI, teams without MaxText) and `maxtext`.
ENGINE_NAMES = {"builtin": BUILT_IN, "maxtext": MAXTEXT}


def engine_class(spec: str, knob: str = "ENGINE") -> type:
    """The class `spec` (`module:Class`) names; a ContractError naming `knob` when it cannot be had."""
    module_name, colon, class_name = spec.partition(":")
    if not colon or not module_name or not class_name:
        raise ContractError(f"{knob}={spec!r}: write module:Class, e.g. {BUILT_IN}")
    user_code.claim(module_name)  # what its module raises from here on is the user's to fix
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if _a_dependency_is_missing(error, module_name):
            raise  # the boundary names the package and what installs it (errors.py)
        raise ContractError(
            f"{knob}={spec!r} cannot be imported ({error}): install the engine's package in this"
            " environment or fix the name"
        ) from error
    found = getattr(module, class_name, None)
    if found is None:
        raise ContractError(f"{knob}={spec!r}: module {module_name} has no {class_name}")
    if not isinstance(found, type):
        raise ContractError(f"{knob}={spec!r} names a {type(found).__name__}, not a class")
    for base in found.__mro__:  # a base class from another of the user's packages is theirs too
        user_code.claim(base.__module__)
    problem = constructor_problem(found)
    if problem is not None:
        raise ContractError(
            f"{knob}={spec!r}: the bench builds an engine as {class_name}(engine_config), and"
            f" {problem} (defined at {_where(found)}): give it {CONSTRUCTOR}"
            " (engine/contract.py), config the EngineConfig"
        )
    return found


def _a_dependency_is_missing(error: ImportError, module_name: str) -> bool:
    """Whether the engine's module was found but a package it imports is not installed (JAX on a
    render-only install): that is the installation's to complete, not a wrong engine name."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return False
    parts = module_name.split(".")
    return error.name not in {".".join(parts[:depth]) for depth in range(1, len(parts) + 1)}


def _where(cls: type) -> str:
    """`file:line` of the class's `__init__` (or of the class), for the author to open."""
    code = getattr(cls.__init__, "__code__", None)  # a class with no __init__ of its own: object's
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    try:
        return f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        return f"module {cls.__module__}"
