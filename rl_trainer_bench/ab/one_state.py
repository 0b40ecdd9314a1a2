"""One training state for every arm of a same-process A/B, and every bench warmed once, up front.

Arms whose programs differ (a MaxText key, an engine key) get a Bench each, so each compiles its
own programs, but only the first Bench's engine allocates a training state: every later one is
built over it (`share_state`, engine/contract.py), so the A/B holds one set of parameters, gradient
sum and optimizer state on the device, whatever the number of benches. An arm whose programs take
another state (another engine, `mu_dtype`, another model, a key that changes a parameter's shape
or sharding) cannot share it and is refused before anything compiles, naming its keys and the
cross-pod way: two states would not fit beside the programs of the cells the A/B is for.

With one state, no arm starts from the parameters another started from: each turn starts from the
state the previous turn left (docs/ab.md, "Arms"). The exact checks prove what
still holds: the same micro-batches, the same loss denominators, one update per step.

Warm-up runs once per Bench, before the first scored turn: its steps run every stage its arms use
at a boundary, so each later turn scores from its first step, and a compile in a scored step is
still caught (CompileWatch) and fails the A/B.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_trainer_bench.ab.plan import ArmPlan
from rl_trainer_bench.config.knobs import StageConfig
from rl_trainer_bench.errors import UserError

CROSS_POD_WAY = (
    "time it cross-pod: one pod per setting (render each without --ab-arms), scored with"
    " rl-trainer-bench ab --from-logs"
)
# What the report says of the arms' parameters, where a reader might assume identical ones.
SHARED_STATE_NOTE = (
    "one training state shared by every arm: each turn starts from the state the previous turn"
    " (or the warm-up) left, so no two turns start from the same parameters"
)


def bench_order(plan: ArmPlan) -> list[str]:
    """The benches in the order they are built: the baseline's (the setting --arms names first)
    first, so its engine allocates the state and a refusal names the pair as --arms writes it,
    whichever way the drawn turns run them."""
    return sorted(
        plan.bench_configs,
        key=lambda name: plan.baseline not in {arm.setting for arm in plan.arms_of(name)},
    )


def refuse_other_engines(plan: ArmPlan) -> None:
    """UserError, before any engine is built, when an arm names another engine than the first
    bench's: another engine holds another state."""
    first_bench, *others = bench_order(plan)
    engine = plan.bench_configs[first_bench].engine
    for name in others:
        if plan.bench_configs[name].engine != engine:
            raise state_refusal(
                plan, name, f"ENGINE={plan.bench_configs[name].engine}, not {engine}"
            )


def state_refusal(plan: ArmPlan, bench: str, why: str) -> UserError:
    """The one line refusing the arms of `bench`, whose programs need another training state
    than the first bench's (`why` says which part, and how it differs)."""
    first = plan.arms_of(bench_order(plan)[0])[0]
    arm = plan.arms_of(bench)[0]
    keys = [f"{k}={v}" for k, v in arm.program_knobs if (k, v) not in first.program_knobs]
    return UserError(
        f"--arms: arm {arm.setting} ({' '.join(keys) or arm.describe()}) needs another training"
        f" state than arm {first.setting}: {why}; the arms of one process share one state,"
        f" so {CROSS_POD_WAY}"
    )


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """One Bench's warm-up: its steps, and the stage of the boundary closing each."""

    bench: str
    steps: int
    boundary_stages: list[StageConfig]


def warm_ups(plan: ArmPlan, warmup_steps: int) -> list[WarmUp]:
    """Each Bench's warm-up: `warmup_steps` steps, or one more than the staging stages its arms
    use when that is more, with a boundary at every such stage (the stage's own path, its copy
    and its wait, is then warm too); the remaining boundaries stage as the last one."""
    out = []
    for bench in plan.bench_configs:
        staged = list(
            dict.fromkeys(
                plan.stages[arm.label]
                for arm in plan.arms_of(bench)
                if plan.stages[arm.label].enabled
            )
        )
        steps = max(warmup_steps, len(staged) + 1)
        rest = steps - len(staged)
        boundaries = staged + [staged[-1] if staged else StageConfig()] * rest
        out.append(WarmUp(bench, steps, boundaries))
    return out


def set_warmups(plan: ArmPlan) -> list[int]:
    """Each Bench's warm-up steps as `warm_ups` resolves them: what the design's lines count."""
    return [warm.steps for warm in warm_ups(plan, plan.warmup_steps)]


def warm_up_line(warm: Sequence[WarmUp]) -> str:
    """The design's warm-up, as the report's title and the log say it."""
    total = sum(w.steps for w in warm)
    per_bench = ", ".join(f"{w.bench} {w.steps}" for w in warm)
    return f"{total} warm-up step(s) in all, up front ({per_bench})"
