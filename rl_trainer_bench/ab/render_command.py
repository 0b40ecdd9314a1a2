"""`rl-trainer-bench render`: the launch room's renderer, handed the same-pod A/B's check of
AB_ARMS and, for the AOT job (AOT_JOB), the A/B's settings. The launch room cannot import the A/B's, so the check reaches it from this room; this is
its own module so that the pod's own A/B entry (`same_pod.py`, embedded in the pod) stays free of
the renderer and its YAML and schema."""

from __future__ import annotations

import argparse
import functools

from rl_trainer_bench.ab.budget import resolved_sources
from rl_trainer_bench.ab.memory import aot_report_peak
from rl_trainer_bench.ab.same_pod import plan_lines, setting_knobs
from rl_trainer_bench.launch import render
from rl_trainer_bench.launch.aot_job import render_aot_job


def run(args: argparse.Namespace) -> int:
    """`render`, with the A/B's step-time, noise and aot sources read here: the pod gets their
    figures, each with its source named."""
    if args.ab_arms:  # without AB_ARMS the knobs' own check refuses them
        args.ab_step_time, args.ab_step_noise = resolved_sources(
            args.ab_step_time, args.ab_step_noise
        )
        if args.ab_aot_report:
            args.ab_aot_report = aot_report_peak(args.ab_aot_report, args.ab_arms)
    aot_job = functools.partial(render_aot_job, arm_settings=setting_knobs)  # AOT_JOB's settings
    return render.run(args, check_pod=plan_lines, render_aot_job=aot_job)
