"""The A/B report: the terminal table and ab.json, built from the arms, the score and the checks.

The table is what a user reads once; ab.json is what they keep: every record of every arm, every
check, the verdict with its rule, the machine, the versions and the command line, so the run can be
re-scored or disputed later without rerunning it. Files are written atomically: a reader never
sees half a report.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_trainer_bench import __version__
from rl_trainer_bench.ab import boundary
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab.checks import FAIL, CheckResult, failed
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.units import confidence_level, milliseconds

if TYPE_CHECKING:  # the scorer needs numpy; this module stays light for the parser
    from rl_trainer_bench.ab.score import Delta, Score

SCHEMA = "rl-trainer-bench/ab/1"
_VERSIONED = ("jax", "jaxlib", "numpy", "optax", "matplotlib")
_SIGNED_MS = "+.2f"  # deltas and their CI bounds always carry their sign


def overall_verdict(score: Score, checks: Sequence[CheckResult]) -> str:
    """FAIL on any failed exact check; otherwise each delta's verdict."""
    if failed(checks):
        return FAIL
    if len(score.deltas) == 1:
        return score.deltas[0].verdict
    return "; ".join(f"{d.name}: {d.verdict}" for d in score.deltas)


def table(
    title: str,
    runs: Sequence[ArmRun],
    score: Score,
    checks: Sequence[CheckResult],
    predictions: Sequence[Mapping[str, Any]],
    plot_note: str,
) -> str:
    """The report as the terminal shows it."""
    lines = [title, "", *_arm_rows(runs, score), ""]
    for setting, spread in score.settings.items():
        lines.append(
            f"{setting}: median {milliseconds(spread.median_s)} ms over {spread.steps} steps (all its arms)"
        )
    if score.looks:
        lines.append(
            f"noise: the robust scale of the {score.looks[-1]['steps']} scored steps around the fit"
            " (Huber: a step counts as at most 1.345 scales; a stray one that its own outlier test"
            " finds, or one more than 5 scales off, is set aside), in each delta's interval"
            " (no separate floor)"
        )
    elif score.blocks:
        lines.append(
            f"noise: the spread of the {len(score.blocks)} blocks' differences, in each delta's "
            "interval (no separate floor)"
        )
    elif score.noise:
        for noise in score.noise:
            lines.append(
                f"noise floor {noise.setting}: {milliseconds(noise.seconds)} ms "
                f"({' vs '.join(noise.labels)}, difference of medians)"
            )
    else:
        lines.append(
            "noise floor: none (cross-pod)" if score.cross_pod else "noise floor: none (no repeat)"
        )
    lines += _delta_lines(score)
    if score.stopping:
        lines.append(f"stopping: {score.stopping}")
    copy = boundary.compare(runs)
    if copy is not None:
        lines += ["", *copy.lines()]
    lines += ["", *design_lines(runs, score)]
    lines += ["", "exact checks:"]
    lines += [f"  {c.status:<4} {c.name}: {c.detail}" for c in checks]
    if predictions:
        lines += ["", "predictions (written before the run):"]
        for p in predictions:
            unit = "%" if p["unit"] == "%" else f" {p['unit']}"
            lines.append(
                f"  {p['text']}: measured {p['measured']:+.2f}{unit} -> "
                + ("HELD" if p["held"] else "MISSED")
            )
    lines += [
        "",
        f"verdict: {overall_verdict(score, checks)}",
        f"rule: {score.rule}",
        f"plot: {plot_note}",
    ]
    return "\n".join(lines)


def _delta_lines(score: Score) -> list[str]:
    """Each delta with its interval, verdict and why; a sequential run's boundary metrics' beside
    the step's, and which metric the switch is judged by."""
    lines: list[str] = []
    for delta in score.deltas:
        lines.append(
            f"delta {delta.name}: {milliseconds(delta.delta_s, _SIGNED_MS)} ms ({delta.percent(delta.delta_s):+.1f}%), "
            f"{confidence_level(score.confidence)} CI [{milliseconds(delta.ci_low_s, _SIGNED_MS)}, {milliseconds(delta.ci_high_s, _SIGNED_MS)}] ms"
            f"{_no_effect_interval(delta)} -> {delta.verdict}"
        )
        lines.append(f"  because {delta.reason}")
    for metric, deltas in score.boundary.items():
        for delta in deltas:
            lines.append(
                f"delta {delta.name} ({metric}): {milliseconds(delta.delta_s, _SIGNED_MS)} ms, "
                f"{confidence_level(score.confidence)} CI [{milliseconds(delta.ci_low_s, _SIGNED_MS)},"
                f" {milliseconds(delta.ci_high_s, _SIGNED_MS)}] ms{_no_effect_interval(delta)}"
                f" -> {delta.verdict}"
            )
            lines.append(f"  because {delta.reason}")
    if score.judged_by:
        lines.append(f"judged by: {score.judged_by}")
    return lines


def _no_effect_interval(delta: Delta) -> str:
    """A sequential look's NO-EFFECT interval beside the CI ("" where NO-EFFECT reads the CI)."""
    if delta.no_effect_low_s is None or delta.no_effect_high_s is None:
        return ""
    low, high = (
        milliseconds(x, _SIGNED_MS) for x in (delta.no_effect_low_s, delta.no_effect_high_s)
    )
    return f", NO-EFFECT interval [{low}, {high}] ms"


