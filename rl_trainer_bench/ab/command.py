"""`rl-trainer-bench ab`: did my change move the step time by more than the noise?

One process runs the arms back to back (default STAGE_BEFORE_UPDATE off and on, in six balanced
blocks such as off, on, on', off' / on, off, off, on / ..., turned at random, see order.py) on the
same micro-batches, so the effect and the noise are measured on the same machine, seconds apart
(`same_process`). Predictions are recorded before any device work; the exact checks, the score
and the verdict come after, written as the report files (`report_files`). `--from-logs` scores
runs from separate pods with the same report, marked cross-pod, with no shared noise floor
(`cross_pod`).
"""

from __future__ import annotations

import argparse
import secrets
import time

from rl_trainer_bench.ab import budget
from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.ab.budget import AbRun
from rl_trainer_bench.ab.cross_pod import cross_pod
from rl_trainer_bench.ab.plan import ArmPlan
from rl_trainer_bench.ab.same_process import BenchFactory, same_process
from rl_trainer_bench.errors import UserError

SEED_BITS = 32  # a drawn seed short enough to read back and type


def run(
    args: argparse.Namespace,
    *,
    make_bench: BenchFactory | None = None,
    planned: ArmPlan | None = None,
) -> int:
    """The `ab` command: 0 when every exact check passed, 1 when one failed (verdict FAIL).
    `planned`: the arms' plans resolved already (a same-pod A/B's, as its pod printed them), with
    the run they were resolved for: resolving it again would size a budget twice and refuse it."""
    started = time.time()
    resolved = complete(args) if planned is None else planned.run
    if not 0 < resolved.min_effect < 100:
        raise UserError(f"--min-effect {resolved.min_effect}: give a percent between 0 and 100")
    predictions, sources = _predictions(args)
    if args.from_logs:
        return cross_pod(args, resolved, predictions, sources, started)
    return same_process(args, resolved, predictions, sources, started, make_bench, planned)


def complete(args: argparse.Namespace) -> AbRun:
    """The run `args` asks for, with the defaults that depend on it: the blocks and turns its
    budget buys on its platform (`budget.size`; no design where the budget sizes nothing), the
    min effect, the scored steps per arm of another design, and a fresh schedule seed (a new
    layout for every run, so no load is locked to one setting; the seed is recorded with the
    settings). `args` stays the flags as parsed."""
    seed = secrets.randbits(SEED_BITS) if args.schedule_seed is None else args.schedule_seed
    return budget.size(args, seed)


def _predictions(args: argparse.Namespace) -> tuple[list[ab_predict.Prediction], list[dict]]:
    predictions = ab_predict.parse_predictions(args.predict)
    sources = [{"origin": "--predict", "texts": list(args.predict)}] if args.predict else []
    if args.predict_file:
        from_file, source = ab_predict.read_prediction_file(args.predict_file)
        predictions += from_file
        sources.append(
            {
                "origin": source.origin,
                "sha256": source.sha256,
                "modified_unix": source.modified_unix,
            }
        )
    return predictions, sources
