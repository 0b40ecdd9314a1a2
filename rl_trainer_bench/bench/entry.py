"""The driver's entry (`bench_driver.py` in a pod, `rl-trainer-bench run`): knobs, plan, then run.

Light on purpose: the knobs and the plan are host work, so `--plan` (PLAN_ONLY=1), every refusal
the plan makes and a misspelt knob are answered without importing JAX; the timed run
(`bench/driver.py`) is imported only once the plan has passed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence

from rl_trainer_bench.bench import micro_batch_memory, plan, plan_document, results_copy
from rl_trainer_bench.bench.step_record import LOG_PREFIX
from rl_trainer_bench.chips.local_chips import usable_tpu
from rl_trainer_bench.config.knobs import BenchConfig, add_driver_knob_arguments, driver_knobs
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError, exit_process, run_guarded
from rl_trainer_bench.io import check_writable_folder, refuse_special_file


def run_bench(config: BenchConfig, env: Mapping[str, str], log: Callable[[str], None]) -> int:
    """The driver's whole run; returns the exit code (`driver.run_planned`'s).

    The plan comes first: every refusal host work can make is made before the runtime starts
    (the plan, the results folder, staging with a fused worker), and PLAN_ONLY=1 ends the run
    there, having printed it. An earlier results file is moved aside only when the run's first
    step is written.
    """
    # A plan for a TRAINER_SLICE may run on any host (the renderer's, a laptop): this host's memory
    # says nothing of the pod's there, so only a run, or a plan for this machine, checks it.
    planned_elsewhere = config.plan_only and config.trainer_slice is not None
    host_bytes = None if planned_elsewhere else micro_batch_memory.host_memory_bytes()
    rendered = plan_document.embedded(env.get(plan_document.CODE_DIR_VARIABLE))
    resolved = plan.resolve(config, host_bytes, env, rendering=rendered is not None)
    lines = resolved.lines()
    if rendered is not None:  # a rendered pod: the plan printed before launch, checked here
        lines = plan_document.executed(rendered, lines, resolved.engine, config, env).printed(
            plan.PLAN_PREFIX
        )
    if config.plan_only:
        for line in lines:
            log(line)
        return 0
    check_writable_folder(config.results_dir, "RESULTS_DIR")
    refuse_special_file(config.results_dir / "results.jsonl", "RESULTS_DIR")
    companions = {}
    if rendered is not None:  # the plan the pod executes: in its log and beside its results
        for line in lines:
            log(line)
        companions[plan_document.EXECUTED_FILE] = plan_document.executed_json(lines)
    elif resolved.unapplied:
        log(f"{LOG_PREFIX} engine keys not applied: {' '.join(resolved.unapplied)}")
    from rl_trainer_bench.bench.driver import run_planned  # JAX, from here on

    # each step's files outlive the pod as the run goes, and all of them however it ends
    with results_copy.copying(config.results_dir, config.results_uri, log):
        if rendered is None:  # which cell and why, as `ab` says it first (a pod's plan says it)
            log(f"preset: {config.preset.name} (chosen by {config.preset_source})")
        return run_planned(config, env, log, companions, resolved.engine)


def run_command(args: argparse.Namespace) -> int:
    """`rl-trainer-bench run`: knobs from the environment, overridden by flags."""
    config = BenchConfig.from_env(driver_knobs(os.environ, args), tpu=usable_tpu(os.environ))
    return run_bench(config, os.environ, lambda line: print(line, flush=True))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """bench_driver.py's entry: knobs from `env` (default os.environ) and flags in `argv`."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="bench_driver", description=__doc__.splitlines()[0])
    add_driver_knob_arguments(parser)

    def body() -> int:
        config = BenchConfig.from_env(driver_knobs(env, parser.parse_args(argv)))
        return run_bench(config, env, lambda line: print(line, flush=True))

    return run_guarded("bench_driver", body, (UserError, ContractError))


if __name__ == "__main__":
    exit_process(main())
