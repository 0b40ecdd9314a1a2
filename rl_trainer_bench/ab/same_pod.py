"""A same-pod A/B: the rendered pod runs several arms in one process, with the `ab` design.

Pod-to-pod shifts (another slice, another host's state, another compile cache) are often as large
as the effects worth finding, so an A/B whose arms share one pod shares its noise too: the arms
run back to back on the same micro-batches, each setting twice, and the report has the noise
floor, the exact checks and the verdict (`same_process`). The renderer's AB_ARMS knob asks for it;
the pod then runs this module's `main` instead of the plain driver, with the pod's knobs (the
trainer's argv, the preset its model names, ENGINE_FLAGS, ...) shared by every arm. What binds when
the process starts (libtpu and XLA flags, the JAX runtime) cannot differ between arms of one
process: `arms.check_key` refuses it and names the cross-pod way (one pod per setting, scored with
`ab --from-logs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from rl_trainer_bench.ab import budget, one_state
from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import memory as ab_memory
from rl_trainer_bench.ab import parser as ab_parser
from rl_trainer_bench.ab.arms import RESERVED_KNOBS, maxtext_keys_checked_in_pod
from rl_trainer_bench.ab.budget import AbRun
from rl_trainer_bench.ab.plan import ArmPlan, plan_arms
from rl_trainer_bench.ab.same_process import order_line
from rl_trainer_bench.bench import plan as bench_plan
from rl_trainer_bench.bench import plan_document
from rl_trainer_bench.bench.results_copy import copying
from rl_trainer_bench.bench.step_record import LOG_PREFIX
from rl_trainer_bench.code_digest import code_sha256
from rl_trainer_bench.config.knobs import DRIVER_KNOBS
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.factory import MAXTEXT
from rl_trainer_bench.errors import UserError, exit_process, run_guarded
from rl_trainer_bench.io import check_writable_folder, write_text_atomically

AB_ARMS = "AB_ARMS"
# The seed of the blocks' turns: the renderer sets it, so the order it prints is the pod's.
SCHEDULE_SEED = "AB_SCHEDULE_SEED"
SAME_POD_MODULE = (
    "rl_trainer_bench.ab.same_pod"  # what the pod's script runs (launch/pod_script.py)
)
# The pod's A/B design knobs, as the render's AB_* knobs set them: each an `ab` flag.
DESIGN_KNOBS = {
    "AB_BUDGET": "--budget",
    "AB_STEP_TIME": "--step-time",
    "AB_STEP_NOISE": "--step-noise",
    "AB_SCHEDULE_SEED": "--schedule-seed",
    "AB_STOP": "--stop",
    "AB_EXPECT_EFFECT": "--expect-effect",
}
# The environment variable a pod's `ab` flag comes from, to name it in a refusal.
_POD_KNOB_OF_FLAG = {
    "--arms": AB_ARMS,
    "--steps": "STEPS",
    **{flag: name for name, flag in DESIGN_KNOBS.items()},
}
# Driver knobs that say how to run, not what every arm runs.
_NOT_SHARED = frozenset({*RESERVED_KNOBS, "PLAN_ONLY"})


def ab_arguments(env: Mapping[str, str]) -> tuple[argparse.Namespace, AbRun]:
    """The `ab` command's arguments for the pod's environment, and the run they resolve to: its
    arms from AB_ARMS, the preset the pod's plan chooses, STEPS per arm as the environment writes
    it (unset: the A/B's default), the warm-up the pod's knobs resolve to, RESULTS_DIR as the
    report's folder, and every other driver knob the pod has (TRAINER_ARGV, ENGINE_FLAGS, ...)
    for every arm."""
    config = bench_plan.environment_config(env)
    if env.get("AB_BUDGET", "").strip():  # refused under the pod's name for it, not ab's flag
        budget.parse_budget(env["AB_BUDGET"], "AB_BUDGET")
    if env.get("AB_EXPECT_EFFECT", "").strip():
        budget.parse_effects(env["AB_EXPECT_EFFECT"], "AB_EXPECT_EFFECT")
    words = [
        "--preset",
        config.preset.name,
        "--arms",
        env[AB_ARMS],
        "--out",
        str(config.results_dir),
    ]
    for name, flag in {"STEPS": "--steps", **DESIGN_KNOBS}.items():
        if env.get(name, "").strip():
            words += [flag, env[name]]
    shared = [name for name in DRIVER_KNOBS if name not in _NOT_SHARED and env.get(name, "")]
    for name in shared:
        words += ["--knob", f"{name}={env[name]}"]
    parser = argparse.ArgumentParser(prog="same-pod A/B", exit_on_error=False)
    ab_parser.add_arguments(parser)
    try:
        # the pod's warm-up as its plan resolves it (WARMUP_STEPS, else its engine's), typed
        pod_warmup = argparse.Namespace(warmup_steps=config.warmup_steps)
        args = parser.parse_args(words, pod_warmup)
        return args, ab_command.complete(args)
    except argparse.ArgumentError as error:
        knob = _POD_KNOB_OF_FLAG.get(error.argument_name or "")
        raise UserError(f"{knob}: {error.message}" if knob else f"{AB_ARMS}: {error}") from None


@dataclasses.dataclass(frozen=True)
class PodAb:
    """A same-pod A/B planned once, from a pod's environment and its resolved plan: its
    arguments as parsed, its arms' plans (each resolved once, what its benches are built from,
    with the run they were laid out for: `arms.run`), and the lines that print it: the A/B's own
    where the renderer plans it (`plan_ab`), the pod's whole plan as it printed and checked it
    where the pod does (`pod_plan`). What the renderer and the AOT job say of the A/B comes from
    one of these, so neither plans the arms again."""

    args: argparse.Namespace
    arms: ArmPlan
    lines: list[str]


def plan_ab(env: Mapping[str, str], pod: bench_plan.Plan, on_this_host: bool = False) -> PodAb:
    """The pod's A/B, validated as the pod validates it (every arm's plan, each arm's engine
    config against `pod`'s, the pod's plan printed above), with its lines: its arms and what each
    changes, its order, its design with its cost and what it resolves, its device memory; for the
    pod's host only `on_this_host` (the renderer plans for another machine)."""
    args, run = ab_arguments(env)
    arm_plan = plan_arms(args, run, args.out, on_this_host)
    return PodAb(args, arm_plan, _ab_lines(env, args, arm_plan, pod))


