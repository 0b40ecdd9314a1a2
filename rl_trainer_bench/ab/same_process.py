"""Same process: the arms run back to back on shared compiled programs, or interleaved in one run.

Every bench is built (and every refusal made) before any compile, all over one training state
(`one_state.py`), then compiled, then each warmed once, then the arms run in order on the same
micro-batches, each turn scored from its first step, so the effect and the noise floor are
measured on the same machine, minutes apart.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_trainer_bench import interrupts
from rl_trainer_bench.ab import interleave, one_state, sequential
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.ab import report as ab_report
from rl_trainer_bench.ab.arms import ArmSpec, base_knobs
from rl_trainer_bench.ab.budget import AbRun
from rl_trainer_bench.ab.parser import DESIGN_INTERLEAVED, STOP_BUDGET, STOP_SETTLED
from rl_trainer_bench.ab.plan import ArmPlan, plan_arms
from rl_trainer_bench.ab.progress import Progress
from rl_trainer_bench.ab.report_files import (
    AB_REPORT_FILES,
    fresh_name,
    move_earlier_ab_aside,
    write_verdict,
)
from rl_trainer_bench.bench.boundary_copy import ASSUMED_LINK
from rl_trainer_bench.bench.engine_plan import extra_work_line
from rl_trainer_bench.bench.plan import Plan
from rl_trainer_bench.bench.runtime import SINGLE_PROCESS, runtime_for
from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.config import compile_cache
from rl_trainer_bench.config import knobs as config
from rl_trainer_bench.engine.background import Background
from rl_trainer_bench.engine.contract import StateMismatch
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_writable_folder, refuse_special_file

INTERLEAVED_LABEL = "interleaved"
INTERLEAVED_FILE = f"{INTERLEAVED_LABEL}.jsonl"


def _results_name(index: int, arm: ArmSpec) -> str:
    """The file of the `index`-th arm's step records (1-based)."""
    return f"arm{index}-{arm.setting}.jsonl"


# Builds a Bench from its arm's plan and a log callable: the driver's, or a stand-in in tests.
BenchFactory = Callable[[Plan, Callable[[str], None]], Any]


def same_process(
    args: argparse.Namespace,
    resolved: AbRun,
    predictions: list[ab_predict.Prediction],
    sources: list[dict[str, Any]],
    started: float,
    make_bench: BenchFactory | None,
    planned: ArmPlan | None = None,
) -> int:
    """Every bench built (and every refusal made) before any compiles, then compiled, then the
    arms in order; Ctrl-C writes the arms that finished, marked incomplete. `planned`: the arms'
    plans made already for `resolved` (a same-pod A/B's, printed and checked), else made here."""
    out = args.out if args.out is not None else fresh_name()
    plan = planned if planned is not None else plan_arms(args, resolved, out)
    schedule = interleaved_schedule(args, plan)
    ab_predict.check_settings(predictions, dict.fromkeys(a.setting for a in plan.arms))
    check_writable_folder(out, "--out")
    arm_files = [_results_name(i, arm) for i, arm in enumerate(plan.arms, 1)]
    for name in (*AB_REPORT_FILES, INTERLEAVED_FILE, *arm_files):
        refuse_special_file(out / name, "--out")
    runs: list[ArmRun] = []
    progress = Progress(started)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(progress.close)
        try:
            progress.say(f"preset: {plan.preset.name} (chosen by {plan.preset_source})")
            one_state.refuse_other_engines(plan)
            runtime = _runtime_beside(plan)
            if schedule is None:
                progress.say(order_line(plan.arms))
                for line in plan.run.planned_lines(one_state.set_warmups(plan)):
                    progress.say(line)
            else:
                progress.say(f"design: interleaved boundaries, {schedule.describe()}")
            for line in [*extra_work_lines(plan), *boundary_lines(plan)]:
                progress.say(line)
            progress.say(runtime.result() if runtime else _runtime_started(plan))
            progress.say(_compile_cache_started(args, plan))
            benches = _built_benches(plan, make_bench or _driver_bench, progress, cleanup)
            _start_writing(out, progress)  # every refusal is behind us: now files may change
            compile_s = {name: _compiled(name, bench, progress) for name, bench in benches.items()}
            warm = one_state.warm_ups(plan, plan.warmup_steps) if schedule is None else []
            for each in warm:
                _warm_up(benches[each.bench], each, progress)
            if schedule is not None:
                (bench,) = benches.values()
                runs.append(_run_interleaved(bench, plan, schedule, out, progress))
            for index, arm in enumerate(plan.arms if schedule is None else [], 1):
                bench = benches[plan.groups[arm.label]]
                runs.append(_run_arm(bench, plan, arm, index, out, progress))
                if _settled(plan, runs, progress):
                    break
            progress.say("arms done; scoring")
        except KeyboardInterrupt as interrupt:
            if not progress.keeps_log:
                _start_writing(out, progress)
            return _interrupted(args, plan, out, runs, started, progress.where(), interrupt)
    return _report_same_process(
        args, plan, out, runs, compile_s, predictions, sources, started, schedule, warm
    )


