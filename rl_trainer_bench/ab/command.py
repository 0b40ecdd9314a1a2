"""`rl-trainer-bench ab`: did my change move the step time by more than the noise?

One process runs the arms back to back (default off, on, on', off': STAGE_BEFORE_UPDATE switched,
each setting twice, mirrored so a linear drift of the machine cancels) on the same micro-batches, so the effect and the noise floor are measured on
the same machine, minutes apart. Arms that change only run-time knobs share one compiled Bench;
an arm that changes a program compiles its own, reported separately. Predictions are recorded
before any device work; the exact checks, the score and the verdict come after. `--from-logs`
scores runs from separate pods with the same report, marked cross-pod (no shared noise floor).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

# Only light modules at import time: `cli` imports this one to build its parser, and a parser must
# not pay for numpy or JAX. The scorer and the driver are imported where they run.
from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import checks as ab_checks
from rl_trainer_bench.ab import interleave
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import plot as ab_plot
from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.ab import report as ab_report
from rl_trainer_bench.ab.arms import ArmSpec
from rl_trainer_bench.bench import ruler
from rl_trainer_bench.bench.ruler import ArmRun
from rl_trainer_bench.bench.worker import refuse_stage_before_fused_update
from rl_trainer_bench.config import knobs as config
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_writable_folder, read_user_text, write_text_atomically
from rl_trainer_bench.units import milliseconds

DEFAULT_STEPS = 8
DEFAULT_MIN_EFFECT_PCT = 2.0
DESIGN_ARMS, DESIGN_INTERLEAVED = "arms", "interleaved"
INTERLEAVED_LABEL = "interleaved"
ENGINE_FLAGS = "ENGINE_FLAGS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `ab` command's arguments, one group per thing they decide, in their `--help` order."""
    _add_design_arguments(parser)
    _add_length_arguments(parser)
    _add_knob_arguments(parser)
    _add_prediction_arguments(parser)
    _add_output_arguments(parser)


def _add_design_arguments(parser: argparse.ArgumentParser) -> None:
    """What is compared and how the runs are laid out: preset, arms, order, design, schedule."""
    parser.add_argument("--preset", default="cpu-tiny", help="bench preset (default: cpu-tiny)")
    parser.add_argument(
        "--arms",
        default=ab_arms.DEFAULT_ARMS,
        help="settings to compare, baseline first: built-in off, on, after, or NAME:KEY=V[,KEY=V] "
        "to define one (UPPER_CASE: driver knob, lower_case: engine key); each runs twice in the "
        "--order; repeat names to spell out the order yourself "
        f"(default: {ab_arms.DEFAULT_ARMS})",
    )
    parser.add_argument(
        "--order",
        choices=list(run_orders.ORDERS),
        help="run order of the arms: "
        + "; ".join(f"{name}: {what}" for name, what in run_orders.ORDERS.items())
        + f" (default: {run_orders.MIRRORED}, or {run_orders.WRITTEN} when --arms repeats a name)",
    )
    parser.add_argument(
        "--design",
        choices=[DESIGN_ARMS, DESIGN_INTERLEAVED],
        default=DESIGN_ARMS,
        help=f"{DESIGN_ARMS}: each setting runs as its own arms (--order), which proves the arms "
        f"train the same; {DESIGN_INTERLEAVED}: one run switches between two settings that differ "
        "only in STAGE_* knobs at its step boundaries, on a seeded balanced schedule, scored as "
        f"paired differences of neighbouring steps (default: {DESIGN_ARMS})",
    )
    parser.add_argument(
        "--schedule-seed",
        type=int,
        default=0,
        help="seed of the interleaved schedule (default: 0)",
    )


def _add_length_arguments(parser: argparse.ArgumentParser) -> None:
    """How many steps each arm runs, scored and warm-up: what the run costs in time."""
    parser.add_argument(
        "--steps",
        type=_positive,
        default=DEFAULT_STEPS,
        help="scored steps per arm; interleaved: pairs of scored steps, rounded up to even "
        f"(about the same run time) (default: {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--warmup-steps",
        type=_positive,
        default=1,
        help="warm-up steps per arm, reported, never scored (default: 1)",
    )


def _add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """Settings every arm shares: driver knobs, engine keys and the engine itself."""
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="KEY=V",
        help="a driver knob or engine key for every arm (repeatable), e.g. MICRO_STEPS=4",
    )
    parser.add_argument(
        "--engine",
        dest="knob",
        action="append",
        type=lambda spec: f"ENGINE={spec}",
        metavar="module:Class",
        help="the engine every arm times (--knob ENGINE=...); an arm may set its own ENGINE",
    )


