"""Compile a cell's engine programs one after the other or all at once, with or without extra
compiler options, and report each program's compile seconds beside XLA's memory figures.

Why: the full-depth `aot` check of the production cell is minutes of libtpu code generation per
program. Two ways to shorten it look free and are not: compiling the programs concurrently (the
compiler already keeps the cores busy) and lowering XLA's effort (it compiles a different program,
so the memory the check reports would not be the run's). This script measures both, from this host
(nothing runs on a TPU), so the claims in BENCHMARKS.md can be checked on any machine.

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/closed/tpu_compile_modes.py \\
        --preset qwen3.5-397b-cell --target v5p:4x8x8 --trainer-argv '--mesh_fsdp=16 ...' \\
        --mode concurrent

`--compiler-option KEY=VALUE` (repeatable; the value is read as JSON when it parses, else kept as a
string) is added to the options `aot` compiles with, e.g. `exec_time_optimization_effort=-1`.
Compile each mode in its own process: programs lowered once compile from JAX's in-memory cache the
second time.

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/aot-compile-time_tpu7x-v5p_2026-12-02.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import resource
import sys
import time

from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot import check
from rl_trainer_bench.preflight.aot import compile as aot_compile
from rl_trainer_bench.preflight.aot.depth import with_layers
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

MEMORY_FIELDS = (*aot_compile.MEMORY_FIELDS, "temp_block")


def compiler_option(text: str) -> tuple[str, object]:
    """KEY=VALUE from the command line; VALUE as JSON when it parses (numbers, booleans)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--compiler-option {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def check_options(device, extra: dict) -> None:
    """Refuse options XLA does not take (an unknown name, a value of the wrong type) in one line,
    on a one-op program for the same device, before minutes of compiling."""
    if not extra:
        return
    import jax
    import jax.numpy as jnp

    scalar = jax.ShapeDtypeStruct(
        (), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device)
    )
    try:
        jax.jit(lambda x: x + 1).lower(scalar).compile(compiler_options=extra)
    except Exception as error:  # XLA raises XlaRuntimeError, nanobind a TypeError
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(
            f"--compiler-option {extra}: XLA refused it ({first}); use a compile option XLA "
            "knows, with a value of its type (e.g. exec_time_optimization_effort=-1)"
        ) from error


def compile_all(plan, extra: dict, concurrent_jobs: bool, platform: str) -> list:
    """(compiled or None, row) per program of `plan`, in its order."""
    jobs = [(name, lowered, {**options, **extra}, platform) for name, lowered, options in plan]
    if not concurrent_jobs:
        return [aot_compile.compile_one(*job) for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # the compile drops the GIL
        return list(pool.map(lambda job: aot_compile.compile_one(*job), jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3.5-397b-cell")
    parser.add_argument("--target", default="tpu7x:4x4x8")
    parser.add_argument("--trainer-argv", default="")
    parser.add_argument("--engine-flags", default="")
    parser.add_argument("--layers", type=int, default=0, help="compile at N layers (0: full depth)")
    parser.add_argument("--programs", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--mode", choices=("sequential", "concurrent"), default="sequential")
    parser.add_argument("--compiler-option", type=compiler_option, action="append", default=[])
    args = parser.parse_args()
    try:
        if args.layers < 0:
            raise UserError(f"--layers {args.layers}: expected 0 (full depth) or a positive count")
        with quiet_libtpu():
            cell = check.resolve_cell(
                args.preset, args.target, args.trainer_argv, args.engine_flags
            )
            config = with_layers(cell.config, args.layers) if args.layers else cell.config
            check_options(cell.target.devices[0], dict(args.compiler_option))
            plan = aot_compile.compile_plan(config, cell.mesh)
            wanted = [name for name in args.programs.split(",") if name]
            unknown = sorted(set(wanted) - {name for name, *_ in plan})
            if unknown:
                raise UserError(
                    f"--programs: no program {', '.join(unknown)}; this engine has "
                    f"{', '.join(name for name, *_ in plan)}"
                )
            plan = [job for job in plan if not wanted or job[0] in wanted]
            started = time.perf_counter()
            results = compile_all(
                plan,
                dict(args.compiler_option),
                args.mode == "concurrent",
                cell.target.devices[0].platform,
            )
            wall = time.perf_counter() - started
    except (UserError, ContractError) as error:  # a bad preset, slice, depth or program: one line
        print(f"tpu_compile_modes: {error}", file=sys.stderr)
        sys.exit(2)
    for _, row in results:
        line = {"program": row.name, "compile_seconds": round(row.compile_seconds, 1)}
        line.update({f"{field}_bytes": getattr(row, field) for field in MEMORY_FIELDS})
        line["error"] = row.error
        print(json.dumps(line), flush=True)
    summary = {
        "preset": args.preset,
        "target": args.target,
        "layers": args.layers or cell.config.model.num_layers,
        "mode": args.mode,
        "compiler_options": dict(args.compiler_option),
        "wall_seconds": round(wall, 1),
        "host_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "unapplied_keys": cell.unapplied_keys,
    }
    print(json.dumps(summary))
    if cell.unapplied_keys:
        print(f"tpu_compile_modes: keys not applied: {cell.unapplied_keys}", file=sys.stderr)
    failed = [row for _, row in results if row.error]
    for row in failed:
        print(f"tpu_compile_modes: {row.name} did not compile: {row.error}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
