"""Exact checks across A/B arms: did every arm train the same thing, the same way?

A time difference means something only if the arms did the same work: the same micro-batches in the
same order, the same loss denominators, one update per step, one stage at every boundary where
staging is on (every scored step of a staged setting included), no compile inside a scored step,
and finite training metrics in every step. These are equalities, not statistics, so any failure
makes the whole A/B FAIL whatever the times say. Each check reports what it compared and, on
failure, the first place the arms parted; a check with nothing to compare never passes (it fails,
or is SKIP where the inputs do not carry what it needs).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

from rl_trainer_bench.bench.step_record import ArmRun

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # PASS | FAIL | SKIP (the inputs do not carry what the check needs)
    detail: str


def exact_checks(runs: Sequence[ArmRun]) -> list[CheckResult]:
    """Run every exact check over the arms, in a stable order."""
    return [check(runs) for check in CHECKS]


def failed(results: Sequence[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status == FAIL]


def same_micro_batches(runs: Sequence[ArmRun]) -> CheckResult:
    """Every arm trains the same micro-batches (by content digest) in the same order.

    Names are shown but not compared: they label a position in a run, the digest is the content.
    """
    name = "same micro-batch digests in the same order"
    other_warm_up = _other_warm_up(runs)
    if other_warm_up:
        return CheckResult(name, FAIL, other_warm_up)
    reference = runs[0]
    expected = _batches(reference)
    for run in runs[1:]:
        got = _batches(run)
        for index, (want, have) in enumerate(zip(expected, got, strict=False)):
            if want[1] != have[1]:
                return CheckResult(
                    name,
                    FAIL,
                    f"micro-batch {index}: {reference.label} trained {want[0]} ({want[1][:12]}), "
                    f"{run.label} trained {have[0]} ({have[1][:12]})",
                )
        if len(got) != len(expected):
            return CheckResult(
                name,
                FAIL,
                f"{reference.label} trained {len(expected)} micro-batches, {run.label} {len(got)}",
            )
    if not expected or any(not digest for _, digest in expected):
        return CheckResult(name, FAIL, f"{reference.label} recorded no content digests")
    return CheckResult(
        name, PASS, f"{len(runs)} arms x {len(expected)} micro-batches, digests equal in order"
    )


def same_loss_denominators(runs: Sequence[ArmRun]) -> CheckResult:
    """Every arm reports the same loss denominator (completion tokens) at each step, exactly."""
    name = "same loss denominators per step"
    other_warm_up = _other_warm_up(runs)
    if other_warm_up:
        return CheckResult(name, FAIL, other_warm_up)
    reference = runs[0]
    expected = [r.loss_denominator for r in reference.records]
    if not expected:
        return CheckResult(name, FAIL, f"{reference.label} recorded no steps")
    for run in runs[1:]:
        got = [r.loss_denominator for r in run.records]
        if len(got) != len(expected):
            return CheckResult(
                name, FAIL, f"{reference.label} has {len(expected)} steps, {run.label} {len(got)}"
            )
        for index, (want, have) in enumerate(zip(expected, got, strict=True)):
            if want != have:
                return CheckResult(
                    name,
                    FAIL,
                    f"step {index}: {reference.label} divided by {want!r}, {run.label} by {have!r}",
                )
    return CheckResult(name, PASS, f"{len(expected)} steps, equal in every arm")


def same_updates(runs: Sequence[ArmRun]) -> CheckResult:
    """Every arm applies one optimizer update per step, so all arms apply the same number."""
    name = "same number of updates"
    if any(run.updates is None for run in runs):
        return CheckResult(name, SKIP, "update counts are not in the inputs (logs)")
    for run in runs:
        if run.updates != len(run.records):
            return CheckResult(
                name,
                FAIL,
                f"{run.label} applied {run.updates} updates in {len(run.records)} steps",
            )
    counts = {run.updates for run in runs}
    if counts == {0}:
        return CheckResult(name, FAIL, "no arm applied an update")
    if len(counts) > 1:
        return CheckResult(name, FAIL, ", ".join(f"{r.label}: {r.updates}" for r in runs))
    return CheckResult(name, PASS, f"{counts.pop()} updates in every arm, one per step")


def one_stage_per_boundary(runs: Sequence[ArmRun]) -> CheckResult:
    """Each boundary set to stage stages exactly the next step's first micro-batch, the others
    stage nothing; every step closes with a boundary, an arm's last included (its stage, for a step
    the arm does not train, must be there all the same). So every scored step of a staged setting
    timed its stage: a verdict on a setting that acts at the boundary has seen it act. Arms none
    of which stages at a scored step leave nothing to check: SKIP, never PASS."""
    name = "one stage per boundary in staged arms"
    for run in runs:
        failure = _stage_failure(run)
        if failure:
            return CheckResult(name, FAIL, failure)
    staged = {}
    for run in runs:
        expected = run.stages_expected()
        count = sum(should for r, should in zip(run.records, expected, strict=True) if not r.warmup)
        if count:
            staged[run.label] = count
    if not staged:
        return CheckResult(name, SKIP, "no arm stages at a scored step: nothing to check")
    return CheckResult(
        name,
        PASS,
        "every scored step of a staged setting closed with one stage ("
        + ", ".join(f"{label}: {count}" for label, count in staged.items())
        + "); none at a boundary set to not stage",
    )


def _stage_failure(run: ArmRun) -> str:
    """Where `run`'s stages part from its boundaries' settings ("": nowhere)."""
    expected = run.stages_expected()
    if len(expected) != len(run.records):
        return f"{run.label}: {len(expected)} boundary settings for {len(run.records)} steps"
    stages = run.stages
    if stages is None:
        stages = sum(r.staged is not None for r in run.records)
    if stages != sum(expected):
        kind = "staged" if run.staged else "unstaged"
        return (
            f"{kind} arm {run.label}: {stages} stages over {len(expected)} boundaries, "
            f"expected {sum(expected)}"
        )
    for index, (step, should) in enumerate(zip(run.records, expected, strict=True)):
        following = run.records[index + 1] if index + 1 < len(run.records) else None
        if should and step.staged is None:
            return f"{run.label} step {step.step} staged nothing at a boundary set to stage"
        if should and following is not None and step.staged != following.micro_batches[0]:
            return (
                f"{run.label} step {step.step} staged {step.staged}, "
                f"but step {following.step} started with {following.micro_batches[0]}"
            )
        if not should and step.staged is not None:
            return f"{run.label} step {step.step} staged at a boundary set to not stage"
    return ""


def no_scored_recompiles(runs: Sequence[ArmRun]) -> CheckResult:
    """No program compiles during a scored step (a compile there would be timed as step time)."""
    name = "no recompiles in scored steps"
    for run in runs:
        if not run.scored:
            return CheckResult(name, FAIL, f"{run.label} scored no step")
        programs = list(run.recompiles or [])
        steps = [r.step for r in run.scored if r.recompiles]
        if programs or steps:
            where = f" at step(s) {steps}" if steps else ""
            what = f": {', '.join(programs)}" if programs else ""
            return CheckResult(name, FAIL, f"{run.label} compiled during scored steps{where}{what}")
    return CheckResult(
        name, PASS, f"{sum(len(r.scored) for r in runs)} scored steps, none compiled"
    )


def finite_metrics(runs: Sequence[ArmRun]) -> CheckResult:
    """Every step of every arm reports a finite loss, gradient norm and loss denominator: a
    diverged or broken engine's step times do not time a working trainer."""
    name = "finite loss, grad norm and loss denominator"
    for run in runs:
        for record in run.records:
            if record.non_finite:
                return CheckResult(
                    name,
                    FAIL,
                    f"{run.label} step {record.step}: {', '.join(record.non_finite)} not finite",
                )
    if not any(run.records for run in runs):
        return CheckResult(name, FAIL, "no arm recorded a step")
    return CheckResult(name, PASS, f"{sum(len(r.records) for r in runs)} steps, all finite")


