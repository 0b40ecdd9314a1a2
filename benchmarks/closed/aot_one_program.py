"""Compile one engine program of a cell for a target, with extra XLA options, and print its memory.

`aot` compiles every program as the engine does; to ask what moves one program's footprint (an
XLA option, a libtpu flag in LIBTPU_INIT_ARGS, a shallower depth) this compiles just that program,
with the engine's own options plus `--option KEY=VALUE`, and prints XLA's argument, output, alias
and temp bytes, the resident sum, and XLA's peak of live buffers (`peak_memory_in_bytes`). One
compile of the production cell's replay at full depth takes about 8 minutes on 2 cores.

Usage (needs the [tpu] extra):
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/closed/aot_one_program.py \\
      --target tpu7x:4x4x8 --trainer-argv "$(cat tests/testdata/tpu7x_recipe_trainer_argv.txt)" \\
      --engine-flags optimizer_memory_host_offload=false --program fwd_bwd_dropless \\
      --option xla_tpu_buffer_assignment_algorithm=BEST_OF_SPATIAL_TEMPORAL

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot.check import resolve_cell
from rl_trainer_bench.preflight.aot.compile import compile_one, planned_program
from rl_trainer_bench.preflight.aot.depth import with_layers
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

GIB = 1024**3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-397b-cell")
    parser.add_argument("--target", default="tpu7x:4x4x8")
    parser.add_argument("--trainer-argv", default="")
    parser.add_argument("--engine-flags", default="")
    parser.add_argument("--layers", type=int, default=0, help="compile at this depth (0: full)")
    parser.add_argument("--program", default="fwd_bwd_dropless")
    parser.add_argument(
        "--option", action="append", default=[], help="KEY=VALUE compiler option (repeatable)"
    )
    args = parser.parse_args()
    extra = dict(option.split("=", 1) for option in args.option)
    with quiet_libtpu():
        cell = resolve_cell(args.preset, args.target, args.trainer_argv, args.engine_flags)
        config = with_layers(cell.config, args.layers) if args.layers else cell.config
        try:
            lowered, options = planned_program(config, cell.mesh, args.program)
        except UserError as error:
            parser.error(f"--program: {error}")
        platform = cell.target.devices[0].platform
        _, row = compile_one(args.program, lowered, {**options, **extra}, platform)
    if not row.compiled:
        print(f"{args.program}: {row.error}", file=sys.stderr)
        return 1
    figures = {
        "program": args.program,
        "layers": config.model.num_layers,
        "options": {**options, **extra},
        "argument_gib": row.argument / GIB,
        "output_gib": row.output / GIB,
        "alias_gib": row.alias / GIB,
        "temp_gib": row.temp / GIB,
        "temp_block_gib": None if row.temp_block is None else row.temp_block / GIB,
        "resident_gib": row.resident / GIB,
        "live_peak_gib": None if row.live_peak is None else row.live_peak / GIB,
        "compile_seconds": row.compile_seconds,
    }
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
