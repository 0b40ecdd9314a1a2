"""Cross-pod: bench logs from separate runs scored with the same report, with no shared noise floor."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.ab import report as ab_report
from rl_trainer_bench.ab.budget import AbRun
from rl_trainer_bench.ab.report_files import fresh_name, move_earlier_ab_aside, write_verdict
from rl_trainer_bench.bench import step_record
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_writable_folder, read_user_text


def _arm_from_log(spec: str, taken: Sequence[str]) -> tuple[ArmRun, list[str]]:
    """One `--from-logs` entry (`[NAME=]LOG`) as an arm, and its ruler lines that did not read back."""
    name, sep, path_text = spec.partition("=")
    path = Path(path_text if sep else spec)
    label = name if sep else path.stem
    if label in taken:
        raise UserError(f"--from-logs: two logs are named {label!r}; write NAME=LOG for each")
    parsed = step_record.parse(read_user_text(path, "--from-logs"))
    records = parsed.records
    if parsed.malformed:
        print(f"{path}: {len(parsed.malformed)} ruler line(s) did not read back; see ab.json")
    if not records:
        raise UserError(
            f"--from-logs {path}: no {step_record.LOG_PREFIX} step lines in it; pass a bench log"
        )
    arms_in_log = sorted({r.arm for r in records if r.arm})
    if len(arms_in_log) > 1:
        raise UserError(
            f"--from-logs {path}: holds arms {', '.join(arms_in_log)}; pass one pod's log per arm"
        )
    run = ArmRun(
        label=label,
        setting=label,
        staged=any(r.staged is not None for r in records),
        records=records,
        recompiles=[],
        source=str(path),
    )
    return run, [f"line {n}: {why}" for n, why in parsed.malformed]


def cross_pod(
    args: argparse.Namespace,
    resolved: AbRun,
    predictions: list[ab_predict.Prediction],
    sources: list[dict[str, Any]],
    started: float,
) -> int:
    runs, malformed = [], {}
    for spec in args.from_logs:
        run, bad_lines = _arm_from_log(spec, taken=[run.label for run in runs])
        runs.append(run)
        if bad_lines:
            malformed[run.source] = bad_lines
    if len(runs) < 2:
        raise UserError(
            "--from-logs: give two logs (baseline first), e.g. --from-logs off.log on.log"
        )
    ab_predict.check_settings(predictions, [run.label for run in runs])
    out = args.out if args.out is not None else fresh_name()
    check_writable_folder(out, "--out")
    move_earlier_ab_aside(out, print)
    title = (
        f"A/B across pods from logs ({', '.join(r.source for r in runs)}): no shared noise floor"
    )
    settings = {"from_logs": list(args.from_logs), "min_effect_pct": resolved.min_effect}
    machine = {"records_from": "logs of separate runs", "scored_on": ab_report.host_machine()}
    return write_verdict(
        "cross-pod",
        title,
        out,
        runs,
        settings,
        machine,
        {"malformed_log_lines": malformed},
        predictions,
        sources,
        started,
        cross_pod=True,
        min_effect_pct=resolved.min_effect,
    )
