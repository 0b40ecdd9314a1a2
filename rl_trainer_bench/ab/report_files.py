"""The report files of an A/B, the end both designs share: score the runs (the verdict's rule is
`score.py`'s), run the exact checks, write ab.txt, ab.json and ab.png into the run's folder, and
exit 1 when an exact check failed."""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_trainer_bench.ab import checks as ab_checks
from rl_trainer_bench.ab import interleave, sequential
from rl_trainer_bench.ab import plot as ab_plot
from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.ab import report as ab_report
from rl_trainer_bench.ab import score as ab_score
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.io import move_earlier_run_aside, write_text_atomically


def write_verdict(
    mode: str,
    title: str,
    out: Path,
    runs: Sequence[ArmRun],
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    extra: Mapping[str, Any],
    predictions: Sequence[ab_predict.Prediction],
    sources: Sequence[dict[str, Any]],
    started: float,
    *,
    cross_pod: bool,
    min_effect_pct: float,
    schedule: interleave.Schedule | None = None,
    baseline: str | None = None,
    looks: sequential.Looks | None = None,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    checks = ab_checks.exact_checks(runs)
    score, shown = _scored(runs, cross_pod, min_effect_pct, schedule, baseline, looks)
    medians = {setting: spread.median_s for setting, spread in score.settings.items()}
    outcomes = ab_predict.outcomes(predictions, medians)
    for source in sources:
        modified = source.get("modified_unix")
        source["before_run"] = None if modified is None else modified < started
    plot_note = ab_plot.missing_reason()
    if plot_note is None:
        ab_plot.write_plot(shown, out / "ab.png", title)
        plot_note = str(out / "ab.png")
    text = ab_report.table(title, shown, score, checks, outcomes, plot_note)
    print(text)
    write_text_atomically(out / "ab.txt", text + "\n")
    content = ab_report.document(
        mode=mode,
        command=sys.argv,
        started_unix=started,
        finished_unix=time.time(),
        settings=settings,
        runs=runs,
        score=score,
        checks=checks,
        predictions=outcomes,
        prediction_sources=sources,
        machine=machine,
        extra={**extra, "plot": plot_note},
    )
    ab_report.write_json(out / "ab.json", content)
    print(f"wrote {out / 'ab.json'}")
    return 1 if ab_checks.failed(checks) else 0


def _scored(
    runs: Sequence[ArmRun],
    cross_pod: bool,
    min_effect_pct: float,
    schedule: interleave.Schedule | None,
    baseline: str | None,
    looks: sequential.Looks | None,
) -> tuple[ab_score.Score, Sequence[ArmRun]]:
    """The runs scored by their design, and the arms the report shows (an interleaved run's
    steps split by setting)."""
    if looks is not None and baseline is not None:
        return sequential.score(runs, looks, min_effect_pct=min_effect_pct, baseline=baseline), runs
    if schedule is None:
        score = ab_score.score(
            runs, min_effect_pct=min_effect_pct, cross_pod=cross_pod, baseline=baseline
        )
        return score, runs
    (run,) = runs
    score = ab_score.score_interleaved(run, schedule, min_effect_pct=min_effect_pct)
    return score, interleave.paired_steps_by_setting(run, schedule)


# What an A/B writes in its folder: an earlier run's files matching these are moved aside first.
AB_REPORT_FILES = ("ab.json", "ab.txt", "ab.log", "ab.png")
AB_FILES = (*AB_REPORT_FILES, "arm*-*.jsonl", "interleaved.jsonl")


def move_earlier_ab_aside(out: Path, say: Callable[[str], None]) -> None:
    """Move an earlier A/B's files in `out` into `out/earlier-<time>/`, and say so: a new run's
    files are never mixed with an earlier run's, and an earlier result is never replaced."""
    aside = move_earlier_run_aside(out, AB_FILES) if out.is_dir() else None
    if aside is not None:
        say(f"moved the earlier run's files in {out} aside to {aside}")


def fresh_name() -> Path:
    """A new ab-YYYYmmdd-HHMMSS/ under the current directory (suffixed if that second is taken)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(f"ab-{stamp}")
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = Path(f"ab-{stamp}-{suffix}")
    return folder