def _runtime_beside(plan: ArmPlan) -> Background[str] | None:
    """The runtime's start on a thread of its own, for one process on this host's devices; None
    under Pathways or with several processes, whose start (`distributed.initialize_runtime`)
    stays on the calling thread, as their libraries are used in their own examples."""
    if runtime_for(os.environ, plan.preset.host_devices).kind != SINGLE_PROCESS:
        return None
    return Background(lambda: _runtime_started(plan), "runtime-start")


def _runtime_started(plan: ArmPlan) -> str:
    """JAX imported, started as the preset asks and its devices opened: run beside the design's
    lines (their simulations take about a second), since opening a TPU chip takes 8-9 s of the
    set-up before the compile (benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md)."""
    import jax  # on this thread: the import is part of the runtime's start

    from rl_trainer_bench.bench.distributed import start_for_preset  # JAX's: as above

    line = start_for_preset(plan.preset.host_devices)
    jax.devices()
    return line


def _compile_cache_started(args: argparse.Namespace, plan: ArmPlan) -> str:
    """JAX's persistent compilation cache where --compile-cache, else `--knob COMPILE_CACHE=`,
    else the environment's COMPILE_CACHE says, before the first compile: the log's line saying
    where, or why it is off. One cache for the process: every arm's programs go in it."""
    from rl_trainer_bench.bench import persistent_cache  # JAX's: after the runtime started

    from_env = compile_cache.parse(compile_cache.KNOB, os.environ.get(compile_cache.KNOB, ""))
    setting = args.compile_cache or plan.plans[plan.baseline].config.compile_cache or from_env
    return persistent_cache.use(compile_cache.folder(setting, os.environ), os.environ)


def _start_writing(out: Path, progress: Progress) -> None:
    """The run's first files: an earlier run's moved aside, then the log kept in `out/ab.log`."""
    out.mkdir(parents=True, exist_ok=True)
    moved: list[str] = []
    move_earlier_ab_aside(out, moved.append)
    progress.keep_log(out / "ab.log")
    for line in moved:
        progress.say(line)


def interleaved_schedule(args: argparse.Namespace, plan: ArmPlan) -> interleave.Schedule | None:
    """The interleaved design's schedule (None for separate arms), of the steps and seed the plan's
    run resolved; refuses arms it cannot switch."""
    if args.design != DESIGN_INTERLEAVED:
        return None
    if args.order is not None:
        raise UserError(
            f"--order {args.order} orders separate arms (--design arms); an interleaved run"
            " switches settings on its seeded schedule: drop --order, or set --schedule-seed"
        )
    if args.blocks is not None:
        raise UserError(
            f"--blocks {args.blocks} sets the blocks of separate arms (--design arms); an "
            "interleaved run has its own schedule: drop --blocks, or set --steps"
        )
    baseline, other = interleave.stage_only_settings(plan.arms)
    if baseline.setting != plan.baseline:  # the blocks order may have run the other one first
        baseline, other = other, baseline
    return interleave.make_schedule(
        (baseline.setting, other.setting),
        pairs=plan.run.steps,
        warmup_steps=plan.warmup_steps,
        seed=plan.run.schedule_seed,
    )


def extra_work_lines(plan: ArmPlan) -> list[str]:
    """A line for each bench whose arms run extra device work (`extra_device_work`): its size,
    so the effect the A/B should find is stated before it runs."""
    lines = []
    for name, bench_plan in plan.bench_plans.items():
        work = extra_work_line(bench_plan.config, bench_plan.engine)
        if work:
            settings = ", ".join(dict.fromkeys(a.setting for a in plan.arms_of(name)))
            lines.append(f"{name} (arms {settings}): {work}")
    return lines