def _ab_lines(
    env: Mapping[str, str], args: argparse.Namespace, arm_plan: ArmPlan, pod: bench_plan.Plan
) -> list[str]:
    ran = dict.fromkeys(arm.setting for arm in arm_plan.arms)
    settings = [arm_plan.baseline, *(setting for setting in ran if setting != arm_plan.baseline)]
    first = {arm.setting: arm for arm in reversed(arm_plan.arms)}
    lines = [
        f"same-pod A/B of {', '.join(settings)} (AB_ARMS), one process (python -m"
        f" {SAME_POD_MODULE}), one training state for every arm, each bench compiled and warmed once, up front",
        *(
            f"A/B arm {setting}: {first[setting].describe()}; engine config:"
            f" {arm_plan.engine_config_line(setting, pod.engine)}"
            for setting in settings
        ),
        f"{order_line(arm_plan.arms)}; these turns are schedule seed"
        f" {arm_plan.run.schedule_seed}'s"
        + (
            f" ({SCHEDULE_SEED}): the pod runs them"
            if env.get(SCHEDULE_SEED, "").strip()
            else ", and the pod's run draws its own"
        ),
    ]
    lines += arm_plan.run.planned_lines(one_state.set_warmups(arm_plan))
    lines.append(ab_memory.memory_line(arm_plan, args.arms, env.get(ab_memory.AOT_REPORT)))
    lines.append(
        "same-pod A/B: scored as `ab` scores its arms (docs/ab.md); the exact"
        f" checks and the verdict go to {args.out}/ab.txt and ab.json, and the log"
    )
    return [*lines, *_keys_checked_in_pod(arm_plan, settings)]


def pod_plan(env: Mapping[str, str]) -> PodAb:
    """The pod's plan as it prints it: the bench's, then the A/B's with each arm's resolved
    engine config, and in a rendered pod the rendered plan checked against this pod's own, every
    arm re-resolved here, and its image (`plan_document.executed`)."""
    config = bench_plan.environment_config(env)
    rendered = plan_document.embedded(env.get(plan_document.CODE_DIR_VARIABLE))
    planned_elsewhere = config.trainer_slice is not None
    resolved = bench_plan.resolve(config, env=env, rendering=rendered is not None)
    ab = plan_ab(env, resolved, on_this_host=not planned_elsewhere and rendered is None)
    lines = plan_document.with_lines(
        resolved.lines(same_pod_ab=True), [f"{bench_plan.PLAN_PREFIX} {line}" for line in ab.lines]
    )
    if rendered is not None:
        checked = plan_document.executed(rendered, lines, resolved.engine, config, env)
        lines = checked.printed(bench_plan.PLAN_PREFIX)
    return dataclasses.replace(ab, lines=lines)


def _keys_checked_in_pod(arm_plan: ArmPlan, settings: list[str]) -> list[str]:
    """`same-pod A/B: arm NAME: MaxText keys ...: checked in the pod` for each setting on
    MaxText's engine that sets MaxText keys (on the built-in engine the plan has judged them),
    in the order of `settings`."""
    first = {arm.setting: arm for arm in arm_plan.arms if arm.occurrence == 0}
    lines = []
    for arm in (first[setting] for setting in settings):
        engine = arm_plan.bench_configs[arm_plan.groups[arm.label]].engine
        line = maxtext_keys_checked_in_pod(arm, arm_plan.preset.engine_for(engine))
        if engine == MAXTEXT and line is not None:
            lines.append(f"same-pod A/B: {line}")
    return lines


def run(env: Mapping[str, str]) -> int:
    """The pod's A/B (PLAN_ONLY=1: the bench's plan and the A/B's, then exit): the arms run as
    planned, from the plans whose lines it printed."""
    planned = pod_plan(env)
    lines = planned.lines
    if DRIVER_KNOBS["PLAN_ONLY"].read(env):
        for line in lines:
            print(line, flush=True)
        return 0
    config = bench_plan.environment_config(env)
    digest = code_sha256(engine=config.engine, same_pod_ab=True)
    print(f"{LOG_PREFIX} code sha256={digest}", flush=True)
    if plan_document.embedded(env.get(plan_document.CODE_DIR_VARIABLE)) is not None:
        for line in lines:  # the plan the pod executes: in its log and beside its report
            print(line, flush=True)
        check_writable_folder(config.results_dir, "RESULTS_DIR")
        config.results_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            config.results_dir / plan_document.EXECUTED_FILE, plan_document.executed_json(lines)
        )
    # every arm's records outlive the pod as the run goes, and the report when it ends
    with copying(config.results_dir, config.results_uri, lambda line: print(line, flush=True)):
        return ab_command.run(planned.args, planned=planned.arms)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The entry a pod runs when AB_ARMS is set (knobs from the environment; no flags)."""
    env = os.environ if env is None else env

    def body() -> int:
        if argv:
            raise UserError(f"the same-pod A/B takes its knobs from the environment: {argv[0]!r}")
        return run(env)

    return run_guarded("same-pod A/B", body, (UserError, ContractError))


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
