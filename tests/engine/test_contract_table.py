"""The contract is one file: optional methods are read through its table, never probed elsewhere."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

import rl_trainer_bench
from rl_trainer_bench.engine import contract, residency
from rl_trainer_bench.engine.builtin import jax_engine

PACKAGE = Path(rl_trainer_bench.__file__).parent


class Partial:
    """An engine with one optional method, and an attribute of an optional name that is no method."""

    info = "not callable"

    def parameter_digest(self) -> str:
        return "abc"


def test_optional_gives_the_method_or_none_and_refuses_a_name_not_in_the_table():
    engine = Partial()
    assert contract.optional(engine, "parameter_digest")() == "abc"
    assert contract.optional(engine, "info") is None
    assert contract.optional(engine, "model_flops") is None
    with pytest.raises(KeyError, match="not an optional engine method"):
        contract.optional(engine, "parameter_digests")


def test_aot_optional_reads_the_module_and_refuses_a_name_not_in_the_table():
    module = types.ModuleType("mine")
    module.BESIDE = {"fwd_bwd": ()}
    assert contract.aot_optional(module, "BESIDE") == {"fwd_bwd": ()}
    assert contract.aot_optional(module, "compile_reservations") is None
    with pytest.raises(KeyError, match="not an optional AOT entry"):
        contract.aot_optional(module, "BESIDES")


def test_the_built_in_engine_has_every_optional_method_and_its_module_the_aot_functions():
    assert contract.missing_methods(jax_engine.JaxEngine, tuple(contract.OPTIONAL_METHODS)) == []
    assert contract.missing_methods(jax_engine, contract.AOT_FUNCTIONS) == []
    assert callable(contract.aot_optional(jax_engine, "compile_reservations"))
    assert contract.aot_optional(jax_engine, "BESIDE") in (None, residency.BESIDE)


def engine_probes(source: str) -> list[str]:
    """`getattr(<...engine...>, ...)` / `hasattr(...)` calls in `source`: an engine probed directly."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and "engine" in ast.unparse(node.args[0]).lower()
        ):
            found.append(ast.unparse(node))
    return found


def test_no_module_outside_the_contract_probes_an_engine():
    probes = {
        str(path.relative_to(PACKAGE)): engine_probes(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix()
        not in ("engine/contract.py", "engine/maxtext/adapter.py")  # the adapter reads MaxText's
    }
    assert {path: calls for path, calls in probes.items() if calls} == {}
    assert engine_probes("x = getattr(self.engine, 'info', None)") == [
        "getattr(self.engine, 'info', None)"
    ]
