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
from rl_trainer_bench.ab.arms import ArmRun
from rl_trainer_bench.ab.checks import FAIL, CheckResult, failed

if TYPE_CHECKING:  # the scorer needs numpy; this module stays light for the parser
    from rl_trainer_bench.ab.score import Score

SCHEMA = "rl-trainer-bench/ab/1"
_VERSIONED = ("jax", "jaxlib", "numpy", "optax", "matplotlib")


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
    lines = [title, ""]
    header = f"{'arm':<10}{'setting':<10}{'steps':>6}{'median':>10}{'IQR':>9}{'min':>9}{'max':>9}{'1st-call+':>11}{'idle':>9}{'hidden':>8}"
    lines += [header + "   (ms; hidden = stage's copy fraction)", "-" * len(header)]
    for run in runs:
        spread = score.arms[run.label]
        scored = run.scored
        extra = _median(r.first_call_extra_s for r in scored)
        idle = _median(r.boundary_idle_s for r in scored)
        hidden = _median(r.stage_hidden for r in scored)
        lines.append(
            f"{run.label:<10}{run.setting:<10}{spread.steps:>6}{_ms(spread.median_s):>10}"
            f"{_ms(spread.iqr_s):>9}{_ms(spread.min_s):>9}{_ms(spread.max_s):>9}"
            f"{'-' if extra is None else _ms(extra):>11}"
            f"{'-' if idle is None else _ms(idle):>9}"
            f"{'-' if hidden is None else f'{hidden:.0%}':>8}"
        )
    lines.append("")
    for setting, spread in score.settings.items():
        lines.append(
            f"{setting}: median {_ms(spread.median_s)} ms over {spread.steps} steps (all its arms)"
        )
    if score.noise:
        for noise in score.noise:
            lines.append(
                f"noise floor {noise.setting}: {_ms(noise.seconds)} ms "
                f"({' vs '.join(noise.labels)}, difference of medians)"
            )
    else:
        lines.append(
            "noise floor: none (cross-pod)" if score.cross_pod else "noise floor: none (no repeat)"
        )
    for delta in score.deltas:
        lines.append(
            f"delta {delta.name}: {_signed_ms(delta.delta_s)} ms ({delta.percent(delta.delta_s):+.1f}%), "
            f"95% CI [{_signed_ms(delta.ci_low_s)}, {_signed_ms(delta.ci_high_s)}] ms -> {delta.verdict}"
        )
        lines.append(f"  because {delta.reason}")
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
    return {
        "schema": SCHEMA,
        "mode": mode,
        "command": list(command),
        "started_unix": started_unix,
        "finished_unix": finished_unix,
        "settings": dict(settings),
        "machine": dict(machine),
        "versions": versions(),
        "verdict": overall_verdict(score, checks),
        "score": score.to_json(),
        "checks": [dataclasses.asdict(c) for c in checks],
        "predictions": list(predictions),
        "prediction_sources": list(prediction_sources),
        "arms": [
            {
                "label": run.label,
                "setting": run.setting,
                "staged": run.staged,
                "source": run.source,
                "updates": run.updates,
                "stages": run.stages,
                "recompiles": run.recompiles,
                "param_digest": run.param_digest,
                "records": [r.to_json() for r in run.records],
            }
            for run in runs
        ],
        **extra,
    }


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


def write_json_atomic(path: Path, content: Mapping[str, Any]) -> None:
    write_text_atomic(path, json.dumps(content, indent=1) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename it over `path`: readers see all or nothing."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _median(values: Iterable[float | None]) -> float | None:
    """Median of the measured values; None when no step measured this figure."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2f}"
