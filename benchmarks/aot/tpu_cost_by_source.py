"""A compiled program's cost by the engine function each op came from: a static cost table for a TPU.

Why: a profile of the chip says where a step's time goes; before one exists, the compiled program
says where its work is. This compiles one of a cell's programs for a TPU target from this host, as
`aot` does, and walks its HLO as `aot`'s loop-counted cost does (`program_cost.instruction_costs`:
matmul FLOPs, bytes read and written, each loop body counted per trip). Each instruction is charged
to the innermost frame of its source stack that lies in the package (the compiled text carries the
stack of every op), and each gets a roofline time, max(FLOPs / peak, bytes / HBM bandwidth) from
the chip table, summed per function. These are ESTIMATES of where the work is, not times: the byte
walk counts a loop body's operands once per trip, and a kernel runs below peak. `--ops FUNCTION`
also lists one function's ops, grouped by opcode (a fusion by its kind) and result shapes: which
passes over which arrays make its bytes (a copy the layout forces shows up as its own op).

Usage (needs the [tpu] extra):
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/aot/tpu_cost_by_source.py \\
      --preset tpu-v5e-1 --target v5e:1x1 --program fwd_bwd --output cost_by_source.json \\
      [--ops moe.py:local_sorted_ffn]

Remakes BENCHMARKS.md's aot suite (the static cost table);
benchmarks/reports/aot-one-chip-cost_v5e-v6e_2026-12-06.md,
benchmarks/reports/chip-round-3_tpu-v5e_2026-12-06.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

from rl_trainer_bench.chips.accelerators import chip_for_device_kind
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.preflight.aot.check import resolve_cell
from rl_trainer_bench.preflight.aot.compile import compile_one, planned_program
from rl_trainer_bench.preflight.hlo.parse import parse_hlo
from rl_trainer_bench.preflight.hlo.sources import op_sources
from rl_trainer_bench.preflight.program_cost import instruction_costs
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu


def ops_of_source(text: str, source: str) -> list[dict]:
    """The ops charged to `source`, grouped by opcode (a fusion with its kind) and result shapes:
    FLOPs and bytes as run, how many times they run, and one op's name, largest bytes first."""
    module = parse_hlo(text)
    sources = op_sources(module, text)
    groups: dict[tuple[str, str], dict] = {}
    for cost in instruction_costs(module):
        instruction = cost.instruction
        if sources[instruction.name] != source or not (cost.flops or cost.bytes):
            continue
        kind = re.search(r"kind=(\w+)", instruction.attributes)
        opcode = instruction.opcode + (f"/{kind.group(1)}" if kind else "")
        shapes = ",".join(f"{a.dtype}{list(a.dims)}" for a in instruction.arrays)
        group = groups.setdefault(
            (opcode, shapes), {"opcode": opcode, "shapes": shapes, "runs": 0, "flops": 0.0,
                               "bytes": 0.0, "example": instruction.name},
        )  # fmt: skip
        group["runs"] += cost.times
        group["flops"] += cost.flops * cost.times
        group["bytes"] += cost.bytes * cost.times
    return sorted(groups.values(), key=lambda group: -group["bytes"])


def print_ops(text: str, source: str, top: int) -> None:
    """`ops_of_source`'s first `top` groups as a table."""
    print(f"ops of {source}: bytes and FLOPs as run, grouped by opcode and result shapes")
    for group in ops_of_source(text, source)[:top]:
        print(
            f"{group['bytes'] / 2**30:9.2f}Gi{group['flops']:11.3e}{group['runs']:6d}x "
            f"{group['opcode']:20}{group['shapes'][:70]:72}{group['example']}"
        )


def cost_by_source(text: str, peak_flops: float, bandwidth: float) -> list[dict]:
    """Rows per source function: FLOPs and bytes as run, and the sum of each op's roofline."""
    module = parse_hlo(text)
    sources = op_sources(module, text)
    totals = collections.defaultdict(lambda: {"flops": 0.0, "bytes": 0.0, "seconds": 0.0})
    for cost in instruction_costs(module):
        if not cost.flops and not cost.bytes:
            continue
        row = totals[sources[cost.instruction.name]]
        row["flops"] += cost.flops * cost.times
        row["bytes"] += cost.bytes * cost.times
        row["seconds"] += cost.times * max(cost.flops / peak_flops, cost.bytes / bandwidth)
    rows = [{"source": source, **row} for source, row in totals.items()]
    return sorted(rows, key=lambda row: -row["seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tpu-v5e-1")
    parser.add_argument("--target", default="v5e:1x1")
    parser.add_argument("--engine-flags", default="")
    parser.add_argument("--program", default="fwd_bwd")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--output", type=Path, help="write every row as JSON here")
    parser.add_argument(
        "--ops",
        metavar="FUNCTION",
        help="also list this source function's ops (as the table names it)",
    )
    args = parser.parse_args()
    with quiet_libtpu():
        cell = resolve_cell(args.preset, args.target, "", args.engine_flags)
        try:
            planned = planned_program(cell.config, cell.mesh, args.program)
        except UserError as error:
            parser.error(f"--program: {error}")
        compiled, row = compile_one(args.program, *planned, cell.target.devices[0].platform)
    if compiled is None:
        print(f"{args.program}: {row.error}", file=sys.stderr)
        return 1
    chip = chip_for_device_kind(cell.target.device_kind)
    peak, bandwidth = (
        chip.per_device(chip.peak_bf16_flops),
        chip.per_device(chip.hbm_bytes_per_second),
    )
    rows = cost_by_source(compiled.as_text(), peak, bandwidth)
    if args.ops and args.ops not in {r["source"] for r in rows}:
        parser.error(
            f"--ops {args.ops!r}: no op of {args.program} is charged to it; name a function as"
            " the table without --ops names it"
        )
    total = sum(r["seconds"] for r in rows)
    print(
        f"{args.program} of {args.preset} on {args.target}: per source function, loops counted per"
        f" trip; ESTIMATES (op rooflines at {peak / 1e12:.1f} TFLOP/s, {bandwidth / 1e12:.3f} TB/s)"
    )
    print(f"{'source':48}{'FLOPs':>12}{'bytes':>12}{'roofline':>12}{'share':>8}")
    for r in rows[: args.top]:
        print(
            f"{r['source'][:47]:48}{r['flops']:12.3e}{r['bytes'] / 2**30:10.2f}Gi"
            f"{1e3 * r['seconds']:10.1f}ms{r['seconds'] / total:8.1%}"
        )
    print(
        f"{'all':48}{sum(r['flops'] for r in rows):12.3e}{sum(r['bytes'] for r in rows) / 2**30:10.2f}Gi{1e3 * total:10.1f}ms"
    )
    if args.ops:
        print_ops(compiled.as_text(), args.ops, args.top)
    if args.output:
        write_text_atomically(
            args.output,
            json.dumps(
                {
                    "program": args.program,
                    "preset": args.preset,
                    "target": args.target,
                    "rows": rows,
                },
                indent=1,
            ),
        )
    return 0


if __name__ == "__main__":
    # a bad preset, slice, flag or program: one line and exit 2 (Ctrl-C: 130), not a traceback
    sys.exit(run_guarded("tpu_cost_by_source.py", main, (UserError, ContractError)))
