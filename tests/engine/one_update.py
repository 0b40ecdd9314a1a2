"""One update of the built-in engine on one CPU device, and the check that two updates are the
same bit for bit: for the tests that hold something added to a program (extra work, extra input
bytes) to leave training exactly as it was."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import Payload


@dataclasses.dataclass(frozen=True)
class Update:
    gradient: dict[str, np.ndarray]
    metrics: dict[str, Any]
    digest: str
    fwd_bwd_argument_bytes: int  # the compiled fwd_bwd's arguments, as XLA counts them
    fwd_bwd_flops: float  # the compiled fwd_bwd's FLOPs, as XLA's cost analysis counts them


def one_update(config: EngineConfig, compile_on: Payload, train_on: Payload) -> Update:
    """`config`'s engine compiled on `compile_on`, one fwd_bwd on `train_on`, one update."""
    engine = JaxEngine(config, jax.devices()[:1])
    engine.compile(compile_on)
    arguments = engine.program_memory()["fwd_bwd"]["argument"]
    flops = engine._compiled["fwd_bwd"].cost_analysis()["flops"]  # the program the update runs
    engine.fwd_bwd(train_on)
    gradient = engine.accumulated_gradient()
    engine.update()
    return Update(gradient, engine.get_metrics(), engine.parameter_digest(), arguments, flops)


def assert_same_update(got: Update, want: Update) -> None:
    """The loss, gradient norm, denominator, every gradient array and the new parameters equal."""
    for key in ("loss", "grad_norm", "loss_denominator"):
        assert got.metrics[key] == want.metrics[key], key
    for name, value in want.gradient.items():
        np.testing.assert_array_equal(got.gradient[name], value, err_msg=name)
    assert got.digest == want.digest  # the same update, bit for bit