def _other_warm_up(runs: Sequence[ArmRun]) -> str:
    """Where an arm warmed up for another number of steps than the first ("": none did). The
    micro-batches a step trains follow its number, warm-up steps counted, so such arms score other
    micro-batches (runs of two engines warm up as each needs unless told: cross-pod logs)."""
    reference = runs[0]
    expected = _warm_up_steps(reference)
    for run in runs[1:]:
        got = _warm_up_steps(run)
        if got != expected:
            return (
                f"{reference.label} warmed up {expected} step(s), {run.label} {got}: their scored"
                " steps train other micro-batches; give every run the same WARMUP_STEPS"
                " (--warmup-steps)"
            )
    return ""


def _warm_up_steps(run: ArmRun) -> int:
    return sum(record.warmup for record in run.records)


def _batches(run: ArmRun) -> list[tuple[str, str]]:
    return [
        (name, digest)
        for record in run.records
        for name, digest in itertools.zip_longest(
            record.micro_batches, record.digests, fillvalue=""
        )
    ]


CHECKS: tuple[Callable[[Sequence[ArmRun]], CheckResult], ...] = (
    same_micro_batches,
    same_loss_denominators,
    same_updates,
    one_stage_per_boundary,
    no_scored_recompiles,
    finite_metrics,
)
