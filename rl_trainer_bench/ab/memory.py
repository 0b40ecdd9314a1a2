"""The A/B's device memory before launch: one state for every arm, the staged micro-batch, and
the command that compiles every arm's programs for their temporaries.

The arms of a same-pod A/B share one model state (parameters, gradient sum, optimizer state), each
arm's programs compiled against it, so the device holds one state whatever the number of arms,
beside the temporaries of whichever program runs: the A/B's peak is one state plus the largest
arm program's temporaries, plus the next step's micro-batch where an arm stages it. The plan can
say the first and the last from the shapes alone (bench/state_memory.py,
bench/micro_batch_memory.py); the temporaries are known once the programs are compiled, which is
`aot --ab-arms`'s work: given its report (AB_AOT_REPORT, read by the renderer, which refuses an A/B
that report refuses or a report of other arms), the line prints the A/B's peak from it; without
one, it names the command.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_trainer_bench.ab.budget import Figure, parse_figure
from rl_trainer_bench.ab.plan import ArmPlan
from rl_trainer_bench.bench.micro_batch_memory import micro_batch_bytes
from rl_trainer_bench.bench.state_memory import state_memory
from rl_trainer_bench.config.values import shell_join
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.units import human_bytes

AOT_REPORT = "AB_AOT_REPORT"


def memory_line(arm_plan: ArmPlan, arms: str, aot_peak: str | None = None) -> str:
    """The A/B's per-device memory as far as the plan knows it (each bench's state from its arm's
    resolved engine config), against the slice's device; its peak from `aot --ab-arms` where
    `aot_peak` (AB_AOT_REPORT's figure, `aot_report_peak`) gives it."""
    engines = {name: plan.engine for name, plan in arm_plan.bench_plans.items()}
    states = {name: state_memory(engine).on_device for name, engine in engines.items()}
    largest = max(states, key=states.__getitem__)
    staging = [arm.setting for arm in arm_plan.arms if arm_plan.stages[arm.label].enabled]
    engine = engines[largest]
    staged = -(-micro_batch_bytes(engine) // engine.mesh.size) if staging else 0
    stage_text = (
        f" + the staged micro-batch {human_bytes(staged)} (arms {', '.join(dict.fromkeys(staging))})"
        if staging
        else " (no arm stages a micro-batch)"
    )
    config = arm_plan.bench_configs[largest]
    tpu_slice = config.trainer_slice
    device = (
        f" against {human_bytes(tpu_slice.chip.device_memory_bytes)} per {tpu_slice.chip.name} device"
        if tpu_slice is not None
        else ""
    )
    target = tpu_slice.name if tpu_slice is not None else "local"
    figure = None if aot_peak is None else parse_figure(aot_peak, "B")
    if figure is not None:
        return (
            f"A/B device memory: peak {human_bytes(figure[0])} per device{device}, from {figure[1]}:"
            f" one state for every arm, {human_bytes(states[largest])} per device{stage_text},"
            " + the largest arm program's temporaries"
        )
    return (
        f"A/B device memory: one state for every arm, {human_bytes(states[largest])} per device"
        f"{stage_text}, + the largest arm program's temporaries, known once compiled: the peak"
        f"{device} and the fit: {aot_ab_command(arm_plan.preset.name, target, arms)} with this"
        " TRAINER_ARGV and ENGINE_FLAGS (AB_AOT_REPORT takes its --output)"
    )


def aot_ab_command(preset: str, target: str, arms: str) -> str:
    """The command line that compiles every arm's programs, as a shell reads it back: arms hold
    any text an engine key's value may (quotes, `$`), so each word goes through `shell_join`."""
    return shell_join(
        ["rl-trainer-bench", "aot", "--preset", preset, "--target", target, "--ab-arms", arms]
    )


def aot_report_peak(path: str, arms: str) -> str:
    """AB_AOT_REPORT (`aot --ab-arms ... --output FILE`) as the figure its pod gets: the A/B's peak
    with where it comes from; UserError for another file, another A/B's report, or one whose A/B
    does not fit (refused before launch)."""
    try:
        report = json.loads(read_user_text(Path(path), AOT_REPORT))
        sets, compiled_arms = report["program_sets"], report["ab_arms"]
        peak, refused = report["peak_bytes"], report["refused_settings"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(
            f"{AOT_REPORT}={path}: not a report of `rl-trainer-bench aot --ab-arms ARMS --output"
            " FILE`; write one with the render's AB_ARMS"
        ) from None
    if compiled_arms != arms:
        raise UserError(
            f"{AOT_REPORT}={path}: compiled for arms {compiled_arms!r}, not AB_ARMS {arms!r}: run"
            " aot --ab-arms again with these arms"
        )
    if refused:
        raise UserError(
            f"{AOT_REPORT}={path}: aot refused this A/B before launch: arm(s) {', '.join(refused)}"
            " do not fit with the margin free; change or drop them, or time them in pods of"
            " their own (ab --from-logs)"
        )
    largest = max(sets, key=lambda entry: entry["report"]["peak_bytes"])
    source = (
        f"aot --ab-arms in {path}: {largest['report']['preset']} on"
        f" {largest['report']['target']}, arm(s) {', '.join(largest['settings'])}, with the margin"
        " free"
    )
    return Figure(float(peak), source).text("B")