def _add_prediction_arguments(parser: argparse.ArgumentParser) -> None:
    """What the verdict is judged against: pre-registered predictions and the smallest effect."""
    parser.add_argument(
        "--predict",
        action="append",
        default=[],
        metavar="SETTING-BASELINE=V[LOW,HIGH]",
        help="pre-registered delta and band, percent of BASELINE's median unless V ends in ms "
        "or s, e.g. on-off=-7.4[-8.5,-5.5] (repeatable, or ';'-separated)",
    )
    parser.add_argument(
        "--predict-file", type=Path, help="predictions written before the run, one per line"
    )
    parser.add_argument(
        "--min-effect",
        type=float,
        default=DEFAULT_MIN_EFFECT_PCT,
        metavar="PCT",
        help="smallest change worth finding, percent of the baseline's median step; NO-EFFECT "
        f"means smaller than this (default: {DEFAULT_MIN_EFFECT_PCT})",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the report goes, or which logs are scored instead of running arms."""
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for ab.json, ab.png and logs (default: a fresh ab-YYYYmmdd-HHMMSS/ here)",
    )
    parser.add_argument(
        "--from-logs",
        nargs="+",
        metavar="[NAME=]LOG",
        help="score bench logs from separate pods instead of running arms (cross-pod: no shared "
        "noise floor); the first log is the baseline",
    )


# Builds a Bench from its config and a log callable: the driver's, or a stand-in in tests.
BenchFactory = Callable[[config.BenchConfig, Callable[[str], None]], Any]


def run(args: argparse.Namespace, *, make_bench: BenchFactory | None = None) -> int:
    """The `ab` command: 0 when every exact check passed, 1 when one failed (verdict FAIL)."""
    started = time.time()
    if not 0 < args.min_effect < 100:
        raise UserError(f"--min-effect {args.min_effect}: give a percent between 0 and 100")
    predictions, sources = _predictions(args)
    if args.from_logs:
        return _cross_pod(args, predictions, sources, started)
    return _same_process(args, predictions, sources, started, make_bench)


# ----------------------------------------------------------------------------------------------
# Same process: arms run back to back on shared compiled programs
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """Every arm's validated configuration, built before any device work."""

    preset: config.Preset
    arms: list[ArmSpec]
    envs: dict[str, dict[str, str]]  # by arm label: the knobs its Bench and stage come from
    stages: dict[str, config.StageConfig]  # by arm label
    groups: dict[str, str]  # arm label -> bench name; arms that share programs share a bench
    bench_configs: dict[str, config.BenchConfig]  # by bench name

    def arms_of(self, bench: str) -> list[ArmSpec]:
        return [arm for arm in self.arms if self.groups[arm.label] == bench]


def plan_arms(args: argparse.Namespace, out: Path) -> ArmPlan:
    """Parse and validate the arms and their knobs; raises UserError/ConfigError on bad input,
    including every arm a worker cannot run (so no arm runs before a later one is refused)."""
    preset = config.preset(args.preset)
    arms = ab_arms.parse_arms(args.arms, args.order)
    base = _base_knobs(args.knob)
    envs = {arm.label: arm_env(preset.name, args, out, base, arm) for arm in arms}
    arm_configs = {label: config.BenchConfig.from_env(env) for label, env in envs.items()}
    for arm_config in arm_configs.values():
        refuse_stage_before_fused_update(arm_config.worker, arm_config.stage)
    names: dict[tuple[tuple[str, str], ...], str] = {}
    for arm in arms:
        names.setdefault(arm.program_knobs, f"bench{len(names) + 1}")
    groups = {arm.label: names[arm.program_knobs] for arm in arms}
    bench_configs = {groups[label]: arm_config for label, arm_config in arm_configs.items()}
    for bench_config in bench_configs.values():
        _refuse_unapplied_engine_keys(bench_config)
    stages = {label: arm_config.stage for label, arm_config in arm_configs.items()}
    return ArmPlan(preset, arms, envs, stages, groups, bench_configs)


def _same_process(
    args: argparse.Namespace,
    predictions: list[ab_predict.Prediction],
    sources: list[dict[str, Any]],
    started: float,
    make_bench: BenchFactory | None,
) -> int:
    """Every bench built (and every refusal made) before any compiles, then compiled, then the
    arms in order; Ctrl-C writes the arms that finished, marked incomplete."""
    out = args.out if args.out is not None else _fresh_name()
    plan = plan_arms(args, out)
    schedule = interleaved_schedule(args, plan)
    ab_predict.check_settings(predictions, dict.fromkeys(a.setting for a in plan.arms))
    check_writable_folder(out, "--out")
    runs: list[ArmRun] = []
    progress = Progress(started)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(progress.close)
        try:
            if schedule is None:
                progress.say(order_line(plan.arms))
            else:
                progress.say(f"design: interleaved boundaries, {schedule.describe()}")
            from rl_trainer_bench.bench.distributed import start_for_preset  # imports JAX

            progress.say(start_for_preset(plan.preset.host_devices))
            benches = _built_benches(plan, make_bench or _driver_bench, progress, cleanup)
            progress.keep_log(out / "ab.log")  # every refusal is behind us: now files may change
            compile_s = {name: _compiled(name, bench, progress) for name, bench in benches.items()}
            if schedule is not None:
                (bench,) = benches.values()
                runs.append(_run_interleaved(bench, plan, schedule, out, progress))
            for index, arm in enumerate(plan.arms if schedule is None else [], 1):
                bench = benches[plan.groups[arm.label]]
                runs.append(_run_arm(bench, plan, arm, index, args, out, progress))
            progress.say("arms done; scoring")
        except KeyboardInterrupt:
            return _interrupted(args, plan, out, runs, started, progress.where())
    return _report_same_process(
        args, plan, out, runs, compile_s, predictions, sources, started, schedule
    )


def interleaved_schedule(args: argparse.Namespace, plan: ArmPlan) -> interleave.Schedule | None:
    """The interleaved design's schedule (None for separate arms); refuses arms it cannot switch."""
    if args.design != DESIGN_INTERLEAVED:
        return None
    baseline, other = interleave.stage_only_settings(plan.arms)
    return interleave.make_schedule(
        (baseline.setting, other.setting),
        pairs=args.steps,
        warmup_steps=args.warmup_steps,
        seed=args.schedule_seed,
    )


def order_line(arms: Sequence[ArmSpec]) -> str:
    """The run order as printed before any arm runs, with what it does about a linear drift."""
    balance = run_orders.balance([arm.setting for arm in arms])
    return f"run order: {', '.join(arm.label for arm in arms)} ({balance.describe()})"


def _run_interleaved(
    bench: Any, plan: ArmPlan, schedule: interleave.Schedule, out: Path, progress: Progress
) -> ArmRun:
    """One run whose boundaries take the schedule's settings: the interleaved design."""
    stage_of = {arm.setting: plan.stages[arm.label] for arm in plan.arms}
    progress.start_arm(INTERLEAVED_LABEL, schedule.total_steps)
    result = bench.run(
        steps=schedule.total_steps - schedule.warmup_steps,
        stage=config.StageConfig(),
        arm=INTERLEAVED_LABEL,
        warmup_steps=schedule.warmup_steps,
        results_path=out / f"{INTERLEAVED_LABEL}.jsonl",
        boundary_stages=[stage_of[setting] for setting in schedule.boundaries],
    )
    return dataclasses.replace(
        result, setting=INTERLEAVED_LABEL, source=plan.groups[plan.arms[0].label]
    )


def _run_arm(
    bench: Any,
    plan: ArmPlan,
    arm: ArmSpec,
    index: int,
    args: argparse.Namespace,
    out: Path,
    progress: Progress,
) -> ArmRun:
    """One arm, the `index`-th of the plan (1-based), on its group's bench, named as planned."""
    progress.start_arm(f"{arm.label} ({index}/{len(plan.arms)})", args.warmup_steps + args.steps)
    result = bench.run(
        steps=args.steps,
        stage=plan.stages[arm.label],
        arm=arm.label,
        warmup_steps=args.warmup_steps,
        results_path=out / f"arm{index}-{arm.setting}.jsonl",
    )
    return dataclasses.replace(result, setting=arm.setting, source=plan.groups[arm.label])


def _built_benches(
    plan: ArmPlan, make_bench: BenchFactory, progress: Progress, cleanup: contextlib.ExitStack
) -> dict[str, Any]:
    """One Bench per group, built with every stage its arms run: refused here, before any compile."""
    benches = {}
    for name, bench_config in plan.bench_configs.items():
        arms = plan.arms_of(name)
        settings = ", ".join(dict.fromkeys(a.setting for a in arms))
        progress.say(f"setting up {name} (arms {settings}): pool, engine")
        benches[name] = make_bench(bench_config, progress.log)
        cleanup.callback(benches[name].close)
        benches[name].build([plan.stages[a.label] for a in arms])
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
) -> int:
    machine = {**ab_report.host_machine(), **_devices()}
    if schedule is None:
        design = f"{args.steps} scored + {args.warmup_steps} warm-up step(s) per arm"
    else:
        design = f"interleaved, {schedule.describe()}"
    title = (
        f"A/B on {plan.preset.name} ({machine['device_count']} x {machine['device_kind']}), "
        f"same process: {design}"
    )
    extra: dict[str, Any] = {
        "compile_s": compile_s,
        "arm_knobs": plan.envs,
        "bench_groups": plan.groups,
    }
    if schedule is None:
        extra["run_order"] = [arm.label for arm in plan.arms]
    else:
        extra["schedule"] = schedule.to_json()
    return _report(
        "same-process",
        title,
        out,
        runs,
        _settings(args),
        machine,
        extra,
        predictions,
        sources,
        started,
        cross_pod=False,
        min_effect_pct=args.min_effect,
        schedule=schedule,
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "preset": args.preset,
        "arms": args.arms,
        "order": args.order,
        "design": args.design,
        "schedule_seed": args.schedule_seed,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "knobs": _base_knobs(args.knob),
        "min_effect_pct": args.min_effect,
    }


