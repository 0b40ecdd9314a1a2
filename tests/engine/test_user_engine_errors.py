"""An engine the user names is the user's code: what it raises, and what it returns against the
contract, is reported as theirs (their file and line, or the method and what it returned), one
line, exit 2, never as a bug in the bench."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.bench import driver, entry
from rl_trainer_bench.engine import returns
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import TRACEBACK_VARIABLE

# A complete engine on the stand-in's model, subclassed per case below; `bad_base` holds it so a
# case's traceback runs through two of the user's modules.
BASE = """
import sys
sys.path.insert(0, {tests!r})
from stand_in_engine import StandInEngine

class Base(StandInEngine):
    def __init__(self, config):
        super().__init__()
"""


@pytest.fixture(autouse=True)
def _no_traceback(monkeypatch):
    monkeypatch.delenv(TRACEBACK_VARIABLE, raising=False)


def _engine_module(tmp_path, monkeypatch, name: str, body: str) -> str:
    """Write module `name` (its text `body`) where Python finds it; its spec `name:Engine`."""
    tests = str(__import__("pathlib").Path(__file__).parents[1])
    (tmp_path / "bad_base.py").write_text(BASE.format(tests=tests))
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:Engine"


def _run(tmp_path, spec: str) -> int:
    env = {"STEPS": "1", "MICRO_STEPS": "1", "RESULTS_DIR": str(tmp_path / "r"), "ENGINE": spec}
    return entry.main([], env)


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


RAISING = {
    "at_import": ("raise ValueError('no config file')\n", 1, "while it was imported"),
    "in_init": (
        """
        from bad_base import Base
        class Engine(Base):
            def __init__(self, config):
                raise RuntimeError('needs a GPU')
        """,
        5,
        "in __init__",
    ),
    "in_fwd_bwd": (
        """
        from bad_base import Base
        class Engine(Base):
            def fwd_bwd(self, batch):
                return {}['logits']
        """,
        5,
        "in fwd_bwd",
    ),
    "syntax": ("def broken(:\n", 1, "while it was imported"),
    # a package the engine imports is missing: the engine's import line, not an install hint
    "missing_dependency": ("import no_such_dependency_of_the_engine\n", 1, "while it was imported"),
}


@pytest.mark.parametrize("case", sorted(RAISING))
def test_an_error_in_the_users_engine_names_their_file_and_line(
    case, tmp_path, monkeypatch, capsys
):
    body, line, where = RAISING[case]
    spec = _engine_module(tmp_path, monkeypatch, f"user_engine_{case}", body)
    assert _run(tmp_path, spec) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"(module user_engine_{case})" in err
    assert f"{tmp_path / f'user_engine_{case}.py'}:{line} {where}" in err
    assert "not a bug in rl_trainer_bench" in err and "internal error" not in err
    assert not (tmp_path / "r" / "results.jsonl").exists()


def test_sys_exit_in_the_users_engine_keeps_its_code_and_is_named(tmp_path, monkeypatch, capsys):
    spec = _engine_module(tmp_path, monkeypatch, "user_engine_exits", "import sys\nsys.exit(3)\n")
    assert _run(tmp_path, spec) == 3
    err = _one_line(capsys.readouterr().err)
    assert f"called sys.exit(3) at {tmp_path / 'user_engine_exits.py'}:2" in err


def test_a_bug_in_the_bench_is_still_a_bug(tmp_path, monkeypatch, capsys):
    """The engine's frames are left before the bench's code fails: the bench is to blame."""
    spec = _engine_module(
        tmp_path, monkeypatch, "user_engine_fine", "from bad_base import Base as Engine\n"
    )
    monkeypatch.setattr(driver.step_record, "format_line", lambda record: 1 / 0)
    assert _run(tmp_path, spec) == 70
    assert "internal error, a bug in rl_trainer_bench" in capsys.readouterr().err


CONTRACT = {
    "update_not_int": (
        "def update(self):\n        super().update()\n        return 'done'",
        "update() returned str 'done': the contract asks for the new train_step (an int)",
    ),
    "metrics_list": (
        "def get_metrics(self, clear_cache=True):\n        return [1.0]",
        "get_metrics() returned list [1.0]: the contract asks for a mapping",
    ),
    "metrics_missing": (
        "def get_metrics(self, clear_cache=True):\n        return {'loss': 1.0}",
        "get_metrics() lacks grad_norm, loss_denominator",
    ),
    "metrics_array": (
        "def get_metrics(self, clear_cache=True):\n"
        "        return {**super().get_metrics(), 'grad_norm': __import__('numpy').ones(3)}",
        "get_metrics()['grad_norm'] is an array of shape (3,): the contract asks for one number",
    ),
    "compile_number": (
        "def compile(self, example):\n        return 1.5",
        "compile() returned float 1.5: the contract asks for {program name: seconds}",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTRACT))
def test_a_contract_violation_names_the_method_and_what_it_returned(
    case, tmp_path, monkeypatch, capsys
):
    method, message = CONTRACT[case]
    body = f"from bad_base import Base\nclass Engine(Base):\n    {method}\n"
    spec = _engine_module(tmp_path, monkeypatch, f"user_engine_{case}", body)
    assert _run(tmp_path, spec) == 2
    err = _one_line(capsys.readouterr().err)
    assert message in err, err


def test_an_engine_lacking_train_step_is_refused_before_the_compile(tmp_path, monkeypatch, capsys):
    body = """
    class Engine:
        def __init__(self, config): pass
        def compile(self, example): raise AssertionError('compiled')
        def fwd_bwd(self, batch): pass
        def update(self): return 1
        def get_metrics(self, clear_cache=True): return {}
    """
    spec = _engine_module(tmp_path, monkeypatch, "user_engine_no_step", body)
    assert _run(tmp_path, spec) == 2
    assert _one_line(capsys.readouterr().err).endswith(
        "engine Engine lacks train_step, which the engine contract requires (docs/engine.md)"
    )


def test_metrics_checks_accept_numbers_and_scalar_arrays():
    checked = returns.metrics(
        {"loss": np.float32(0.5), "grad_norm": np.array(2.0), "loss_denominator": 7, "note": "x"}
    )
    assert checked == {"loss": 0.5, "grad_norm": 2.0, "loss_denominator": 7.0, "note": "x"}
    assert returns.train_step(np.int64(4)) == 4
    with pytest.raises(ContractError, match="returned bool True"):
        returns.train_step(True)
    with pytest.raises(ContractError, match=r"'overflow_count'\] is nan: a count must be finite"):
        returns.metrics(
            {"loss": 1, "grad_norm": 1, "loss_denominator": 1, "overflow_count": np.nan}
        )


def test_nan_loss_is_flagged_in_valid_json_and_fails_the_run(tmp_path, monkeypatch, capsys):
    body = """
    from bad_base import Base
    class Engine(Base):
        def get_metrics(self, clear_cache=True):
            return {**super().get_metrics(clear_cache), 'loss': float('nan')}
    """
    spec = _engine_module(tmp_path, monkeypatch, "user_engine_nan", body)
    assert _run(tmp_path, spec) == 1
    assert "FAILED: non-finite metrics at step(s) 0 (loss); 1 (loss)" in capsys.readouterr().out
    lines = (tmp_path / "r" / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON: a bare NaN would not parse
    assert all("NaN" not in line for line in lines)
    assert [(r["loss"], r["non_finite"]) for r in records] == [(None, ["loss"])] * 2


def test_check_engine_reports_metrics_of_the_wrong_type_as_failures(tmp_path, monkeypatch, capsys):
    body = """
    class Engine:
        train_step = 0
        def __init__(self, config): pass
        def compile(self, example): return {'fwd_bwd': 0.0}
        def fwd_bwd(self, batch): pass
        def update(self):
            self.train_step += 1
            return self.train_step
        def get_metrics(self, clear_cache=True): return 'loss=1'
    """
    spec = _engine_module(tmp_path, monkeypatch, "user_engine_str_metrics", body)
    assert cli.main(["check-engine", "--engine", spec]) == 1
    out = capsys.readouterr().out
    assert "check-engine: FAIL get_metrics() returned str 'loss=1'" in out


def test_an_error_in_a_base_class_from_another_user_module_is_theirs(tmp_path, monkeypatch, capsys):
    helpers = "from bad_base import Base\nclass Failing(Base):\n    def update(self):\n        raise KeyError('moments')\n"
    (tmp_path / "user_helpers.py").write_text(helpers)
    body = "from user_helpers import Failing\nclass Engine(Failing):\n    pass\n"
    spec = _engine_module(tmp_path, monkeypatch, "user_engine_inherits", body)
    assert _run(tmp_path, spec) == 2
    err = _one_line(capsys.readouterr().err)
    assert (
        f"(module user_helpers) raised KeyError: 'moments' at {tmp_path / 'user_helpers.py'}:4"
        in err
    )


WRONG_INIT = {
    "no_config": ("def __init__(self): pass", "E() cannot be called with one config"),
    "two_required": (
        "def __init__(self, config, mesh): pass",
        "E(config, mesh) cannot be called with one config (missing a required argument: 'mesh')",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_INIT))
@pytest.mark.parametrize("command", ["run", "check-engine"])
def test_an_engine_whose_init_takes_no_config_is_the_users_to_fix(
    case, command, tmp_path, monkeypatch, capsys
):
    """`class E: def __init__(self)` is named with its file and the constructor the contract
    expects, exit 2, before any engine is built: not an internal error."""
    init, problem = WRONG_INIT[case]
    body = f"class E:\n    {init}\n"
    name = f"user_engine_init_{case}_{command.replace('-', '_')}"  # one module per test
    spec = _engine_module(tmp_path, monkeypatch, name, body).replace(":Engine", ":E")
    if command == "run":
        code = _run(tmp_path, spec)
    else:
        code = cli.main(["check-engine", "--engine", spec])
    assert code == 2
    err = _one_line(capsys.readouterr().err)
    assert problem in err, err
    assert f"{tmp_path / f'{name}.py'}:2" in err
    assert "def __init__(self, config)" in err and "internal error" not in err


def test_an_init_with_defaults_beyond_the_config_is_accepted():
    from rl_trainer_bench.engine.contract import constructor_problem

    class Optional:
        def __init__(self, config, mesh=None, *, trace=False):
            pass

    class Variadic:
        def __init__(self, *args):
            pass

    assert constructor_problem(Optional) is None and constructor_problem(Variadic) is None
