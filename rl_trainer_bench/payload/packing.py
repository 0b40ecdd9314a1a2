"""How a step's micro-batches are packed: the layout's statistics, and the packing drawn from them.

A layout comes from a routing profile (measured in a real run), from an orchestrator's argv
(`layout_from_orchestrator_argv`, under the assumptions `PackingLayout.from_orchestrator` states),
or from its defaults. `draw_packing` turns one into rows of packed sequences for one micro-batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_trainer_bench.config.engine_keys import CommandLine, command_line
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload.errors import ProfileError

SEGMENT_ALIGN = 64  # packed sequences start on multiples of this where the row allows it
# Sequences per GRPO group where the orchestrator's argv does not say (its --num_generations).
DEFAULT_NUM_GENERATIONS = 16


def _check_quantiles(name: str, values: Sequence[float], low: float, high: float) -> None:
    if len(values) < 1:
        raise ProfileError(f"layout.{name} is empty: give at least one quantile")
    if any(not (low <= v <= high) for v in values):
        raise ProfileError(f"layout.{name}={list(values)} must lie in [{low}, {high}]")
    if any(b < a for a, b in itertools.pairwise(values)):
        raise ProfileError(f"layout.{name}={list(values)} must be non-decreasing (quantiles)")


def sample_quantiles(quantiles: Sequence[float], u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws from a distribution given by evenly spaced quantiles (0% .. 100%)."""
    q = np.asarray(quantiles, dtype=np.float64)
    if q.size == 1:
        return np.full(np.shape(u), q[0])
    return np.interp(u * (q.size - 1), np.arange(q.size), q)


