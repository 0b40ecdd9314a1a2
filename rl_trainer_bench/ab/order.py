"""Arm run orders, and whether an order cancels a steady drift of the machine.

Arms run one after another, so a machine whose steps get steadily faster (or slower) over minutes
makes whichever setting runs later look faster. In the block order A B A' B' the pooled B arms sit
one arm later than the pooled A arms, so a linear drift lands in the delta in full. In the mirrored
order A B B' A' every setting's arms centre on the same moment, so a linear drift moves each
setting's pooled steps by the same amount and the delta keeps none of it. For k settings the mirror
is S1..Sk then Sk..S1. `balance` states, for any order, how far each setting's arms sit from the
run's centre, which is what the printed order line says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rl_trainer_bench.errors import UserError

DESIGN = "separate arms"  # the design these orders serve, as the report names it
MIRRORED, BLOCK, WRITTEN = "mirrored", "block", "written"
ORDERS: Mapping[str, str] = {
    MIRRORED: "each setting once, then again in reverse (A B B' A'): cancels a linear drift",
    BLOCK: "each setting once, then again in the same order (A B A' B'): a drift biases the delta",
    WRITTEN: "the arms exactly as --arms lists them",
}


def run_order(settings: Sequence[str], order: str) -> list[str]:
    """Settings in run order for `order`; `settings` lists each setting once (WRITTEN: as given)."""
    if order == WRITTEN:
        return list(settings)
    repeated = sorted({s for s in settings if settings.count(s) > 1})
    if repeated:
        raise UserError(
            f"--order {order}: --arms repeats {', '.join(repeated)}; list each setting once for "
            f"--order {order}, or pass --order {WRITTEN} to run the arms as listed"
        )
    if order == MIRRORED:
        return [*settings, *reversed(settings)]
    if order == BLOCK:
        return [*settings, *settings]
    raise UserError(f"--order {order!r}: choose one of {', '.join(ORDERS)}")


def default_order(settings: Sequence[str]) -> str:
    """MIRRORED when --arms names each setting once; WRITTEN when it spells out its own repeats."""
    return WRITTEN if len(set(settings)) < len(settings) else MIRRORED


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
