"""Synthetic A/B inputs for the scorer and check tests: step records with chosen times and contents."""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.bench.step_record import ArmRun, StepRecord

MICRO_STEPS = 2


def record(
    step: int, step_s: float, *, warmup: bool = False, staged: str | None = None
) -> StepRecord:
    """One step that trained micro-batches bench_<step>_<i> with digests derived from them."""
    names = [f"bench_{step}_{i}" for i in range(MICRO_STEPS)]
    return StepRecord(
        step=step,
        warmup=warmup,
        step_s=step_s,
        fwd_bwd_dispatch_s=[0.001] * MICRO_STEPS,
        first_call_extra_s=0.002,
        update_s=0.001,
        drain_s=0.001,
        stage_s=0.0,
        device_wait_s=0.0,
        tokens=1000,
        tokens_per_s_per_device=1000 / step_s,
        tflops_per_device=None,
        mfu=None,
        loss=0.5,
        grad_norm=1.0,
        loss_denominator=float(400 + step),
        overflow_count=0,
        replay_count=0,
        micro_batches=names,
        digests=[f"digest-{name}" for name in names],
        device_ready_s=[0.01, 0.02],
        update_ready_s=0.03,
        boundary_idle_s=0.0,
        staged=staged,
    )


def arm(
    label: str, setting: str, times: list[float], *, staged: bool = False, warmup_s: float = 1.0
) -> ArmRun:
    """An arm with one warm-up step then one scored step per time, counters as a healthy run has them."""
    steps = [warmup_s, *times]
    records = [
        record(
            i,
            t,
            warmup=i == 0,
            staged=f"bench_{i + 1}_0" if staged else None,
        )
        for i, t in enumerate(steps)
    ]
    return ArmRun(
        label=label,
        setting=setting,
        staged=staged,
        records=records,
        updates=len(records),
        stages=len(records) if staged else 0,
        recompiles=[],
    )


def jittered(median_s: float, steps: int, rel_sd: float, seed: int) -> list[float]:
    """Step times around `median_s` with relative spread `rel_sd` (reproducible)."""
    rng = np.random.default_rng(seed)
    return list(median_s * (1 + rel_sd * rng.standard_normal(steps)))


def off_on_off_on(
    off_s: float,
    on_s: float,
    *,
    repeat_off_s: float | None = None,
    rel_sd: float = 0.005,
    steps: int = 20,
) -> list[ArmRun]:
    """The default A/B: off, on, off', on' with the given medians."""
    repeat_off_s = off_s if repeat_off_s is None else repeat_off_s
    return [
        arm("off", "off", jittered(off_s, steps, rel_sd, 1)),
        arm("on", "on", jittered(on_s, steps, rel_sd, 2), staged=True),
        arm("off'", "off", jittered(repeat_off_s, steps, rel_sd, 3)),
        arm("on'", "on", jittered(on_s, steps, rel_sd, 4), staged=True),
    ]


def drifting_arms(
    settings_in_run_order: list[str],
    *,
    base_s: float,
    slope: float,
    steps: int,
    effect_s: dict[str, float] | None = None,
    rel_sd: float = 0.0,
    seed: int = 0,
) -> list[ArmRun]:
    """Arms run back to back on a machine whose step time drifts linearly with the run clock.

    Step time = base_s + the setting's effect + slope x (run clock at the step's start), where the
    run clock is the sum of the step times before it (warm-up included), times a relative jitter.
    """
    rng = np.random.default_rng(seed)
    clock = 0.0
    runs, seen = [], {}
    for setting in settings_in_run_order:
        times = []
        for _ in range(steps + 1):  # one warm-up step, then the scored ones
            step_s = (base_s + (effect_s or {}).get(setting, 0.0) + slope * clock) * (
                1 + rel_sd * rng.standard_normal()
            )
            times.append(step_s)
            clock += step_s
        label = setting + "'" * seen.get(setting, 0)
        seen[setting] = seen.get(setting, 0) + 1
        runs.append(arm(label, setting, times[1:], warmup_s=times[0]))
    return runs


def interleaved_run(
    schedule, *, base_s: float, slope: float, unstaged_first_call_s: float = 0.0
) -> ArmRun:
    """One interleaved run on a machine drifting linearly with the run clock: a step whose opening
    boundary did not stage pays `unstaged_first_call_s` more (the schedule's first setting is
    taken as the one that does not stage)."""
    not_staging = schedule.settings[0]
    closing = [*schedule.boundaries, schedule.boundaries[-1]]  # the last step's, as the run's
    records, clock = [], 0.0
    for step in range(schedule.total_steps):
        opened_unstaged = step > 0 and closing[step - 1] == not_staging
        step_s = base_s + slope * clock + (unstaged_first_call_s if opened_unstaged else 0.0)
        staged = f"bench_{step + 1}_0" if closing[step] != not_staging else None
        records.append(record(step, step_s, warmup=step < schedule.warmup_steps, staged=staged))
        clock += step_s
    return interleaved_arm(records, [b != not_staging for b in closing])


def interleaved_arm(records, stages_at: list[bool]) -> ArmRun:
    """An interleaved run of `records` whose boundaries staged where `stages_at` says."""
    return ArmRun(
        label="interleaved",
        setting="interleaved",
        staged=True,
        records=records,
        updates=len(records),
        stages=sum(stages_at),
        recompiles=[],
        stages_at=stages_at,
    )


def loaded_arms(
    settings_in_run_order: list[str],
    *,
    base_s: float,
    load_s: list[float],
    steps: int,
    effect_s: dict[str, float] | None = None,
    jitter=None,
) -> list[ArmRun]:
    """Arms run back to back on a host whose other work adds `load_s[i]` to every step of the i-th
    arm; `jitter(arm index, steps)` adds each step's own noise (seconds) when given."""
    runs, seen = [], {}
    for index, setting in enumerate(settings_in_run_order):
        step_s = base_s + (effect_s or {}).get(setting, 0.0) + load_s[index]
        noise = np.zeros(steps + 1) if jitter is None else jitter(index, steps + 1)
        times = list(step_s + noise)
        seen[setting] = seen.get(setting, 0) + 1
        runs.append(arm(f"{setting}#{seen[setting]}", setting, times[1:], warmup_s=times[0]))
    return runs


def u_shaped_load(arms: int, peak_s: float) -> list[float]:
    """A load heaviest at both ends of the run and zero in its middle: peak_s x (2x - 1)^2."""
    return [peak_s * (2 * i / (arms - 1) - 1) ** 2 for i in range(arms)]