@dataclasses.dataclass(frozen=True)
class PackingLayout:
    """How a step's micro-batches are packed: the statistics a synthetic micro-batch reproduces.

    Distributions are given as evenly spaced quantiles (first = minimum, last = maximum), which is
    both what extraction from a real run measures and what a person can write by hand: `(0.6, 1.0)`
    is uniform on [0.6, 1.0], `(1, 1)` is always one.
    """

    rows: int  # B of the step the statistics came from
    seq_len: int  # T of that step
    pad_rows: int = 0  # rows that are all padding
    real_fraction: tuple[float, ...] = (0.6, 1.0)  # real tokens / seq_len of a non-padding row
    segments_per_row: tuple[float, ...] = (
        1.0,
        4.0,
    )  # packed sequences per real row (capped: 2 tokens each)
    prompt_fraction: tuple[float, ...] = (0.05, 0.3)  # prompt tokens / sequence tokens
    group_size: int = 16  # sequences per GRPO group (advantages are normalized within a group)

    def __post_init__(self) -> None:
        if self.rows < 1 or self.seq_len < 2:
            raise ProfileError(
                f"layout.rows={self.rows}, layout.seq_len={self.seq_len}: need rows >= 1 and seq_len >= 2"
            )
        if not 0 <= self.pad_rows < self.rows:
            raise ProfileError(
                f"layout.pad_rows={self.pad_rows} must be in [0, rows={self.rows}): "
                "a micro-batch needs at least one real row"
            )
        if self.group_size < 1:
            raise ProfileError(f"layout.group_size={self.group_size} must be >= 1")
        _check_quantiles("real_fraction", self.real_fraction, 0.0, 1.0)
        _check_quantiles("segments_per_row", self.segments_per_row, 1.0, math.inf)
        _check_quantiles("prompt_fraction", self.prompt_fraction, 0.0, 1.0)
        object.__setattr__(self, "real_fraction", tuple(float(v) for v in self.real_fraction))
        object.__setattr__(self, "segments_per_row", tuple(float(v) for v in self.segments_per_row))
        object.__setattr__(self, "prompt_fraction", tuple(float(v) for v in self.prompt_fraction))

    @classmethod
    def from_orchestrator(
        cls,
        rows: int,
        seq_len: int,
        max_prompt_length: int,
        max_response_length: int,
        *,
        num_generations: int = DEFAULT_NUM_GENERATIONS,
        pad_rows: int = 0,
    ) -> PackingLayout:
        """The layout an orchestrator with these argv values produces, under stated assumptions.

        The orchestrator's argv gives only maxima, so: prompt and response lengths are taken as
        uniform up to their maxima (a mean sequence of half the maximum), rows are packed to 60-100%
        of `seq_len`, a row holds from one sequence up to `seq_len` / mean sequence length, and the
        prompt's share of a sequence ranges from half to one and a half times
        max_prompt / (max_prompt + max_response). A profile extracted from a real run replaces
        these guesses with measurements.
        """
        if min(max_prompt_length, max_response_length) < 1:
            raise ProfileError(
                f"max_prompt_length={max_prompt_length}, max_response_length={max_response_length}: "
                "both must be >= 1"
            )
        mean_sequence = (max_prompt_length + max_response_length) / 2
        most_segments = max(1.0, math.floor(seq_len / mean_sequence))
        share = max_prompt_length / (max_prompt_length + max_response_length)
        return cls(
            rows=rows,
            seq_len=seq_len,
            pad_rows=pad_rows,
            real_fraction=(0.6, 1.0),
            segments_per_row=(1.0, most_segments),
            prompt_fraction=(share / 2, min(0.95, 1.5 * share)),
            group_size=num_generations,
        )

    def for_shape(self, rows: int, seq_len: int) -> PackingLayout:
        """This layout for a micro-batch of `rows` x `seq_len`.

        Fractions carry over unchanged; padding rows scale with the row count (rounded, always
        leaving one real row); segments per row are capped at what `seq_len` can hold (2 tokens
        per sequence: a prompt token and a completion token).
        """
        if (rows, seq_len) == (self.rows, self.seq_len):
            return self
        pad_rows = min(rows - 1, round(self.pad_rows * rows / self.rows))
        segments = tuple(min(v, seq_len // 2) for v in self.segments_per_row)
        return dataclasses.replace(
            self, rows=rows, seq_len=seq_len, pad_rows=pad_rows, segments_per_row=segments
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "real_fraction": list(self.real_fraction),
            "segments_per_row": list(self.segments_per_row),
            "prompt_fraction": list(self.prompt_fraction),
        }


def layout_from_orchestrator_argv(
    engine: EngineConfig, argv: CommandLine | Sequence[str]
) -> PackingLayout:
    """The packing layout of the orchestrator whose argv is `argv` (ORCH_ARGV).

    Reads `--max_prompt_length` and `--max_response_length` (both required), `--num_generations`
    (default DEFAULT_NUM_GENERATIONS) and `--pad_rows` (default 0); the micro-batch's rows and length stay the engine's.
    """
    flags = command_line(argv).flags
    missing = [k for k in ("max_prompt_length", "max_response_length") if k not in flags]
    if missing:
        raise UserError(
            f"ORCH_ARGV lacks --{' and --'.join(missing)}: the packing layout needs both lengths"
        )
    values = {"num_generations": DEFAULT_NUM_GENERATIONS, "pad_rows": 0}
    for key in ("max_prompt_length", "max_response_length", "num_generations", "pad_rows"):
        if key in flags:
            try:
                values[key] = int(flags[key])
            except ValueError:
                raise UserError(f"ORCH_ARGV --{key}={flags[key]!r}: write a whole number") from None
    return PackingLayout.from_orchestrator(
        engine.micro_batch_rows,
        engine.seq_len,
        values["max_prompt_length"],
        values["max_response_length"],
        num_generations=values["num_generations"],
        pad_rows=values["pad_rows"],
    )


def _segment_lengths(real: int, segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths of `segments` packed sequences filling `real` tokens, each at least 2 tokens.

    Cut points sit on multiples of SEGMENT_ALIGN when the row has at least one aligned unit per
    segment; otherwise they fall anywhere. Either way the lengths are a random composition
    (sorted uniform cut points), which cannot fail the way sampling distinct cut points from too
    small a population does.
    """
    if segments == 1:
        return np.array([real])
    units = real // SEGMENT_ALIGN
    if units >= segments:
        spare = units - segments  # aligned units beyond one per segment
        cuts = np.sort(rng.integers(0, spare + 1, segments - 1))
        lengths = (np.diff(cuts, prepend=0, append=spare) + 1) * SEGMENT_ALIGN
        lengths[-1] += real - units * SEGMENT_ALIGN
        return lengths
    spare = real - 2 * segments
    cuts = np.sort(rng.integers(0, spare + 1, segments - 1))
    return np.diff(cuts, prepend=0, append=spare) + 2


@dataclasses.dataclass(frozen=True)
class Packing:
    """The micro-batch's packed sequences: per row its real length, and every sequence's extent."""

    real_lengths: np.ndarray  # [B]
    row: np.ndarray  # [S] row of each sequence
    start: np.ndarray  # [S] first token
    length: np.ndarray  # [S]
    prompt: np.ndarray  # [S] prompt tokens (>= 1), the rest is completion (>= 1)

    def segment_ids(self, shape: tuple[int, int]) -> np.ndarray:
        """[B, T] int32: sequence i of a row is segment i + 1 of that row, padding 0."""
        ids = np.zeros(shape, np.int32)
        for b in np.unique(self.row):
            lengths = self.length[self.row == b]
            ids[b, : int(lengths.sum())] = np.repeat(np.arange(1, lengths.size + 1), lengths)
        return ids


def draw_packing(layout: PackingLayout, rng: np.random.Generator) -> Packing:
    rows, seq_len = layout.rows, layout.seq_len
    real_lengths = np.zeros(rows, np.int64)
    real_rows = np.sort(rng.permutation(rows)[: rows - layout.pad_rows])
    fractions = sample_quantiles(layout.real_fraction, rng.random(real_rows.size))
    real_lengths[real_rows] = np.clip(np.round(fractions * seq_len), 2, seq_len)
    wanted = sample_quantiles(layout.segments_per_row, rng.random(real_rows.size))
    row, start, length = [], [], []
    for b, count in zip(real_rows, np.round(wanted).astype(np.int64), strict=True):
        count = int(np.clip(count, 1, real_lengths[b] // 2))
        lengths = _segment_lengths(int(real_lengths[b]), count, rng)
        row.append(np.full(count, b))
        start.append(np.cumsum(lengths) - lengths)
        length.append(lengths)
    row, start, length = (np.concatenate(x) for x in (row, start, length))
    share = sample_quantiles(layout.prompt_fraction, rng.random(length.size))
    prompt = np.clip(np.round(share * length), 1, length - 1).astype(np.int64)
    return Packing(real_lengths, row, start, length, prompt)
