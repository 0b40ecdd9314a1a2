"""A step's shape from the launcher: how many micro-batches one optimizer step trains.

The trainer's step trains every sequence of one update: P prompts x G generations. Launchers say
so in one of two ways, and the bench reads both:

- the orchestrator's `--batch_size` (prompt groups per step, Tunix's distributed GRPO) and
  `--num_generations`;
- the trainer's `--mini_batch_size`: with `--num_generations` beside it, prompts per update (Tunix's
  RL learner packs `mini_batch_size x num_generations` sequences per update); without, sequences
  per update (Tunix's distributed trainer node accumulates `ceil(mini_batch_size /
  train_micro_batch_size)` micro-batches, its launcher setting it to prompts x generations).

Given both, they must name the same number of sequences, or the step is not derived. The
sequences then fill the bench's micro-batches of R rows (the trainer's `--train_micro_batch_size`,
else ENGINE_FLAGS' or the preset's rows):

- **one sequence per row** (no `--max_seq_token_per_tpu`): ceil(S / R) micro-steps, exactly;
- **packed rows** (`--max_seq_token_per_tpu` set): how many sequences share a row depends on the
  lengths the rollouts produce, which no launcher states; every row holds at least
  floor(max_seq_token_per_tpu / (max_prompt_length + max_response_length)) of them, so the step
  has at most ceil(S / (R x that)) micro-steps, and that bound is the value (the count when every
  sequence runs to its maximum length); shorter rollouts pack into fewer.

Where the launcher does not give enough, the step is not derived and the reason says which flag
is missing, so the plan can say why the preset's count is used. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from rl_trainer_bench.config import values
from rl_trainer_bench.config.engine_keys import (
    CommandLine,
    EngineFlags,
    ResolvedEngine,
    engine_config_from,
)
from rl_trainer_bench.config.presets import Preset
from rl_trainer_bench.errors import ConfigError

PACKING_FLAG = "max_seq_token_per_tpu"
ROWS_KEY = "train_micro_batch_size"  # the engine key of the micro-batch's rows
LENGTH_FLAGS = ("max_prompt_length", "max_response_length")  # a sequence's longest parts


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What the launcher says of one step: its micro-steps, or why it says too little."""

    micro_steps: int | None  # None: not derived (`how` says why)
    how: str  # the arithmetic and the flags it read, or why nothing was derived
    exact: bool = True  # False: packed rows, the count is an upper bound

    def describe(self) -> str:
        """`8 prompts x 4 generations = ..., one sequence per row of ...: 4 micro-steps`."""
        if self.micro_steps is None:
            return f"not derived from the launcher: {self.how}"
        bound = "" if self.exact else "at most "
        noun = "micro-step" if self.micro_steps == 1 else "micro-steps"
        return f"{self.how}: {bound}{self.micro_steps} {noun} per step"


def launcher_step_shape(
    preset: Preset,
    trainer: CommandLine,
    engine_flags: EngineFlags,
    orchestrator: CommandLine,
    engine: str,
) -> tuple[StepShape, ResolvedEngine]:
    """The step's shape in the micro-batches the bench will time: rows as `engine_config_from`
    resolves them (ENGINE_FLAGS over the trainer's --train_micro_batch_size over the preset);
    with the engine config resolved for them, which the run's plan takes."""
    config, unapplied = engine_config_from(preset, trainer, engine_flags, engine=engine)
    resolved = ResolvedEngine(preset, engine, trainer, engine_flags, config, tuple(unapplied))
    if ROWS_KEY in engine_flags.given:
        rows_source = f"ENGINE_FLAGS {ROWS_KEY}"
    elif ROWS_KEY in trainer.flags:
        rows_source = f"the trainer's --{ROWS_KEY}"
    else:
        rows_source = f"preset {preset.name}'s rows"
    shape = step_shape(trainer.flags, orchestrator.flags, config.micro_batch_rows, rows_source)
    return shape, resolved


@dataclasses.dataclass(frozen=True)
class _Sequences:
    count: int
    how: str


