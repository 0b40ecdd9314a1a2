"""Arm run orders, and whether an order cancels a steady drift of the machine.

Arms run one after another, so a machine whose steps get steadily faster (or slower) over minutes
makes whichever setting runs later look faster. In the block order A B A' B' the pooled B arms sit
one arm later than the pooled A arms, so a linear drift lands in the delta in full. In the mirrored
order A B B' A' every setting's arms centre on the same moment, so a linear drift moves each
setting's pooled steps by the same amount and the delta keeps none of it. For k settings the mirror
is S1..Sk then Sk..S1. `balance` states, for any order, how far each setting's arms sit from the
run's centre, which is what the printed order line says.

The mirrored order cancels only a *linear* drift, and only if the whole run drifts on one line. A
shared host whose load is heavier at the ends of the run than in the middle puts both baseline arms
under the load and both other arms in the quiet middle: the delta then carries the load in full,
and the two baseline arms, loaded alike, agree with each other, so no spread of repeats shows it.
The `blocks` order (the default)
runs many short blocks instead, each every setting there and back (A B B A), so a drift cancels
within each block to first order. The blocks come in complementary pairs (ABBA BAAB or BAAB ABBA),
so the curvature one block keeps is taken back by its partner and a U-shaped (quadratic) drift
cancels exactly in each pair. Which way each pair turns is drawn afresh for every run from the
schedule seed (`block_turns`): a load locked to places in the run (other work that starts with
ours, or always lands a fixed time after it) then falls on either setting at random, an error the
interval carries, rather than on the same setting in every run, a bias no repeat would show. Each
block is one repeat of the whole experiment: the spread of the blocks' differences is the noise
the verdict's interval is built from (score.py), whatever its source. `blocks_of` finds the blocks
in any run order, so an order spelled out with --arms is scored the same way when it is made of
balanced blocks.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

from rl_trainer_bench.errors import UserError

DESIGN = "separate arms"  # the design these orders serve, as the report names it
BLOCKED_DESIGN = f"{DESIGN} in blocks"  # the same, scored block by block (`blocks_of`)
# The same, looked at as it runs and stopped when settled (sequential.py)
SEQUENTIAL_DESIGN = f"{BLOCKED_DESIGN}, looked at after every half-block"
BLOCKS, MIRRORED, BLOCK, WRITTEN = "blocks", "mirrored", "block", "written"
DEFAULT_BLOCKS = 6
MIN_BLOCKS = 3  # the fewest blocks an interval over blocks is scored from (two degrees of freedom)
ORDERS: Mapping[str, str] = {
    BLOCKS: "--blocks blocks, each every setting there and back (A B B' A'), in complementary "
    "pairs (ABBA BAAB or BAAB ABBA) turned at random from --schedule-seed: scored block by block",
    MIRRORED: "each setting once, then again in reverse (A B B' A'): cancels a linear drift",
    BLOCK: "each setting once, then again in the same order (A B A' B'): a drift biases the delta",
    WRITTEN: "the arms exactly as --arms lists them",
}


def run_order(
    settings: Sequence[str], order: str, blocks: int = DEFAULT_BLOCKS, seed: int = 0
) -> list[str]:
    """Settings in run order for `order`; `settings` lists each setting once (WRITTEN: as given);
    `blocks` is the number of blocks of the BLOCKS order, `seed` draws their turns."""
    if order == WRITTEN:
        return list(settings)
    repeated = sorted({s for s in settings if settings.count(s) > 1})
    if repeated:
        raise UserError(
            f"--order {order}: --arms repeats {', '.join(repeated)}; list each setting once for "
            f"--order {order}, or pass --order {WRITTEN} to run the arms as listed"
        )
    if order == BLOCKS:
        there_and_back = [*settings, *reversed(settings)]
        back_and_there = [*reversed(settings), *settings]
        return [
            name
            for turned in block_turns(blocks, seed)
            for name in (back_and_there if turned else there_and_back)
        ]
    if order == MIRRORED:
        return [*settings, *reversed(settings)]
    if order == BLOCK:
        return [*settings, *settings]
    raise UserError(f"--order {order!r}: choose one of {', '.join(ORDERS)}")


def default_order(settings: Sequence[str]) -> str:
    """BLOCKS when --arms names each setting once; WRITTEN when it spells out its own repeats."""
    return WRITTEN if len(set(settings)) < len(settings) else BLOCKS


def block_turns(blocks: int, seed: int) -> list[bool]:
    """Whether each block runs back and there (B A A B) rather than there and back, drawn from
    `seed`: one coin per pair of blocks, the pair's second block the first one's complement; an
    odd last block has its own coin."""
    coins = random.Random(seed)
    turns: list[bool] = []
    while len(turns) < blocks:
        turned = coins.random() < 0.5
        turns += [turned, not turned]
    return turns[:blocks]


def orientations(settings_in_run_order: Sequence[str], baseline: str) -> list[str] | None:
    """Each block's orientation in letters, A the baseline, B, ... the others as they first run
    (ABBA, BAAB): what ab.json and the report record; None when the run is not in blocks."""
    blocks = blocks_of(settings_in_run_order)
    if blocks is None:
        return None
    letters = {baseline: "A"}
    for setting in settings_in_run_order:
        letters.setdefault(setting, chr(ord("A") + len(letters)))
    return ["".join(letters[settings_in_run_order[i]] for i in block) for block in blocks]


def blocks_of(settings_in_run_order: Sequence[str]) -> list[range] | None:
    """The run cut into the shortest consecutive blocks in which every setting runs equally often
    and centred on the block's middle (so a drift linear within the block cancels in it); None
    when the run cannot be cut so, or gives fewer than MIN_BLOCKS blocks."""
    names = set(settings_in_run_order)
    blocks, start = [], 0
    for end in range(1, len(settings_in_run_order) + 1):
        if balance(settings_in_run_order[start:end]).offsets.keys() == names and _balanced(
            settings_in_run_order[start:end]
        ):
            blocks.append(range(start, end))
            start = end
    if start != len(settings_in_run_order) or len(blocks) < MIN_BLOCKS:
        return None
    return blocks


def _balanced(block: Sequence[str]) -> bool:
    counts = {name: block.count(name) for name in block}
    return len(set(counts.values())) == 1 and balance(block).cancels_linear_drift


@dataclasses.dataclass(frozen=True)
class Balance:
    """Each setting's mean arm position relative to the run's centre (0: centred), in arms."""

    offsets: dict[str, float]

    @property
    def cancels_linear_drift(self) -> bool:
        """Equal mean positions: a drift linear in time shifts every setting's pool alike."""
        values = list(self.offsets.values())
        return max(values) - min(values) < 1e-9

    def describe(self) -> str:
        if self.cancels_linear_drift:
            return "every setting centred on the same moment: a linear drift cancels in the delta"
        late = max(self.offsets, key=self.offsets.__getitem__)
        early = min(self.offsets, key=self.offsets.__getitem__)
        gap = self.offsets[late] - self.offsets[early]
        return (
            f"{late} runs {gap:g} arm(s) later than {early} on average: a linear drift "
            "biases the delta (see the drift line)"
        )


def balance(settings_in_run_order: Sequence[str]) -> Balance:
    """How far each setting's arms sit, on average, from the centre of the run."""
    centre = (len(settings_in_run_order) - 1) / 2
    positions: dict[str, list[int]] = {}
    for index, setting in enumerate(settings_in_run_order):
        positions.setdefault(setting, []).append(index)
    return Balance({s: sum(p) / len(p) - centre for s, p in positions.items()})


def describe(settings_in_run_order: Sequence[str]) -> str:
    """What the run order does about a drift, as the order line and the report say it."""
    blocks = blocks_of(settings_in_run_order)
    if blocks is None:
        return balance(settings_in_run_order).describe()
    return (
        f"{len(blocks)} blocks, each balanced: a drift linear within a block cancels in it, and "
        "the spread of the blocks' differences is the noise the interval is built from"
    )
