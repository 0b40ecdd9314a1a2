"""`rl-trainer-bench render`: the launch room's renderer, handed the same-pod A/B's planner of
AB_ARMS, which it calls once; the AOT job (AOT_JOB) takes the A/B's program sets from that plan.
The launch room cannot import the A/B's, so the planner reaches it from this room; this is its own
module so that the pod's own A/B entry (`same_pod.py`, embedded in the pod) stays free of the
renderer and its YAML and schema, and of the program sets only the AOT job needs (the bench
pod's code rides in its manifest, whose annotations `kubectl apply` caps)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.ab.aot_arms import program_sets
from rl_trainer_bench.ab.budget import resolved_sources
from rl_trainer_bench.ab.memory import aot_report_peak
from rl_trainer_bench.ab.same_pod import AB_ARMS, PodAb, plan_ab
from rl_trainer_bench.bench.plan import Plan
from rl_trainer_bench.launch import render
from rl_trainer_bench.launch.aot_job import render_aot_job


@dataclasses.dataclass(frozen=True)
class RenderedAb:
    """The same-pod A/B as the render plans it: the pod's plan of it (`same_pod.plan_ab`, once),
    whose lines the render prints, and the program sets of its arms that the AOT job compiles."""

    planned: PodAb
    # (the settings that compile it, its knobs) of each distinct program set of the arms over the
    # pod's ENGINE_FLAGS: what `aot --ab-arms` of these arms compiles, grouped and ordered as it
    # finds them (`aot_arms.program_sets`).
    program_sets: tuple[tuple[tuple[str, ...], dict[str, str]], ...]

    @property
    def lines(self) -> list[str]:
        return self.planned.lines


def plan_for_render(env: Mapping[str, str], pod: Plan) -> RenderedAb:
    """The pod's A/B planned once from its environment and plan, with its program sets."""
    sets = program_sets(env[AB_ARMS], env.get("ENGINE_FLAGS", ""))
    return RenderedAb(plan_ab(env, pod), tuple(sets))


def run(args: argparse.Namespace) -> int:
    """`render`, with the A/B's step-time, noise and aot sources read here: the pod gets their
    figures, each with its source named, in the knobs the renderer writes (the user's flags stay
    as parsed)."""
    if args.ab_arms:  # without AB_ARMS the knobs' own check refuses them
        step_time, noise = resolved_sources(args.ab_step_time, args.ab_step_noise)
        report = args.ab_aot_report and aot_report_peak(args.ab_aot_report, args.ab_arms)
        sourced = {"ab_step_time": step_time, "ab_step_noise": noise, "ab_aot_report": report}
        args = argparse.Namespace(**{**vars(args), **sourced})
    return render.run(args, plan_ab=plan_for_render, render_aot_job=render_aot_job)