def step_shape(
    trainer_flags: Mapping[str, str],
    orch_flags: Mapping[str, str],
    rows: int,
    rows_source: str,
) -> StepShape:
    """The step's micro-steps from the trainer's and orchestrator's flags (module docstring),
    in micro-batches of `rows` rows; ConfigError when a flag it reads is not a count."""
    sequences = _sequences_per_step(trainer_flags, orch_flags)
    if isinstance(sequences, str):
        return StepShape(None, sequences)
    in_rows = f"{rows}-row micro-batches ({rows_source})"
    if PACKING_FLAG not in trainer_flags:
        steps = math.ceil(sequences.count / rows)
        return StepShape(steps, f"{sequences.how}, one sequence per row of {in_rows}")
    return _packed(trainer_flags, sequences, rows, in_rows)


def _packed(
    trainer_flags: Mapping[str, str], sequences: _Sequences, rows: int, in_rows: str
) -> StepShape:
    budget = _count(trainer_flags, PACKING_FLAG, "the trainer's")
    missing = [flag for flag in LENGTH_FLAGS if flag not in trainer_flags]
    if missing:
        return StepShape(
            None,
            f"the trainer packs rows of --{PACKING_FLAG}={budget} tokens, and without"
            f" --{' and --'.join(missing)} how many sequences share a row is unknown",
        )
    longest = sum(_count(trainer_flags, flag, "the trainer's") for flag in LENGTH_FLAGS)
    per_row = max(1, budget // longest)
    steps = math.ceil(sequences.count / (rows * per_row))
    return StepShape(
        steps,
        f"{sequences.how}, packed into rows of --{PACKING_FLAG}={budget} tokens, at least"
        f" {per_row} per row (sequences of up to {longest:,} tokens:"
        f" --{' + --'.join(LENGTH_FLAGS)}), in {in_rows}; shorter rollouts pack into fewer",
        exact=False,
    )


def _sequences_per_step(
    trainer_flags: Mapping[str, str], orch_flags: Mapping[str, str]
) -> _Sequences | str:
    """The sequences one update trains, and the flags that say so; a str says why none."""
    from_orchestrator = _orchestrator_sequences(orch_flags, trainer_flags)
    from_trainer = _trainer_sequences(trainer_flags)
    if isinstance(from_orchestrator, _Sequences):
        if from_trainer is not None and from_trainer.count != from_orchestrator.count:
            return f"{from_orchestrator.how} and {from_trainer.how} disagree"
        return from_orchestrator
    if from_trainer is not None:
        return from_trainer
    return from_orchestrator or (
        "neither the orchestrator's --batch_size (no ORCH_ARGV or none there) nor the trainer's"
        " --mini_batch_size gives the prompts per step"
    )


def _orchestrator_sequences(
    orch_flags: Mapping[str, str], trainer_flags: Mapping[str, str]
) -> _Sequences | str:
    """P x G from the orchestrator's --batch_size; "" when it has none, else why not."""
    if "batch_size" not in orch_flags:
        return ""
    prompts = _count(orch_flags, "batch_size", "ORCH_ARGV")
    for flags, whose in ((orch_flags, "the orchestrator's"), (trainer_flags, "the trainer's")):
        if "num_generations" in flags:
            generations = _count(flags, "num_generations", whose)
            named = " and" if flags is orch_flags else f", {whose}"
            return _Sequences(
                prompts * generations,
                f"{prompts} prompts x {generations} generations = {prompts * generations}"
                f" sequences per step (the orchestrator's --batch_size{named} --num_generations)",
            )
    return (
        f"the orchestrator's --batch_size={prompts} counts prompts, and neither command gives"
        " --num_generations"
    )


def _trainer_sequences(trainer_flags: Mapping[str, str]) -> _Sequences | None:
    """The sequences of one update from the trainer's --mini_batch_size (module docstring)."""
    if "mini_batch_size" not in trainer_flags:
        return None
    mini = _count(trainer_flags, "mini_batch_size", "the trainer's")
    if "num_generations" not in trainer_flags:
        return _Sequences(mini, f"the trainer's --mini_batch_size={mini} sequences per step")
    generations = _count(trainer_flags, "num_generations", "the trainer's")
    return _Sequences(
        mini * generations,
        f"{mini} prompts x {generations} generations = {mini * generations} sequences per step"
        " (the trainer's --mini_batch_size and --num_generations)",
    )


def _count(flags: Mapping[str, str], flag: str, whose: str) -> int:
    """A flag's value as a count >= 1, or ConfigError naming whose flag it is."""
    try:
        return values.whole_number(f"--{flag}", flags[flag], minimum=1)
    except ConfigError as error:
        raise ConfigError(f"{whose} {error}") from None
