"""What an engine's calls must return, checked where the driver receives it.

An engine is often someone else's code (`docs/engine.md`), so what it hands back is input: a
`compile` that returns one number, metrics that are a list, an array where a number belongs, or an
`update` that returns `None` would otherwise surface as a TypeError deep in the ruler (reported as
a bug in the bench) or, worse, as a run that reports `updates=0` and exits 0. Each check raises a
`ContractError` naming the method, what it returned and what the contract asks for, so the user
fixes the engine, not the bench. `check-engine` reads the same checks as conformance failures.
"""

from __future__ import annotations

import math
import operator
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rl_trainer_bench.engine.contract import (
    MAY_BE_UNMEASURED,
    METRIC_KEYS,
    STAGING_METHODS,
    ContractError,
    Payload,
    PreparedInput,
    missing_methods,
    missing_requirements,
)

# Metrics every step record reads; the contract's other METRIC_KEYS are read when present.
RECORDED_METRICS = ("loss", "grad_norm", "loss_denominator")
COUNTS = ("overflow_count", "replay_count", "tokens")


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def refuse_incomplete(engine: object) -> None:
    """ContractError naming what `engine` lacks of the required methods and `train_step`."""
    missing = missing_requirements(engine)
    if missing:
        raise ContractError(
            f"engine {type(engine).__name__} lacks {', '.join(missing)}, which the engine contract"
            " requires (docs/engine.md)"
        )


def compile_seconds(returned: Any) -> dict[str, float]:
    """`compile()`'s return as {program: seconds}; ContractError when it is anything else."""
    if isinstance(returned, Mapping) and all(
        isinstance(name, str) and _number(seconds) is not None and _number(seconds) >= 0
        for name, seconds in returned.items()
    ):
        return {name: float(seconds) for name, seconds in returned.items()}
    raise ContractError(
        f"compile() returned {_shown(returned)}: the contract asks for {{program name: seconds}}"
    )


def train_step(returned: Any, method: str = "update()") -> int:
    """The train step `update()` returned; ContractError when it is not an integer."""
    if not isinstance(returned, bool):
        try:
            return operator.index(returned)
        except TypeError:
            pass
    raise ContractError(
        f"{method} returned {_shown(returned)}: the contract asks for the new train_step (an int)"
    )


def metrics(returned: Any, required: tuple[str, ...] = RECORDED_METRICS) -> dict[str, Any]:
    """`get_metrics()`'s return as a dict: a mapping holding `required`, each of the contract's
    METRIC_KEYS it holds one number (a 0-d array counts, read as a float); ContractError naming
    the first problem. Other keys pass as they are (an engine may report more). Non-finite numbers
    pass: they are a training outcome the step record flags, not a broken contract. None passes
    for a figure the engine does not measure (MAY_BE_UNMEASURED), which no record may show as 0."""
    if not isinstance(returned, Mapping):
        raise ContractError(
            f"get_metrics() returned {_shown(returned)}: the contract asks for a mapping of"
            f" metric names to numbers ({', '.join(required)} at least)"
        )
    lacking = [name for name in required if name not in returned]
    if lacking:
        raise ContractError(f"get_metrics() lacks {', '.join(lacking)}: the contract requires them")
    checked = dict(returned)
    for name in METRIC_KEYS:
        if name not in returned or (returned[name] is None and name in MAY_BE_UNMEASURED):
            continue
        number = _number(returned[name])
        if number is None:
            raise ContractError(
                f"get_metrics()[{name!r}] is {_described(returned[name])}: the contract asks for"
                " one number"
            )
        if name in COUNTS and not math.isfinite(number):
            raise ContractError(f"get_metrics()[{name!r}] is {number}: a count must be finite")
        checked[name] = number
    return checked


def _number(value: Any) -> float | None:
    """`value` as a float when it is one real number (a Python, numpy or 0-d array one)."""
    if isinstance(value, bool | int | float):
        return float(value)
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape == () and dtype is not None and np.dtype(dtype).kind in "biuf":
        return float(value)
    return None


def _described(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and shape != ():
        return f"an array of shape {tuple(shape)}"
    return _shown(value)


def check_engine(engine: object, payloads: list[Payload]) -> list[str]:
    """Run the contract on `engine` with two or more same-shaped micro-batches; the failures found.

    Checks: the required methods exist; compile returns seconds per program; fwd_bwd returns None
    and leaves train_step alone; update returns train_step + 1; get_metrics carries METRIC_KEYS
    with finite numbers; and, where the engine has the staging methods, a prepared micro-batch
    trains exactly like the plain one (same metrics; same parameters where the engine exposes a
    parameter digest, compared against a second engine is the caller's business).
    """
    failures: list[str] = []
    missing = missing_requirements(engine)
    if missing:
        return [f"missing required methods: {', '.join(missing)}"]
    try:
        compile_seconds(engine.compile(payloads[0]))
    except ContractError as error:
        failures.append(str(error))
    start = engine.train_step
    for payload in payloads:
        if engine.fwd_bwd(payload) is not None:
            failures.append("fwd_bwd must return None")
    if engine.train_step != start:
        failures.append(f"train_step moved in fwd_bwd: {start} -> {engine.train_step}")
    new_step = engine.update()
    if new_step != start + 1 or engine.train_step != start + 1:
        failures.append(f"update must return train_step + 1 = {start + 1}, got {new_step}")
    first = engine.get_metrics()
    failures += _metric_failures(first)
    if not missing_methods(engine, STAGING_METHODS):
        prepared = engine.prepare_fwd_bwd_input(payloads[0])
        if not isinstance(prepared, PreparedInput):
            failures.append("prepare_fwd_bwd_input must return a PreparedInput (name, digests)")
        engine.fwd_bwd(prepared)
        for payload in payloads[1:]:
            engine.fwd_bwd(payload)
        waited = engine.wait_for_device()
        if not isinstance(waited, float) or waited < 0:
            failures.append(f"wait_for_device must return seconds >= 0, got {waited!r}")
        engine.update()
        staged = engine.get_metrics()
        failures += _metric_failures(staged)
        if not failures and staged["loss_denominator"] != first["loss_denominator"]:
            failures.append(
                "a prepared micro-batch trained different tokens: loss_denominator "
                f"{staged['loss_denominator']} != {first['loss_denominator']}"
            )
    return failures


def _metric_failures(returned: Any) -> list[str]:
    """What is wrong with `get_metrics()`'s return: the contract's shape, then finite values."""
    try:
        checked = metrics(returned, required=METRIC_KEYS)
    except ContractError as error:
        return [str(error)]
    bad = [k for k in METRIC_KEYS if checked[k] is not None and not np.isfinite(checked[k])]
    return [f"get_metrics has non-finite {', '.join(bad)}"] if bad else []