def boundary_lines(plan: ArmPlan) -> list[str]:
    """The step boundary's copy of each distinct micro-batch the benches train (one, unless an
    arm's keys change its arrays): its bytes, and what STAGE_BEFORE_UPDATE can save, at the
    link the plan assumes; each bench measures its own after its compile."""
    copies = {}
    for name, bench_plan in plan.bench_plans.items():
        copies.setdefault(bench_plan.boundary_copy(), []).append(name)
    lines = []
    for copy, names in copies.items():
        which = f" ({', '.join(names)})" if len(copies) > 1 else ""
        lines.append(f"micro-batch bytes{which}: {copy.bytes_line()}")
        lines.append(f"step boundary{which}: {copy.prediction_line(ASSUMED_LINK)}")
    return lines


def order_line(arms: Sequence[ArmSpec]) -> str:
    """The run order as printed before any arm runs, with what it does about a linear drift."""
    described = run_orders.describe([arm.setting for arm in arms])
    return f"run order: {', '.join(arm.label for arm in arms)} ({described})"


def _run_interleaved(
    bench: Any, plan: ArmPlan, schedule: interleave.Schedule, out: Path, progress: Progress
) -> ArmRun:
    """One run whose boundaries take the schedule's settings: the interleaved design. The run's
    last step, never scored, closes with the setting of the boundary before it."""
    stage_of = {arm.setting: plan.stages[arm.label] for arm in plan.arms}
    closing = [*schedule.boundaries, schedule.boundaries[-1]]
    progress.start_arm(INTERLEAVED_LABEL, schedule.total_steps)
    result = bench.run(
        steps=schedule.total_steps - schedule.warmup_steps,
        stage=config.StageConfig(),
        arm=INTERLEAVED_LABEL,
        warmup_steps=schedule.warmup_steps,
        results_path=out / INTERLEAVED_FILE,
        boundary_stages=[stage_of[setting] for setting in closing],
    )
    return dataclasses.replace(
        result, setting=INTERLEAVED_LABEL, source=plan.groups[plan.arms[0].label]
    )


def _run_arm(
    bench: Any,
    plan: ArmPlan,
    arm: ArmSpec,
    index: int,
    out: Path,
    progress: Progress,
) -> ArmRun:
    """One turn of an arm, the `index`-th of the plan (1-based), on its group's bench, named as
    planned: every step scored (the bench was warmed up front)."""
    progress.start_arm(f"{arm.label} ({index}/{len(plan.arms)})", plan.run.steps)
    result = bench.run(
        steps=plan.run.steps,
        stage=plan.stages[arm.label],
        arm=arm.label,
        warmup_steps=0,
        results_path=out / _results_name(index, arm),
    )
    return dataclasses.replace(result, setting=arm.setting, source=plan.groups[arm.label])


def _settled(plan: ArmPlan, runs: Sequence[ArmRun], progress: Progress) -> bool:
    """Whether a run that stops when settled stops here: after a half-block whose look settles
    every verdict, or the budget's last look (sequential.py)."""
    looks = plan.run.looks
    if looks is None:
        return False
    look = sequential.look(runs, looks, plan.run.min_effect, plan.baseline)
    if look is None:
        return False
    progress.say(look.line())
    return look.settled


def _warm_up(bench: Any, warm: one_state.WarmUp, progress: Progress) -> None:
    """The bench's warm-up steps, once, before any scored turn (their records are not scored)."""
    progress.start_arm(f"warm-up {warm.bench}", warm.steps)
    bench.run(
        steps=0,
        stage=config.StageConfig(),
        arm=f"warm-up-{warm.bench}",
        warmup_steps=warm.steps,
        boundary_stages=warm.boundary_stages,
    )


def _built_benches(
    plan: ArmPlan, make_bench: BenchFactory, progress: Progress, cleanup: contextlib.ExitStack
) -> dict[str, Any]:
    """One Bench per group, built with every stage its arms run, every one after the first over
    the first's training state: refused here, before any compile."""
    benches: dict[str, Any] = {}
    for name in one_state.bench_order(plan):
        arms = plan.arms_of(name)
        settings = ", ".join(dict.fromkeys(a.setting for a in arms))
        progress.say(f"setting up {name} (arms {settings}): pool, engine")
        benches[name] = make_bench(plan.bench_plans[name], progress.log)
        cleanup.callback(benches[name].close)
        state_of = next(iter(benches.values())) if len(benches) > 1 else None
        try:
            benches[name].build([plan.stages[a.label] for a in arms], state_of=state_of)
        except StateMismatch as why:
            raise one_state.state_refusal(plan, name, str(why)) from why
    return benches


def _compiled(name: str, bench: Any, progress: Progress) -> dict[str, float]:
    progress.say(f"compiling {name}")
    compile_s = dict(bench.compile())
    progress.say(f"{name} compiled: {_seconds(compile_s)}")
    return compile_s


