"""`aot --ab-arms`: every program set of a same-pod A/B compiled for the slice, and the A/B refused
before launch when one does not fit.

The arms of a same-pod A/B share one state on the device, each arm's programs compiled against it
(`ab/aot_arms.py` finds the program sets, with the knobs each arm runs), so the device holds one
state beside whichever arm's program runs: the A/B's peak is the largest of the arms' peaks, each
one state plus that arm's program, never a sum over arms. Each set is checked as a plain `aot`
checks its cell (`check.check_cell`, on the set's resolved plan), and the A/B passes only when every set fits with the margin.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from rl_trainer_bench.config.knobs import DRIVER_KNOBS, StageConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot.check import Cell, check_cell, resolve_cell
from rl_trainer_bench.preflight.aot.report import AotReport, format_report
from rl_trainer_bench.units import human_bytes

# (the settings that compile it, its knobs: ENGINE, TRAINER_ARGV, ENGINE_FLAGS, ...)
ProgramSet = tuple[tuple[str, ...], Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class ArmCheck:
    settings: tuple[str, ...]
    knobs: Mapping[str, str]
    report: AotReport


@dataclasses.dataclass(frozen=True)
class AbCheck:
    """Every program set's report, and the A/B's verdict from them."""

    arms: str  # as --ab-arms gave them
    checks: tuple[ArmCheck, ...]

    @property
    def largest(self) -> ArmCheck:
        return max(self.checks, key=lambda check: check.report.peak)

    @property
    def refused(self) -> list[ArmCheck]:
        """The program sets that do not fit with the margin free (or whose fit is unknown)."""
        return [check for check in self.checks if not check.report.margin_met]

    def to_json(self) -> dict:
        return {
            "ab_arms": self.arms,
            "program_sets": [
                {"settings": list(c.settings), "knobs": dict(c.knobs), "report": c.report.to_json()}
                for c in self.checks
            ],
            "peak_bytes": self.largest.report.peak,
            "margin_met": not self.refused,
            "refused_settings": [setting for c in self.refused for setting in c.settings],
        }


def run_ab_check(
    args: argparse.Namespace, sets: Sequence[ProgramSet], progress: Callable[[str], None]
) -> AbCheck:
    """Each program set compiled and checked as `aot` checks one cell, its knobs over `args`';
    every set's cell resolved (its plan) first, so a set the plan refuses is refused before the
    minutes of the first set's compiles."""
    cells = []
    for settings, knobs in sets:
        try:
            cells.append((settings, knobs, _cell(args, knobs)))
        except UserError as error:
            raise UserError(f"--ab-arms: arm(s) {', '.join(settings)}: {error}") from None
    checks = []
    for settings, knobs, cell in cells:
        progress(f"aot: A/B program set of {', '.join(settings)}")
        report = check_cell(cell, args.layers, progress, args.min_headroom / 100)
        checks.append(ArmCheck(tuple(settings), dict(knobs), report))
    return AbCheck(args.ab_arms, tuple(checks))


def _cell(args: argparse.Namespace, knobs: Mapping[str, str]) -> Cell:
    """One program set's cell and plan: its knobs (text, as its arm runs them), else `aot`'s own
    flags."""

    def knob(name: str, default):
        return default if name not in knobs else DRIVER_KNOBS[name].read(knobs)

    return resolve_cell(
        args.preset,
        args.target,
        DRIVER_KNOBS["TRAINER_ARGV"].read(knobs) or args.trainer_argv,
        knobs.get("ENGINE_FLAGS", ""),
        DRIVER_KNOBS["ENGINE"].read(knobs) or args.engine,
        stage=StageConfig(before_update=knob("STAGE_BEFORE_UPDATE", args.stage_before_update)),
        micro_steps=knob("MICRO_STEPS", args.micro_steps),
        routing_profile=args.routing_profile,
        seed=args.seed,
    )


def format_ab_check(check: AbCheck) -> str:
    """Each program set's report under its settings, then the A/B's verdict in one line."""
    parts = []
    for arm in check.checks:
        knobs = " ".join(f"{name}={value}" for name, value in arm.knobs.items()) or "(aot's own)"
        parts += [f"== A/B arm(s) {', '.join(arm.settings)}: {knobs}", format_report(arm.report)]
    largest = check.largest.report
    memory = "unknown" if largest.memory_bytes is None else human_bytes(largest.memory_bytes)
    peak = (
        f"one state for every arm, so its device peak is the largest arm's:"
        f" {human_bytes(largest.peak)} of {memory} (arm(s) {', '.join(check.largest.settings)})"
    )
    if not check.refused:
        parts.append(f"A/B: FITS: {peak}, each program set with the margin free")
        return "\n".join(parts)
    refused = "; ".join(_refusal(arm) for arm in check.refused)
    parts.append(
        f"A/B: REFUSED before launch: {refused}; {peak}: change or drop the arm, or time it in a"
        " pod of its own (render without --ab-arms, score with ab --from-logs)"
    )
    return "\n".join(parts)


def _refusal(arm: ArmCheck) -> str:
    report = arm.report
    verdict = {True: "below the margin", False: "DOES NOT FIT", None: "fit UNKNOWN"}[report.fits]
    return f"arm(s) {', '.join(arm.settings)} {verdict} (peak {human_bytes(report.peak)})"
