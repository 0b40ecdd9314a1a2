"""Which engine a run times: the trainer's own program, unless ENGINE names another.

A team renders the bench to time *its* trainer. When the trainer's command runs MaxText (its
`--trainer_backend=maxtext` flag, or MaxText keys in `MAXTEXT_EXTRA_FLAGS` when it names no
backend), the engine that runs the trainer's program is MaxText's, behind the adapter
(`engine/maxtext/adapter.py`), built from the MaxText in the trainer's image with the trainer's
keys. Otherwise, and for a model MaxText's engine cannot time here, it is the built-in engine.
`ENGINE` (a `module:Class`, or `builtin` / `maxtext`) always wins. Whatever is chosen, the choice
carries its reason, which the plan prints. Nothing here imports JAX or MaxText.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_trainer_bench.config.engine_keys import CommandLine, command_line
from rl_trainer_bench.config.trainer_maxtext import EXTRA_FLAGS_VARIABLE
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys

BACKEND_FLAG = "trainer_backend"
# MaxText's engine logs a step's metrics during the next step's first fwd_bwd, and its first log
# compiles a few small eager programs (`WeightedMetric.compute`); with one warm-up step they compile
# in the first scored step, which the recompile check then fails
# (benchmarks/reports/maxtext-engine_cpu_2026-12-03.md).
MAXTEXT_WARMUP_STEPS = 2
MAXTEXT_BACKEND = "maxtext"


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine a run builds (`module:Class`) and why that one."""

    spec: str
    source: str


def maxtext_evidence(trainer_argv: CommandLine | Sequence[str]) -> str:
    """What in the trainer's command says it runs MaxText ('' when nothing does).

    The backend flag decides when present (a trainer on another backend may still export
    MAXTEXT_EXTRA_FLAGS, which it then never reads); without it, MAXTEXT_EXTRA_FLAGS in the
    command says the trainer builds a MaxText config.
    """
    trainer = command_line(trainer_argv)
    environment, flags = trainer.environment, trainer.flags
    backend = flags.get(BACKEND_FLAG)
    if backend is not None:
        return f"--{BACKEND_FLAG}={backend}" if backend.lower() == MAXTEXT_BACKEND else ""
    if EXTRA_FLAGS_VARIABLE in environment:
        return f"{EXTRA_FLAGS_VARIABLE} in its command"
    return ""


def choose_engine(
    given: str | None, trainer_argv: CommandLine | Sequence[str], engine: EngineConfig
) -> EngineChoice:
    """ENGINE when given; else MaxText's engine for a MaxText trainer whose model it can time
    (`engine`: the preset's config, whose model family decides); else the built-in engine."""
    if given:
        return EngineChoice(given, "ENGINE")
    evidence = maxtext_evidence(trainer_argv)
    if not evidence:
        return EngineChoice(
            BUILT_IN,
            f"the trainer's command does not run MaxText (no --{BACKEND_FLAG}={MAXTEXT_BACKEND},"
            f" no {EXTRA_FLAGS_VARIABLE})",
        )
    try:
        maxtext_keys.maxtext_model(engine)
    except maxtext_keys.NotTaken as why:
        return EngineChoice(
            BUILT_IN,
            f"the trainer runs MaxText ({evidence}), but MaxText's engine cannot time this model"
            f" here: {why}",
        )
    return EngineChoice(MAXTEXT, f"the trainer runs MaxText ({evidence}): its own program")


def engine_warmup_steps(spec: str) -> int:
    """Warm-up steps the engine `spec` needs before its steps compile nothing (WARMUP_STEPS unset)."""
    return MAXTEXT_WARMUP_STEPS if spec == MAXTEXT else 1