def _report_same_process(
    args: argparse.Namespace,
    plan: ArmPlan,
    out: Path,
    runs: list[ArmRun],
    compile_s: dict[str, dict[str, float]],
    predictions: list[ab_predict.Prediction],
    sources: list[dict[str, Any]],
    started: float,
    schedule: interleave.Schedule | None,
    warm: Sequence[one_state.WarmUp],
) -> int:
    machine = {**ab_report.host_machine(), **_devices()}
    turns = run_orders.orientations([arm.setting for arm in plan.arms], plan.baseline)
    if schedule is None:
        design = f"{plan.run.steps} scored step(s) per arm, {one_state.warm_up_line(warm)}"
        if turns is not None:
            seed = plan.run.schedule_seed
            design += f", blocks {' '.join(turns)} (drawn from schedule seed {seed})"
    else:
        design = f"interleaved, {schedule.describe()}"
    title = (
        f"A/B on {plan.preset.name} ({machine['device_count']} x {machine['device_kind']}), "
        f"same process: {design}"
    )
    extra: dict[str, Any] = {
        "compile_s": compile_s,
        "arm_knobs": plan.knobs,
        "bench_groups": plan.groups,
        "training_state": one_state.SHARED_STATE_NOTE,
        "warmup_steps_total": schedule.warmup_steps
        if schedule is not None
        else sum(w.steps for w in warm),
    }
    if schedule is None:
        extra["run_order"] = [run.label for run in runs]
        extra["planned_run_order"] = [arm.label for arm in plan.arms]
        extra["block_orientations"] = turns
    else:
        extra["schedule"] = schedule.to_json()
    return write_verdict(
        "same-process",
        title,
        out,
        runs,
        _settings(args, plan),
        machine,
        extra,
        predictions,
        sources,
        started,
        cross_pod=False,
        min_effect_pct=plan.run.min_effect,
        schedule=schedule,
        baseline=plan.baseline,
        looks=plan.run.looks,
    )


def _settings(args: argparse.Namespace, plan: ArmPlan) -> dict[str, Any]:
    """The run's settings as ab.json records them: the flags as given, the values the run
    resolved for those it left to it."""
    run = plan.run
    return {
        "preset": plan.preset.name,
        "preset_source": plan.preset_source,
        "arms": args.arms,
        "order": args.order,
        "blocks": run.blocks,
        "design": args.design,
        "schedule_seed": run.schedule_seed,
        "steps": run.steps,
        "warmup_steps": plan.warmup_steps,
        "budget": args.budget,
        "step_time": args.step_time,
        "step_noise": args.step_noise,
        "stop": STOP_BUDGET if run.looks is None else STOP_SETTLED,
        "looks_max_units": None if run.looks is None else run.looks.max_units,
        "knobs": base_knobs(args.knob),
        "min_effect_pct": run.min_effect,
    }


def _interrupted(
    args: argparse.Namespace,
    plan: ArmPlan,
    out: Path,
    runs: list[ArmRun],
    started: float,
    where: str,
    interrupt: KeyboardInterrupt,
) -> int:
    """Ctrl-C or SIGTERM: ab.json with the arms that finished, marked incomplete (no verdict), one
    line, and 128 + the signal as the exit code."""
    content = ab_report.incomplete_document(
        mode="same-process",
        command=sys.argv,
        started_unix=started,
        finished_unix=time.time(),
        interrupted=where,
        settings=_settings(args, plan),
        runs=runs,
        machine=ab_report.host_machine(),
        extra={"arm_knobs": plan.knobs, "bench_groups": plan.groups},
    )
    ab_report.write_json(out / "ab.json", content)
    print(
        f"rl-trainer-bench ab: {interrupts.describe(interrupt)} {where}; {len(runs)} of"
        f" {len(plan.arms)} arms finished, written to {out / 'ab.json'} marked incomplete"
        " (no verdict)",
        file=sys.stderr,
    )
    return interrupts.exit_code(interrupt)


def _driver_bench(plan: Plan, log: Callable[[str], None]) -> Any:
    """The driver's Bench of one arm's plan, built from the engine config that plan resolved."""
    from rl_trainer_bench.bench.driver import Bench  # imports JAX: only once the runtime started

    return Bench(plan.config, log, engine_config=plan.engine)


def _devices() -> dict[str, Any]:
    import jax  # JAX: `render` reads this module, for the same-pod A/B's check, without it

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }


def _seconds(per_program: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in per_program.items()) or "-"