def _arm_rows(runs: Sequence[ArmRun], score: Score) -> list[str]:
    """The table's header and one row per arm: the step-time spread and the boundary's medians."""
    header = f"{'arm':<10}{'setting':<10}{'steps':>6}{'median':>10}{'IQR':>9}{'min':>9}{'max':>9}{'1st-call+':>11}{'idle':>9}{'hidden':>8}"
    lines = [header + "   (ms; hidden = stage's copy fraction)", "-" * len(header)]
    for run in runs:
        spread = score.arms[run.label]
        scored = run.scored
        extra = _median(r.first_call_extra_s for r in scored)
        idle = _median(r.boundary_idle_s for r in scored)
        hidden = _median(r.stage_hidden for r in scored)
        lines.append(
            f"{run.label:<10}{run.setting:<10}{spread.steps:>6}{milliseconds(spread.median_s):>10}"
            f"{milliseconds(spread.iqr_s):>9}{milliseconds(spread.min_s):>9}{milliseconds(spread.max_s):>9}"
            f"{'-' if extra is None else milliseconds(extra):>11}"
            f"{'-' if idle is None else milliseconds(idle):>9}"
            f"{'-' if hidden is None else f'{hidden:.0%}':>8}"
        )
    return lines


def design_lines(runs: Sequence[ArmRun], score: Score) -> list[str]:
    """Which design produced the verdict, the drift it ran under, and a warning when that drift
    moved step time by more than the min effect over the run."""
    drift = score.drift
    separate = (
        score.design in (run_orders.DESIGN, run_orders.BLOCKED_DESIGN, run_orders.SEQUENTIAL_DESIGN)
        and not score.cross_pod
    )
    order = f", run order {', '.join(run.label for run in runs)}" if separate else ""
    lines = [f"design: {score.design}{order}: {score.drift_answer}"]
    fits = [("within arms", drift.within_arms), ("across the run", drift.across_run)]
    slopes = ", ".join(f"{name} {_per_minute(s)}" for name, s in fits if s is not None)
    lines.append(
        f"drift: {slopes or 'not measurable (too few steps)'}; "
        f"{milliseconds(drift.moved_s)} ms over {drift.span_s:.1f} s of scored steps"
    )
    if drift.exceeds_min_effect:
        lines.append(
            f"WARNING: drift moved step time {milliseconds(drift.moved_s)} ms over the run, more "
            f"than the min effect {milliseconds(drift.min_effect_s)} ms"
        )
        for setting, bias in drift.bias_s.items():
            if abs(bias) > drift.min_effect_s / 10:
                lines.append(
                    f"  this design puts about {milliseconds(bias, _SIGNED_MS)} ms of drift into "
                    f"delta {setting}-{next(iter(score.settings))}"
                )
    return lines


def _per_minute(slope: float) -> str:
    """A slope in seconds per second of run, as milliseconds of step time per minute of run."""
    return f"{milliseconds(slope * 60, _SIGNED_MS)} ms/min"


def document(
    *,
    mode: str,
    command: Sequence[str],
    started_unix: float,
    finished_unix: float,
    settings: Mapping[str, Any],
    runs: Sequence[ArmRun],
    score: Score,
    checks: Sequence[CheckResult],
    predictions: Sequence[Mapping[str, Any]],
    prediction_sources: Sequence[Mapping[str, Any]],
    machine: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """ab.json's content: everything needed to re-score or dispute the run without rerunning it."""
    copy = boundary.compare(runs)
    return {
        "schema": SCHEMA,
        "mode": mode,
        **_provenance(command, started_unix, finished_unix, settings, machine),
        "verdict": overall_verdict(score, checks),
        "score": score.to_json(),
        "checks": [dataclasses.asdict(c) for c in checks],
        "predictions": list(predictions),
        "prediction_sources": list(prediction_sources),
        "arms": _arms(runs),
        "boundary": None if copy is None else copy.to_json(),
        **extra,
    }


def incomplete_document(
    *,
    mode: str,
    command: Sequence[str],
    started_unix: float,
    finished_unix: float,
    interrupted: str,
    settings: Mapping[str, Any],
    runs: Sequence[ArmRun],
    machine: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """ab.json of an interrupted run: the arms that finished, no score, no checks, no verdict
    (a part of the arms proves nothing about the whole), and where it stopped."""
    return {
        "schema": SCHEMA,
        "mode": mode,
        "incomplete": True,
        "interrupted": interrupted,
        **_provenance(command, started_unix, finished_unix, settings, machine),
        "verdict": None,
        "arms": _arms(runs),
        **extra,
    }


def _provenance(
    command: Sequence[str],
    started_unix: float,
    finished_unix: float,
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
) -> dict[str, Any]:
    """How, when and where the run ran: a finished and an interrupted ab.json record it alike."""
    return {
        "command": list(command),
        "started_unix": started_unix,
        "finished_unix": finished_unix,
        "settings": dict(settings),
        "machine": dict(machine),
        "versions": versions(),
    }


def _arms(runs: Sequence[ArmRun]) -> list[dict[str, Any]]:
    return [
        {
            "label": run.label,
            "setting": run.setting,
            "staged": run.staged,
            "source": run.source,
            "updates": run.updates,
            "stages": run.stages,
            "recompiles": run.recompiles,
            "param_digest": run.param_digest,
            "boundary_copy_s": run.boundary_copy_s,
            "records": [r.to_json() for r in run.records],
        }
        for run in runs
    ]


def host_machine() -> dict[str, Any]:
    """The host: enough to tell two machines apart in a dispute, nothing secret."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def versions() -> dict[str, str | None]:
    """Installed versions of the bench and the libraries that shape its numbers (None: absent)."""
    found: dict[str, str | None] = {"rl_trainer_bench": __version__}
    for name in _VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    """ab.json, written atomically: a reader never sees half a report."""
    write_text_atomically(path, json.dumps(content, indent=1) + "\n")


def _median(values: Iterable[float | None]) -> float | None:
    """Median of the measured values; None when no step measured this figure."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
