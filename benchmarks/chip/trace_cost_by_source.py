"""A run's device time by engine function, from its profiler trace and its programs' XLA dump.

The measured counterpart of `tpu_cost_by_source.py`: every op the device ran in the traced steps,
with its own time (a loop's op less its body's), charged to the function of the package it came
from (`preflight/hlo/trace_ops.py`). Give the run a profile window and an XLA dump, then this:

  XLA_FLAGS="--xla_dump_to=$OUT/hlo --xla_dump_hlo_as_text" rl-trainer-bench run --preset tpu-v5e-1 \\
      --steps 3 --warmup-steps 2 --profile-steps 2:4 --results-dir "$OUT/run"
  PYTHONPATH=. python benchmarks/chip/trace_cost_by_source.py --trace "$OUT/run/profile" \\
      --hlo "$OUT/hlo" --steps 3 --output "$OUT/trace_cost_by_source.json"

(`chip_headline.py` does both for the STAGE-off run.) `--ops FUNCTION` also lists one function's
ops by device time, each with its opcode and result shapes. Times are MEASURED on the device the
run used; per step, they are the traced steps' sum over --steps.

Remakes the device time by engine function behind BENCHMARKS.md's row "tpu-v5e-1's step and MFU";
benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md,
benchmarks/reports/chip-round-0_tpu-v5e_2026-12-05.md (the CPU plumbing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_output_file, write_text_atomically
from rl_trainer_bench.preflight.hlo.trace_ops import (
    dumped_ops,
    kinds_table,
    markdown_table,
    op_events,
    ops_table,
    read_trace,
    time_by_kind,
    time_by_op,
    time_by_source,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="the run's profile folder")
    parser.add_argument("--hlo", type=Path, required=True, help="the run's --xla_dump_to folder")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--output", type=Path, help="write every row as JSON here")
    parser.add_argument(
        "--ops",
        metavar="FUNCTION",
        help="also list this source function's ops (as the table names it)",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps: give the number of traced steps, at least 1")
    try:
        if args.output:
            check_output_file(args.output, "--output")
    except UserError as error:
        parser.error(str(error))
    try:
        ops = op_events(read_trace(args.trace))
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--trace: {error}")
    try:
        sources, descriptions = dumped_ops(args.hlo)
    except (UserError, OSError) as error:
        parser.error(f"--hlo: {str(error).splitlines()[0]}")
    if not sources:
        parser.error(f"--hlo: no *after_optimizations.txt under {args.hlo}: dump with XLA_FLAGS")
    rows = time_by_source(ops, sources)
    if args.ops and args.ops not in {row["source"] for row in rows}:
        parser.error(
            f"--ops {args.ops!r}: no op of the trace is charged to it; name a function as the table names it"
        )
    print(markdown_table(rows, args.steps, args.top))
    if args.ops:
        print(f"\nops of {args.ops}:")
        by_op = time_by_op(ops, sources, args.ops)
        print(ops_table(by_op, args.steps, args.top, descriptions))
        print(f"\nops of {args.ops} by kind:")
        print(kinds_table(time_by_kind(by_op, descriptions), args.steps, args.top))
    if args.output:
        write_text_atomically(
            args.output, json.dumps({"steps": args.steps, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
