"""The step boundary's copy in an A/B: what was predicted, beside what the steps measured.

Each bench times its micro-batch's copy alone after its compile (`bench/host_link.py`). That is
the prediction for the first `fwd_bwd` after an unstaged boundary, which waits for the copy on an
idle device; after a staged boundary only the part of the copy that outlasts the step's last
`fwd_bwd` is predicted to remain (`bench/boundary_copy.exposed_with_stage`), read against the
steps' own median regular call. The steps measure the first call's extra after each kind of
boundary and the fraction of each staged copy the device's work hid (step_record.py). Only the
steps' own figures enter the verdict; these lines say whether the prediction a plan prints
before launch held.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from rl_trainer_bench.bench.boundary_copy import exposed_with_stage
from rl_trainer_bench.bench.step_record import ArmRun, StepRecord
from rl_trainer_bench.units import milliseconds


@dataclasses.dataclass(frozen=True)
class BoundaryComparison:
    copy_s: float  # the micro-batch's copy timed alone (median over the benches that timed it)
    fwd_bwd_s: float | None  # a regular (not first) fwd_bwd's device seconds, median
    unstaged_extra_s: float | None  # first call's extra after an unstaged boundary, median
    staged_extra_s: float | None  # first call's extra after a staged boundary, median
    hidden: float | None  # fraction of a staged copy the device's work hid, median
    stage_wait_s: float | None  # host seconds a staging step waited before `update`, median

    @property
    def predicted_staged_s(self) -> float | None:
        if self.fwd_bwd_s is None:
            return None
        return exposed_with_stage(self.copy_s, self.fwd_bwd_s)

    def lines(self) -> list[str]:
        """The report's lines: the prediction beside each measured figure."""
        text = f"step boundary: the micro-batch's copy alone {milliseconds(self.copy_s)} ms"
        parts = []
        if self.unstaged_extra_s is not None:
            parts.append(
                f"the first call's extra after an unstaged boundary"
                f" {milliseconds(self.unstaged_extra_s)} ms (predicted: the copy,"
                f" {milliseconds(self.copy_s)} ms)"
            )
        if self.staged_extra_s is not None and self.predicted_staged_s is not None:
            parts.append(
                f"after a staged one {milliseconds(self.staged_extra_s)} ms (predicted"
                f" {milliseconds(self.predicted_staged_s)} ms: what of the copy outlasts a"
                f" {milliseconds(self.fwd_bwd_s)} ms fwd_bwd)"
            )
        if self.hidden is not None:
            parts.append(f"the staged copies {self.hidden:.0%} hidden by the device's work")
        if self.stage_wait_s is not None and self.fwd_bwd_s is not None:
            parts.append(
                f"a staging step waited {milliseconds(self.stage_wait_s)} ms for the device before"
                f" update (the last fwd_bwd's {milliseconds(self.fwd_bwd_s)} ms, and any of the"
                " copy past it)"
            )
        return [f"{text}; {'; '.join(parts)}" if parts else text]

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "predicted_staged_s": self.predicted_staged_s}


def compare(runs: Sequence[ArmRun]) -> BoundaryComparison | None:
    """The comparison over `runs`' scored steps; None where no bench timed its copy."""
    copies = [run.boundary_copy_s for run in runs if run.boundary_copy_s is not None]
    if not copies:
        return None
    after: dict[bool, list[StepRecord]] = {False: [], True: []}
    for run in runs:
        expected = run.stages_expected()
        for index, record in enumerate(run.records):
            if not record.warmup:  # a scored step; its boundary closed the step before it
                after[expected[index - 1] if index else run.staged].append(record)
    return BoundaryComparison(
        copy_s=statistics.median(copies),
        fwd_bwd_s=_median(
            statistics.median(r.fwd_bwd_device_s[1:])
            for r in after[False] + after[True]
            if len(r.fwd_bwd_device_s) > 1
        ),
        unstaged_extra_s=_median(r.first_call_extra_s for r in after[False]),
        staged_extra_s=_median(r.first_call_extra_s for r in after[True]),
        hidden=_median(r.stage_hidden for r in after[False] + after[True]),
        stage_wait_s=_median(r.device_wait_s for r in after[False] + after[True] if r.staged),
    )


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
