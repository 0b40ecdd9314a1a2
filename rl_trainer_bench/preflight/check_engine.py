"""`rl-trainer-bench check-engine`: run the engine contract's conformance checks on an engine.

Another engine (e.g. an adapter around MaxText's) is named as `module:Class`; it is built the way
the built-in one is, `Class(engine_config)`, from the engine config of the plan a run of the same
knobs resolves (`bench/plan.command_plan`), so a check exercises exactly what a bench run would.
"""

from __future__ import annotations

import argparse

from rl_trainer_bench.bench.plan import command_plan
from rl_trainer_bench.config.knobs import CHECK_ENGINE, add_knob_flags, add_preset_flag, knobs_of
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.contract import example_payloads_for
from rl_trainer_bench.engine.factory import engine_class
from rl_trainer_bench.engine.returns import check_engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_preset_flag(parser, "shapes and mesh")
    add_knob_flags(parser, knobs_of(CHECK_ENGINE))


def run(args: argparse.Namespace) -> int:
    plan = command_plan(
        preset=preset(args.preset),
        engine=args.engine,
        trainer_argv=args.trainer_argv,
        engine_flags=args.engine_flags,
        maxtext_driver=args.maxtext_driver,
    )
    spec, config = plan.config.engine, plan.engine
    engine_type = engine_class(spec, knob="--engine")  # a bad name is refused before JAX starts
    from rl_trainer_bench.bench.distributed import start_for_preset  # JAX: not for --help

    start_for_preset(plan.config.preset.host_devices)  # cpu-tiny's 2x2x2 mesh: 8 host devices
    if plan.unapplied:
        print(f"check-engine: keys not applied by the built-in engine: {', '.join(plan.unapplied)}")
    from rl_trainer_bench.engine.sharing_check import check_sharing, live_bytes  # JAX

    payloads = example_payloads_for(config, 2, prefix="check")
    before = live_bytes()
    engine = engine_type(config)
    # Its training state is whole once `compile` returns (the built-in engine makes it beside the
    # compile, on a thread of its own); the contract's checks compile again at no cost.
    engine.compile(payloads[0])
    state_bytes = live_bytes() - before  # what the engine allocated: its training state
    failures = check_engine(engine, payloads)
    if not failures:  # the state is shared only by an engine that steps as the contract says
        sharing = check_sharing(engine, config, payloads, state_bytes)
        print(f"check-engine: {sharing.measured}")
        failures = sharing.failures
    for failure in failures:
        print(f"check-engine: FAIL {failure}")
    if failures:
        return 1
    print(f"check-engine: {spec} conforms to the engine contract ({args.preset})")
    return 0