def _interrupted(
    args: argparse.Namespace,
    plan: ArmPlan,
    out: Path,
    runs: list[ArmRun],
    started: float,
    where: str,
) -> int:
    """Ctrl-C: ab.json with the arms that finished, marked incomplete (no verdict), and one line."""
    content = ab_report.incomplete_document(
        mode="same-process",
        command=sys.argv,
        started_unix=started,
        finished_unix=time.time(),
        interrupted=where,
        settings=_settings(args),
        runs=runs,
        machine=ab_report.host_machine(),
        extra={"arm_knobs": plan.envs, "bench_groups": plan.groups},
    )
    out.mkdir(parents=True, exist_ok=True)
    ab_report.write_json(out / "ab.json", content)
    print(
        f"rl-trainer-bench ab: interrupted {where}; {len(runs)} of {len(plan.arms)} arms finished,"
        f" written to {out / 'ab.json'} marked incomplete (no verdict)",
        file=sys.stderr,
    )
    return 130


def arm_env(
    preset: str, args: argparse.Namespace, out: Path, base: Mapping[str, str], arm: ArmSpec
) -> dict[str, str]:
    """The env-style knobs one arm's Bench is built from: the A/B's own, the base knobs, the arm's.

    Engine keys (lower case) join ENGINE_FLAGS as `key=value` words after any the base set, so an
    arm's key overrides the base's.
    """
    env = {
        "PRESET": preset,
        "STEPS": str(args.steps),
        "WARMUP_STEPS": str(args.warmup_steps),
        "RESULTS_DIR": str(out),
    }
    engine_words = []
    for key, value in base.items():
        if key == key.lower():
            engine_words.append(f"{key}={value}")
        else:
            env[key] = value
    if ENGINE_FLAGS in env:
        engine_words.insert(0, env[ENGINE_FLAGS])
    env.update(arm.driver_knobs)
    if ENGINE_FLAGS in arm.driver_knobs:
        engine_words.append(arm.driver_knobs[ENGINE_FLAGS])
    engine_words += [f"{k}={v}" for k, v in arm.engine_keys.items()]
    if engine_words:
        env[ENGINE_FLAGS] = " ".join(engine_words)
    return env


