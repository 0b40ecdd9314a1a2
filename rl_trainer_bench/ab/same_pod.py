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
import os
import sys
from collections.abc import Mapping, Sequence

from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import parser as ab_parser
from rl_trainer_bench.ab.arms import RESERVED_KNOBS
from rl_trainer_bench.ab.plan import plan_arms
from rl_trainer_bench.ab.same_process import order_line
from rl_trainer_bench.bench import plan as bench_plan
from rl_trainer_bench.bench.results_copy import copy_when_asked
from rl_trainer_bench.bench.step_line import LOG_PREFIX
from rl_trainer_bench.code_digest import code_sha256
from rl_trainer_bench.config.knobs import DRIVER_KNOBS
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError, run_guarded

AB_ARMS = "AB_ARMS"
# Driver knobs that say how to run, not what every arm runs.
_NOT_SHARED = frozenset({*RESERVED_KNOBS, "PLAN_ONLY"})


def ab_arguments(env: Mapping[str, str]) -> argparse.Namespace:
    """The `ab` command's arguments for the pod's environment: its arms from AB_ARMS, the preset
    the pod's plan chooses, STEPS and WARMUP_STEPS per arm, RESULTS_DIR as the report's folder, and
    every other driver knob the pod has (TRAINER_ARGV, ENGINE_FLAGS, ...) for every arm."""
    config = bench_plan.environment_config(env)
    words = [
        "--preset",
        config.preset.name,
        "--arms",
        env[AB_ARMS],
        "--out",
        str(config.results_dir),
        "--warmup-steps",
        str(config.warmup_steps),
    ]
    if env.get("STEPS", "").strip():
        words += ["--steps", str(config.steps)]
    shared = [name for name in DRIVER_KNOBS if name not in _NOT_SHARED and env.get(name, "")]
    for name in shared:
        words += ["--knob", f"{name}={env[name]}"]
    parser = argparse.ArgumentParser(prog="same-pod A/B", exit_on_error=False)
    ab_parser.add_arguments(parser)
    try:
        return ab_command.complete(parser.parse_args(words))
    except argparse.ArgumentError as error:
        raise UserError(f"{AB_ARMS}: {error}") from None


def plan_lines(env: Mapping[str, str], on_this_host: bool = False) -> list[str]:
    """What the pod's A/B will do, validated as the pod validates it (every arm's plan); for the
    pod's host only `on_this_host` (the renderer plans for another machine)."""
    args = ab_arguments(env)
    arm_plan = plan_arms(args, args.out, on_this_host)
    ran = dict.fromkeys(arm.setting for arm in arm_plan.arms)
    settings = [arm_plan.baseline, *(setting for setting in ran if setting != arm_plan.baseline)]
    return [
        f"same-pod A/B of {', '.join(settings)} (AB_ARMS), one process, one training state,"
        f" {args.steps} scored steps per arm, at least {args.warmup_steps} warm-up steps per"
        f" bench once, up front; {order_line(arm_plan.arms)}; these turns"
        f" are schedule seed {args.schedule_seed}'s, and the pod's run draws its own",
        "same-pod A/B: scored as `ab` scores its arms (docs/commands.md, A/B runs); the exact"
        f" checks and the verdict go to {args.out}/ab.txt and ab.json, and the log",
    ]


def run(env: Mapping[str, str]) -> int:
    """The pod's A/B (PLAN_ONLY=1: the bench's plan and the A/B's, then exit)."""
    if DRIVER_KNOBS["PLAN_ONLY"].read(env):
        for line in bench_plan.resolve(bench_plan.environment_config(env), env=env).lines():
            print(line, flush=True)
        planned_elsewhere = DRIVER_KNOBS["TRAINER_SLICE"].read(env) is not None
        for line in plan_lines(env, on_this_host=not planned_elsewhere):
            print(f"{bench_plan.PLAN_PREFIX} {line}", flush=True)
        return 0
    args = ab_arguments(env)
    config = bench_plan.environment_config(env)
    digest = code_sha256(engine=config.engine, same_pod_ab=True)
    print(f"{LOG_PREFIX} code sha256={digest}", flush=True)
    try:
        return ab_command.run(args)
    finally:  # the report and every arm's records outlive the pod
        copy_when_asked(
            config.results_dir, config.results_uri, lambda line: print(line, flush=True)
        )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The entry a pod runs when AB_ARMS is set (knobs from the environment; no flags)."""
    env = os.environ if env is None else env

    def body() -> int:
        if argv:
            raise UserError(f"the same-pod A/B takes its knobs from the environment: {argv[0]!r}")
        return run(env)

    return run_guarded("same-pod A/B", body, (UserError, ContractError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
