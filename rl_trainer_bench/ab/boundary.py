"""The step boundary's copy in an A/B: what was predicted, beside what the steps measured.

Each bench times its micro-batch's copy alone after its compile (`bench/host_link.py`). That is
the prediction for the first `fwd_bwd` after an unstaged boundary, which waits for the copy on an
idle device; after a staged boundary only the part of the copy that outlasts the step's last
`fwd_bwd` is predicted to remain (`bench/boundary_copy.exposed_with_stage`), read against the
steps' own median regular call. The steps measure the first call's extra after each kind of
boundary and the fraction of each staged copy the device's work hid (step_record.py). Only the
steps' own figures enter the verdict; these lines say whether the prediction a plan prints
before launch held.

A staged boundary is only worth its copy if staging costs less than the copy: where the staged
steps lost more to staging (the device idle while the host staged and waited, and the first
call's extra after a staged boundary) than the unstaged first call waited for its copy, a verdict
on STAGE_BEFORE_UPDATE measures the engine's staging path, not what the switch can save, and a
line says so with the figures.
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
    # seconds of a staging step's stage and wait with the device idle (its staging's cost), median
    stage_exposed_s: float | None = None
    staging_path: str = ""  # the engine's staging path, as its header names it

    @property
    def staging_cost_s(self) -> float | None:
        """What a staged boundary cost a step: the device idle through its staging, and the first
        call's extra after it."""
        if self.stage_exposed_s is None:
            return None
        return self.stage_exposed_s + (self.staged_extra_s or 0.0)

    @property
    def hid_s(self) -> float:
        """The copy staging hides: what the first call waited for after an unstaged boundary
        where the steps measured it, else the copy timed alone."""
        return self.copy_s if self.unstaged_extra_s is None else self.unstaged_extra_s

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
        lines = [f"{text}; {'; '.join(parts)}" if parts else text]
        cost = self.staging_cost_s
        if cost is not None and cost > self.hid_s:
            lines.append(
                f"staging costs more than the copy it hides: a staged step lost"
                f" {milliseconds(cost)} ms to staging (the device idle"
                f" {milliseconds(self.stage_exposed_s)} ms while the host staged and waited, the"
                f" first call's extra after it {milliseconds(self.staged_extra_s or 0.0)} ms)"
                f" against the {milliseconds(self.hid_s)} ms copy it hides; a verdict on"
                f" STAGE_BEFORE_UPDATE measures the staging path of"
                f" {self.staging_path or 'the engine'}, not what the switch saves"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "predicted_staged_s": self.predicted_staged_s,
            "staging_cost_s": self.staging_cost_s,
        }


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
        stage_exposed_s=_median(r.stage_exposed_s for r in after[False] + after[True] if r.staged),
        staging_path=next((run.staging_path for run in runs if run.staged), ""),
    )


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
