"""Interleaved boundaries: two stage settings take turns at the step boundaries of one run.

Arms that differ only in the stage knobs share one compiled bench and train the same parameters, so
instead of running each setting as its own arm, one run switches setting at its boundaries. A
boundary's setting decides how the next step's first micro-batch gets to the device; a step pays for
the boundary that closes it (the stage's copy and its wait) and gains from the one that opens it
(a first call with its input already there), so a step shows one setting's full cost only when both
its boundaries have that setting: such a step is *pure*.

The schedule is made of blocks of four boundaries, AABB or BBAA. Block j covers the steps
W+4j .. W+4j+3 (W warm-up steps): step W+4j is pure in the block's first setting, step W+4j+2 pure
in its second, and those two form the block's pair; the other two steps mix the settings and are
recorded but never scored. Each aligned pair of blocks holds one AABB and one BBAA, in an order
drawn from the seed, so every window of eight boundaries is balanced and no setting runs more than
four boundaries in a row. A linear drift adds two steps' worth of drift to one block's difference
and takes it back in the other's, so the score's unit is the mean difference of an aligned pair of
blocks (`units`): in A A B B B B A A the pure steps are A, B, B, A, and a linear drift cancels in
each unit exactly. A median over single blocks would not do: their differences fall in two clusters
a drift apart, and the median of two clusters lands anywhere in the gap. The run adds two warm-up steps to those asked for, and
the warm-up boundaries alternate, so each setting's stage and the first call that consumes it have
run before anything is scored (a first run of a path may compile).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from rl_trainer_bench.ab.arms import ArmSpec
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.errors import UserError

DESIGN = "interleaved boundaries"  # as the report names it
BLOCK = 4  # boundaries per block
MIN_PAIRS = 4  # two units: the fewest an interval over units needs
EXTRA_WARMUP = 2  # warm-up steps added so that both settings' boundaries run before scoring
MIXED = "mixed"  # the setting name of a step whose two boundaries differ


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which setting each boundary uses, by the step it closes (boundary k closes step k)."""

    settings: tuple[str, str]  # (baseline, other)
    warmup_steps: int
    boundaries: tuple[str, ...]  # one per step but the last: the setting of the boundary closing it
    seed: int

    @property
    def total_steps(self) -> int:
        return len(self.boundaries) + 1

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(baseline step, other step) of each block, in run order."""
        out = []
        for start in range(self.warmup_steps, self.total_steps, BLOCK):
            first, second = start, start + 2
            if self.setting_of_step(first) == self.settings[0]:
                out.append((first, second))
            else:
                out.append((second, first))
        return out

    @property
    def units(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """The pairs of each aligned pair of blocks: one AABB and one BBAA, the score's unit."""
        pairs = self.pairs
        return [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)]

    def setting_of_step(self, step: int) -> str:
        """The setting of a step both of whose boundaries agree, else MIXED (also for step 0 and
        the last step, which have one boundary only)."""
        if step == 0 or step >= len(self.boundaries):
            return MIXED
        opening, closing = self.boundaries[step - 1], self.boundaries[step]
        return opening if opening == closing else MIXED

    def describe(self) -> str:
        a, b = self.settings
        return (
            f"{len(self.pairs)} pairs of pure {a}/{b} steps in {self.total_steps} steps, "
            f"blocks AABB/BBAA balanced in pairs, seed {self.seed}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "settings": list(self.settings),
            "warmup_steps": self.warmup_steps,
            "boundaries": list(self.boundaries),
            "pairs": [list(p) for p in self.pairs],
            "seed": self.seed,
        }


def make_schedule(
    settings: tuple[str, str], *, pairs: int, warmup_steps: int, seed: int
) -> Schedule:
    """A balanced schedule with at least `pairs` pairs (rounded up to even) after `warmup_steps`
    + EXTRA_WARMUP warm-up steps; the same seed gives the same schedule."""
    if pairs < MIN_PAIRS or warmup_steps < 1:
        raise UserError(
            f"--design interleaved needs --steps >= {MIN_PAIRS} (two pairs of blocks, the least "
            "an interval can be had from) and --warmup-steps >= 1"
        )
    a, b = settings
    blocks = pairs + pairs % 2
    rng = random.Random(seed)
    warmup_steps += EXTRA_WARMUP
    last = warmup_steps - 2  # the warm-up boundaries, alternating, the last one `a`, one before `b`
    warmup = [a if (last - k) % 2 == 0 else b for k in range(warmup_steps - 1)]
    scheduled: list[str] = []
    for _ in range(blocks // 2):
        first, second = (a, b) if rng.random() < 0.5 else (b, a)
        scheduled += [first, first, second, second, second, second, first, first]
    return Schedule(settings, warmup_steps, tuple(warmup + scheduled), seed)


def stage_only_settings(arms: Sequence[ArmSpec]) -> tuple[ArmSpec, ArmSpec]:
    """The two settings an interleaved run switches between; refuses arms it cannot interleave."""
    settings = list({arm.setting: arm for arm in arms}.values())
    if len(settings) != 2:
        raise UserError(
            f"--design interleaved: switches between two settings, --arms has {len(settings)} "
            f"({', '.join(a.setting for a in settings)}); give two, e.g. --arms off,on"
        )
    baseline, other = settings
    if baseline.program_knobs != other.program_knobs:
        differ = sorted(set(baseline.program_knobs) ^ set(other.program_knobs))
        keys = sorted({key for key, _ in differ})
        raise UserError(
            f"--design interleaved: {baseline.setting} and {other.setting} differ in "
            f"{', '.join(keys)}, which changes compiled programs; interleave only STAGE_* knobs, "
            "or use --design arms"
        )
    return baseline, other


def paired_steps_by_setting(run: ArmRun, schedule: Schedule) -> list[ArmRun]:
    """One view per setting holding its paired steps: what the table and the plot show as that
    setting's arm (the checks read the whole run)."""
    views = []
    for index, setting in enumerate(schedule.settings):
        steps = {pair[index] for pair in schedule.pairs}
        records = [r for r in run.records if r.step in steps]
        views.append(
            ArmRun(
                label=setting,
                setting=setting,
                staged=any(r.staged is not None for r in records),
                records=records,
                source=run.source,
            )
        )
    return views