def _refuse_unapplied_engine_keys(bench_config: config.BenchConfig) -> None:
    """An engine key the engine config does not take would make an arm a silent copy of another."""
    if not bench_config.engine_flags and not bench_config.trainer_argv:
        return
    engine_config_from = getattr(config, "engine_config_from", None)
    if engine_config_from is None:
        raise UserError(
            "engine keys in --arms/--knob need config.engine_config_from, which this build lacks: "
            "define arms with driver knobs only"
        )
    _, unapplied = engine_config_from(
        bench_config.preset,
        trainer_argv=bench_config.trainer_argv,
        engine_flags=bench_config.engine_flags,
    )
    if unapplied:
        raise UserError(
            f"engine key(s) {' '.join(unapplied)} would not be applied to the engine: "
            "fix the key names (see `rl-trainer-bench ab --help`)"
        )


def _driver_bench(bench_config: config.BenchConfig, log: Callable[[str], None]) -> Any:
    from rl_trainer_bench.bench.driver import Bench  # imports JAX: only once the runtime started

    return Bench(bench_config, log)


class Progress:
    """Progress on the terminal (elapsed, arm, step k of n); the driver's full log in ab.log.

    The driver's per-step ruler lines go to ab.log (where `--from-logs` can read them back); the
    terminal gets one short line per step instead. During an arm only the driver's other ruler lines
    (a recompile, say) reach the terminal; before the arms, everything does. Lines are held in
    memory until `keep_log` names the file, so a run refused during set-up leaves no file behind.
    """

    def __init__(self, started: float, echo: Callable[[str], None] = print):
        self._started, self._echo = started, echo
        self._file: TextIO | None = None
        self._held: list[str] = []
        self._arm, self._total, self._step = "", 0, 0

    def keep_log(self, path: Path) -> None:
        """From now on, write the log to `path` (created with its folder), held lines first."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w")
        for line in self._held:
            self._write(line)
        self._held = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def say(self, message: str) -> None:
        line = f"[ab {time.time() - self._started:6.1f}s] {message}"
        self._echo(line)
        self._write(line)

    def start_arm(self, arm: str, total_steps: int) -> None:
        self._arm, self._total, self._step = arm, total_steps, 0
        self.say(f"arm {arm}: {total_steps} steps")

    def where(self) -> str:
        """Where the run is: in which arm, or still setting up."""
        return f"in arm {self._arm}" if self._arm else "while setting up"

    def log(self, line: str) -> None:
        self._write(line)
        if f"{ruler.LOG_PREFIX} step=" in line:
            self._step += 1
            record = ruler.parse_line(line)
            kind = "warm-up" if record.warmup else "scored"
            self._echo(
                f"[ab {time.time() - self._started:6.1f}s] arm {self._arm}: step {self._step} of "
                f"{self._total} ({kind}) {milliseconds(record.step_s, '.1f')} ms"
            )
        elif not self._arm or line.startswith(ruler.LOG_PREFIX):
            self._echo(line)

    def _write(self, line: str) -> None:
        if self._file is None:
            self._held.append(line)
            return
        self._file.write(line + "\n")
        self._file.flush()


# ----------------------------------------------------------------------------------------------
# Cross-pod: two bench logs from separate runs
# ----------------------------------------------------------------------------------------------


def _arm_from_log(spec: str, taken: Sequence[str]) -> tuple[ArmRun, list[str]]:
    """One `--from-logs` entry (`[NAME=]LOG`) as an arm, and its ruler lines that did not read back."""
    name, sep, path_text = spec.partition("=")
    path = Path(path_text if sep else spec)
    label = name if sep else path.stem
    if label in taken:
        raise UserError(f"--from-logs: two logs are named {label!r}; write NAME=LOG for each")
    parsed = ruler.parse(read_user_text(path, "--from-logs"))
    records = parsed.records
    if parsed.malformed:
        print(f"{path}: {len(parsed.malformed)} ruler line(s) did not read back; see ab.json")
    if not records:
        raise UserError(
            f"--from-logs {path}: no {ruler.LOG_PREFIX} step lines in it; pass a bench log"
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


def _cross_pod(
    args: argparse.Namespace,
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
    out = args.out if args.out is not None else _fresh_name()
    check_writable_folder(out, "--out")
    title = (
        f"A/B across pods from logs ({', '.join(r.source for r in runs)}): no shared noise floor"
    )
    settings = {"from_logs": list(args.from_logs), "min_effect_pct": args.min_effect}
    machine = {"records_from": "logs of separate runs", "scored_on": ab_report.host_machine()}
    return _report(
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
        min_effect_pct=args.min_effect,
    )


# ----------------------------------------------------------------------------------------------
# Shared: score, report, files
# ----------------------------------------------------------------------------------------------


def _report(
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
) -> int:
    from rl_trainer_bench.ab import score as ab_score

    out.mkdir(parents=True, exist_ok=True)
    checks = ab_checks.exact_checks(runs)
    if schedule is None:
        score = ab_score.score(runs, min_effect_pct=min_effect_pct, cross_pod=cross_pod)
        shown = runs
    else:
        (run,) = runs
        score = ab_score.score_interleaved(run, schedule, min_effect_pct=min_effect_pct)
        shown = interleave.paired_steps_by_setting(run, schedule)
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


def _base_knobs(pairs: Sequence[str]) -> dict[str, str]:
    knobs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--knob {pair!r}: write KEY=VALUE, e.g. --knob MICRO_STEPS=4")
        if key in ab_arms.RESERVED_KNOBS:
            raise UserError(f"--knob {key}: set it with {ab_arms.RESERVED_KNOBS[key]}")
        knobs[key] = value
    return knobs


def _fresh_name() -> Path:
    """A new ab-YYYYmmdd-HHMMSS/ under the current directory (suffixed if that second is taken)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(f"ab-{stamp}")
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = Path(f"ab-{stamp}-{suffix}")
    return folder


def _devices() -> dict[str, Any]:
    import jax

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }


def _seconds(per_program: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in per_program.items()) or "-"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value
