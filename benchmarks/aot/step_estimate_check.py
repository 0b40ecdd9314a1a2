"""aot's step estimate against every chip figure the project holds, cell by cell and change by change.

Why: a plan prices its pod time from aot's predicted step, so the reader needs to know how far the
estimate lands from the chip on the cells the chip measured, and whether it gets the sign of a
program change right. Each cell here is the tpu-v5e-1 preset with engine flags (rows, the layers
scanned or not, a kernel on or off), compiled from this tree for `v5e:1x1`; its measured step is
the median of the scored steps in the chip's raw results under `benchmarks/results/` (the files
named beside it). Each change is a pair of cells the chip ran as an A/B (or before and after in
one call), with its measured delta from the same files.

The compiled HLO of each variant's `fwd_bwd` and `update` is kept xz-compressed (`slim`: less the
op names and the kernels' serialized bodies) under `benchmarks/results/aot-step-check/`
(`--compile` makes what is missing, one TPU compile at a time, minutes each), so the check itself
reads them and needs no compile; a variant not compiled yet leaves its cells out, named. The estimate is
`preflight.op_estimate`'s, summed into a step as `aot` sums it; the results go to
`benchmarks/results/aot-step-check/check.json`, which `aot` reads to print the estimate's error on
the chip's own cells beside its prediction.

A cell measured at an earlier commit than this tree's program is marked so: the chip ran the
program of that commit (its keys given as engine flags here), the prediction is of this tree's.
A cell with a traced run beside it also gets the trace's ms a step per engine function beside
the estimate's: which functions the estimate misses.

Remakes BENCHMARKS.md's rows "aot's step estimate against the chip" and "The 397B cell's step on
`tpu7x:4x4x8`"; benchmarks/reports/aot-step-estimate_v5e-tpu7x_2026-12-07.md and
benchmarks/reports/aot-op-terms_v5e-tpu7x_2026-12-07.md.

Usage:
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/aot/step_estimate_check.py \\
      --compile [--programs preset,rows-7]    # needs the [tpu] extra; once per variant
  PYTHONPATH=. python benchmarks/aot/step_estimate_check.py [--top 8] [--output check.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import lzma
import re
import statistics
import sys
import time
from pathlib import Path

from rl_trainer_bench.chips.accelerators import chip_by_name, parse_slice
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.preflight.hlo.parse import parse_hlo
from rl_trainer_bench.preflight.hlo.sources import NO_PACKAGE_FRAME, op_sources
from rl_trainer_bench.preflight.op_estimate import BY, Rates, estimate
from rl_trainer_bench.preflight.step_estimate import PUBLIC_MEASURED, PUBLIC_SOURCE

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
HLO_DIR = RESULTS / "aot-step-check"
CHECK_FILE = HLO_DIR / "check.json"
PARTS = ("fwd_bwd", "update")
_OP_NAME = re.compile(r'op_name="(?:[^"\\]|\\.)*"\s*')
_KERNEL_BODY = re.compile(r'"body":"[^"]*"')
R13 = "2026-12-07-chip-tpu-v5e-1-round-13"
R12 = "2026-12-07-chip-tpu-v5e-1-round-12"
R10 = "2026-12-07-chip-tpu-v5e-1-round-10"
R9 = "2026-12-07-chip-tpu-v5e-1-round-9"
R6 = "2026-12-07-chip-tpu-v5e-1"


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled variant: a preset with engine flags on a target."""

    name: str
    engine_flags: str
    preset: str = "tpu-v5e-1"
    target: str = "v5e:1x1"
    micro_steps: int = 4


@dataclasses.dataclass(frozen=True)
class Cell:
    """One chip cell: the variant the chip ran and the raw results of its steps."""

    name: str
    program: str  # a Program's name
    measured: tuple[str, ...]  # globs under benchmarks/results/ of results files of its steps
    commit: str  # the tree the chip ran, where it is not this tree's program
    # A traced run of the same variant: its ops' measured time by engine function
    # (`trace_cost_by_source.md`), set beside the estimate's to say which functions miss.
    trace: str = ""


# The preset's keys over the day, as `git log rl_trainer_bench/config/presets.py` has them:
# 4 rows, 2 heads a kernel program, the convolutions in XLA, saved_lse, layers scanned, the rule
# recomputed (round 6); 5 rows and 4 heads (round 7); the convolutions' kernels (round 9);
# in_forward (round 10); 6 rows (round 11); the rule's results kept, the layers unscanned (12).
_ROUND_10 = "train_micro_batch_size=5,scan_layers=true,keep_delta_rule_outputs=false"
_ROUND_9 = f"{_ROUND_10},logps_gradient=saved_lse"
_ROUND_6 = (
    "train_micro_batch_size=4,scan_layers=true,keep_delta_rule_outputs=false,"
    "logps_gradient=saved_lse,linear_conv_kernel=xla,linear_chunk_kernel_heads=2"
)
PROGRAMS_ = (
    Program("preset", ""),
    Program("rows-7", "train_micro_batch_size=7"),
    Program("scanned", "scan_layers=true"),
    Program("scanned-rule-recomputed", "scan_layers=true,keep_delta_rule_outputs=false"),
    Program("round-10", _ROUND_10),
    Program("round-9", _ROUND_9),
    Program("round-9-conv-xla", f"{_ROUND_9},linear_conv_kernel=xla"),
    Program("round-6", _ROUND_6),
    Program("round-6-xla-path", f"{_ROUND_6},linear_chunk_kernel=xla"),
    Program("round-10-ragged-dot", f"{_ROUND_10},expert_compute=sorted_ragged_dot"),
)
# The 397B cell on its slice, beside MaxText's public step (`step_estimate.PUBLIC_MEASURED`).
CELL_397B = Program("qwen3.5-397b-cell", "", "qwen3.5-397b-cell", "tpu7x:4x4x8", micro_steps=9)


def ab_arm(name: str, program: str, ab: str, arm: str, commit: str) -> Cell:
    """A cell the chip ran as one arm of an A/B: the `ab` call's results files of `arm`."""
    return Cell(name, program, (f"{ab}/arm*-{arm}.jsonl",), commit)


CELLS = (
    Cell("preset (6 rows, unscanned)", "preset", (f"{R13}/new6/results.jsonl",), ""),
    Cell(
        "7 rows",
        "rows-7",
        (f"{R13}/new7/results.jsonl",),
        "",
        f"{R13}/rows-7-traced/run-stage-on/trace_cost_by_source.md",
    ),
    ab_arm("unscanned, round 12", "preset", f"{R12}/scan-layers-ab", "false", "5cfe046"),
    ab_arm("scanned, round 12", "scanned", f"{R12}/scan-layers-ab", "true", "5cfe046"),
    ab_arm("scanned, rule kept", "scanned", f"{R12}/keep-rule-ab", "true", "5267c37"),
    ab_arm(
        "scanned, rule recomputed",
        "scanned-rule-recomputed",
        f"{R12}/keep-rule-ab",
        "false",
        "5267c37",
    ),
    ab_arm("5 rows, in_forward", "round-10", f"{R10}/head/ab", "in_forward", "c9974e3"),
    ab_arm("5 rows, saved_lse", "round-9", f"{R10}/head/ab", "saved_lse", "c9974e3"),
    ab_arm("5 rows, sorted_gmm", "round-10", f"{R10}/ragged/ab", "sorted_gmm", "c9974e3"),
    ab_arm(
        "5 rows, sorted_ragged_dot",
        "round-10-ragged-dot",
        f"{R10}/ragged/ab",
        "sorted_ragged_dot",
        "c9974e3",
    ),
    ab_arm("5 rows, conv kernels", "round-9", f"{R9}/conv/ab", "pallas", "d8598cd"),
    ab_arm("5 rows, conv in XLA", "round-9-conv-xla", f"{R9}/conv/ab", "xla", "d8598cd"),
    ab_arm("4 rows, chunk kernels", "round-6", f"{R6}/gdn-kernel/ab", "pallas", "4fca6d3"),
    ab_arm("4 rows, XLA path", "round-6-xla-path", f"{R6}/gdn-kernel/ab", "xla", "4fca6d3"),
)
# (change, cell before, cell after): each a pair the chip ran in one A/B or one call.
CHANGES = (
    ("layers unscanned", "scanned, round 12", "unscanned, round 12"),
    ("the rule's results kept", "scanned, rule recomputed", "scanned, rule kept"),
    ("logps_gradient=in_forward", "5 rows, saved_lse", "5 rows, in_forward"),
    ("sorted_ragged_dot for the grouped matmul", "5 rows, sorted_gmm", "5 rows, sorted_ragged_dot"),
    ("the convolutions' kernels", "5 rows, conv in XLA", "5 rows, conv kernels"),
    ("the chunks' kernels", "4 rows, XLA path", "4 rows, chunk kernels"),
    ("7 rows, not 6", "preset (6 rows, unscanned)", "7 rows"),
)


def hlo_path(program: str, part: str) -> Path:
    return HLO_DIR / program / f"{part}.hlo.xz"


def slim(text: str) -> str:
    """The compiled text without what the estimate never reads: ops' names in the traced
    function (`op_name=`; the stack frame ids stay) and the Pallas kernels' serialized bodies
    (their stated costs stay), a third of the text."""
    text = _OP_NAME.sub("", text)
    return _KERNEL_BODY.sub('"body":""', text)


def compile_programs(programs) -> None:
    """Compile each variant's programs whose HLO is not kept yet, one at a time."""
    # Imported here: only --compile needs JAX and libtpu; the check reads kept text.
    from rl_trainer_bench.io import write_atomically
    from rl_trainer_bench.preflight.aot.check import resolve_cell
    from rl_trainer_bench.preflight.aot.compile import compile_one, planned_program
    from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

    for variant in programs:
        missing = [p for p in PARTS if not hlo_path(variant.name, p).exists()]
        if not missing:
            continue
        with quiet_libtpu():
            resolved = resolve_cell(variant.preset, variant.target, "", variant.engine_flags)
            platform = resolved.target.devices[0].platform
            for program in missing:
                started = time.perf_counter()
                planned = planned_program(resolved.config, resolved.mesh, program)
                compiled, row = compile_one(program, *planned, platform)
                if compiled is None:
                    raise SystemExit(f"{variant.name}: {program} did not compile: {row.error}")
                path = hlo_path(variant.name, program)
                path.parent.mkdir(parents=True, exist_ok=True)
                data = lzma.compress(slim(compiled.as_text()).encode(), preset=9)
                write_atomically(path, lambda handle, data=data: handle.write(data))
                print(
                    f"{variant.name}: {program} compiled in {time.perf_counter() - started:.0f} s,"
                    f" {len(data) / 1e6:.2f} MB kept",
                    flush=True,
                )


def measured_step(cell: Cell) -> tuple[float, int, list[str]]:
    """The median of the scored steps in the cell's results files, their count and the files."""
    files = sorted(f for pattern in cell.measured for f in glob.glob(str(RESULTS / pattern)))
    steps = [
        record["step_s"]
        for name in files
        for line in Path(name).read_text().splitlines()
        if line.strip()
        for record in [json.loads(line)]
        if "step_s" in record and not record.get("warmup")
    ]
    if not steps:
        raise UserError(f"cell {cell.name!r}: no scored steps in {', '.join(cell.measured)}")
    return statistics.median(steps), len(steps), [str(Path(f).relative_to(RESULTS)) for f in files]


_TRACE_ROW = re.compile(r"^\| `(?P<source>[^`]+)` \| (?P<ms>[\d.]+) \|")


def by_function(cell: Cell, estimate: dict) -> list[dict]:
    """The traced run's measured ms a step per engine function beside the estimate's, then the
    functions the estimate charges that the trace does not name; largest measured first."""
    measured = {
        row.group("source"): float(row.group("ms"))
        for line in (RESULTS / cell.trace).read_text().splitlines()
        if (row := _TRACE_ROW.match(line))
    }
    predicted = estimate["step_by_source"]
    sources = sorted(
        set(measured) | set(predicted),
        key=lambda source: (-measured.get(source, 0.0), -predicted.get(source, 0.0)),
    )
    return [
        {
            "source": source,
            "measured_ms_per_step": measured.get(source, 0.0),
            "predicted_ms_per_step": 1e3 * predicted.get(source, 0.0),
        }
        for source in sources
    ]


def program_estimate(variant: Program, rates: Rates) -> dict:
    """The variant's predicted step from its kept HLO, MICRO_STEPS x fwd_bwd + update (the
    preset's micro-batches never overflow their buffers: no replay), each program's terms, and
    a step's estimate by the engine function its ops came from."""
    terms, by_source = {}, {}
    runs = {"fwd_bwd": variant.micro_steps, "update": 1}
    for part in PARTS:
        path = hlo_path(variant.name, part)
        if not path.exists():
            raise UserError(f"{path}: not kept; run this script with --compile first")
        text = lzma.decompress(path.read_bytes()).decode()
        module = parse_hlo(text, str(path))
        found = estimate(module, rates)
        terms[part] = found.terms()
        sources = op_sources(module, text)
        for op in found.ops:
            source = sources.get(op.name, NO_PACKAGE_FRAME)
            by_source[source] = by_source.get(source, 0.0) + runs[part] * op.total
    step = variant.micro_steps * terms["fwd_bwd"]["seconds"] + terms["update"]["seconds"]
    return {"step_seconds": step, "programs": terms, "step_by_source": by_source}


def public_cell() -> dict | None:
    """The 397B cell's estimate on its slice beside MaxText's public step, with the terms that
    make up a step (fwd_bwd's MICRO_STEPS times, update's once); None until it is compiled."""
    if not all(hlo_path(CELL_397B.name, p).exists() for p in PARTS):
        return None
    tpu_slice = parse_slice(CELL_397B.target)
    rates = Rates.of_chip(tpu_slice.chip, tpu_slice.torus)
    found = program_estimate(CELL_397B, rates)
    runs = {"fwd_bwd": CELL_397B.micro_steps, "update": 1}
    keys = found["programs"]["fwd_bwd"].keys()
    terms = {k: sum(n * found["programs"][p][k] for p, n in runs.items()) for k in keys}
    public = PUBLIC_MEASURED[(CELL_397B.preset, CELL_397B.target)]
    return {
        "preset": CELL_397B.preset,
        "target": CELL_397B.target,
        "rates": dataclasses.asdict(rates),
        "predicted_step_seconds": found["step_seconds"],
        "step_terms": terms,
        "public": dict(public),
        "public_source": PUBLIC_SOURCE,
        "over_public_stage_on": found["step_seconds"] / public["step_stage_on"] - 1,
        "over_public_stage_off": found["step_seconds"] / public["step_stage_off"] - 1,
        "programs": found["programs"],
        "step_by_source": found["step_by_source"],
    }


def run_check(rates: Rates) -> dict:
    """Every cell predicted and measured, and every change's two deltas."""
    variants = {v.name: v for v in PROGRAMS_}
    kept = [v for v in variants.values() if all(hlo_path(v.name, p).exists() for p in PARTS)]
    estimates = {v.name: program_estimate(v, rates) for v in kept}
    cells = []
    for cell in [c for c in CELLS if c.program in estimates]:
        measured, steps, files = measured_step(cell)
        predicted = estimates[cell.program]["step_seconds"]
        cells.append(
            {
                "cell": cell.name,
                "engine_flags": variants[cell.program].engine_flags,
                "program": cell.program,
                "commit_measured": cell.commit or "this tree's program",
                "predicted_step_seconds": predicted,
                "measured_step_seconds": measured,
                "measured_steps": steps,
                "measured_files": files,
                "error": predicted / measured - 1,
                "trace": cell.trace,
                "by_function": by_function(cell, estimates[cell.program]) if cell.trace else [],
            }
        )
    by_name = {c["cell"]: c for c in cells}
    changes = []
    for change, before, after in CHANGES:
        if before not in by_name or after not in by_name:
            continue
        predicted = (
            by_name[after]["predicted_step_seconds"] - by_name[before]["predicted_step_seconds"]
        )
        measured = (
            by_name[after]["measured_step_seconds"] - by_name[before]["measured_step_seconds"]
        )
        changes.append(
            {
                "change": change,
                "before": before,
                "after": after,
                "predicted_delta_seconds": predicted,
                "measured_delta_seconds": measured,
                "measured_over_1_percent": abs(measured)
                > 0.01 * by_name[before]["measured_step_seconds"],
                "sign_right": (predicted > 0) == (measured > 0),
            }
        )
    errors = [abs(c["error"]) for c in cells]
    return {
        "kind": "estimate against the chip",
        "by": BY,
        "rates": dataclasses.asdict(rates),
        "cells": cells,
        "changes": changes,
        "summary": {
            "cells": len(cells),
            "max_abs_error": max(errors),
            "median_abs_error": statistics.median(errors),
            "within_10_percent": sum(e <= 0.10 for e in errors),
            "signs_right_over_1_percent": sum(
                c["sign_right"] for c in changes if c["measured_over_1_percent"]
            ),
            "changes_over_1_percent": sum(c["measured_over_1_percent"] for c in changes),
        },
        "programs": estimates,
        "not_compiled": sorted(set(variants) - set(estimates)),
        "cell_397b": public_cell(),
    }


def print_check(check: dict, top: int) -> None:
    """The check's tables: cells, then changes, then the largest functions of each variant."""
    print(
        "aot's op estimate against the chip's measured steps (tpu-v5e-1 on v5e:1x1; ESTIMATE"
        " beside MEASURED)"
    )
    print(f"{'cell':30}{'predicted':>11}{'measured':>10}{'error':>8}  chip ran")
    for c in check["cells"]:
        print(
            f"{c['cell']:30}{c['predicted_step_seconds']:10.3f}s{c['measured_step_seconds']:9.3f}s"
            f"{c['error']:+8.1%}  {c['commit_measured']}"
        )
    print(f"{'change':42}{'predicted':>11}{'measured':>11}  sign")
    for c in check["changes"]:
        sign = "right" if c["sign_right"] else "WRONG"
        if not c["measured_over_1_percent"]:
            sign += " (measured under 1%)"
        print(
            f"{c['change']:42}{1e3 * c['predicted_delta_seconds']:+9.1f}ms"
            f"{1e3 * c['measured_delta_seconds']:+9.1f}ms  {sign}"
        )
    for cell in check["cells"]:
        if not cell["by_function"]:
            continue
        print(
            f"{cell['cell']}: ms a step by engine function, the chip's trace ({cell['trace']})"
            " beside the estimate"
        )
        for row in cell["by_function"][:top]:
            print(
                f"    {row['source'][:64]:66}{row['measured_ms_per_step']:8.1f}"
                f"{row['predicted_ms_per_step']:8.1f}"
                f"{row['predicted_ms_per_step'] - row['measured_ms_per_step']:+8.1f}"
            )
    if check["not_compiled"]:
        print(f"not compiled yet, their cells left out: {', '.join(check['not_compiled'])}")
    summary = check["summary"]
    print(
        f"cells within 10%: {summary['within_10_percent']} of {summary['cells']} (largest error"
        f" {summary['max_abs_error']:.1%}, median {summary['median_abs_error']:.1%}); signs right"
        f" {summary['signs_right_over_1_percent']} of the {summary['changes_over_1_percent']}"
        " changes the chip measured over 1%"
    )
    for name, program in check["programs"].items():
        terms = program["programs"]["fwd_bwd"]
        print(
            f"{name}: fwd_bwd {1e3 * terms['seconds']:.1f} ms = compute {1e3 * terms['compute_seconds']:.1f}"
            f" + HBM {1e3 * terms['memory_seconds']:.1f} + kernels {1e3 * terms['kernel_seconds']:.1f}"
            f" + kernels' vector work {1e3 * terms['kernel_vector_seconds']:.1f}"
            f" + collectives exposed {1e3 * terms['exposed_collective_seconds']:.1f} ms"
        )
        ranked = sorted(program["step_by_source"].items(), key=lambda item: -item[1])
        for source, seconds in ranked[:top]:
            print(f"    {source[:64]:66}{1e3 * seconds:8.1f} ms a step")


def print_public_cell(cell: dict | None, top: int) -> None:
    """The 397B cell's estimate, its terms and its largest functions beside the public step."""
    if cell is None:
        print(f"{CELL_397B.preset} on {CELL_397B.target}: not compiled yet (--compile)")
        return
    terms, public = cell["step_terms"], cell["public"]
    print(
        f"{cell['preset']} on {cell['target']}: predicted step {cell['predicted_step_seconds']:.2f} s"
        f" (ESTIMATE) against the public {public['step_stage_on']} s with STAGE on"
        f" ({cell['over_public_stage_on']:+.1%}) and {public['step_stage_off']} s off"
        f" ({cell['over_public_stage_off']:+.1%}), {cell['public_source']}"
    )
    print(
        f"  a step's terms: compute-bound ops {terms['compute_seconds']:.2f} s, HBM-bound ops"
        f" {terms['memory_seconds']:.2f} s, Pallas kernels {terms['kernel_seconds']:.2f} s"
        f" (+ {terms['kernel_vector_seconds']:.2f} s of their vector work),"
        f" collectives exposed {terms['exposed_collective_seconds']:.2f} s of"
        f" {terms['collective_seconds']:.2f} s moving"
    )
    ranked = sorted(cell["step_by_source"].items(), key=lambda item: -item[1])
    for source, seconds in ranked[:top]:
        print(f"    {source[:64]:66}{seconds:8.3f} s a step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="compile the variants not kept yet")
    parser.add_argument(
        "--programs", default="", help="with --compile: comma-separated variants (default: all)"
    )
    parser.add_argument("--top", type=int, default=8, help="functions listed per variant")
    parser.add_argument(
        "--output", type=Path, default=CHECK_FILE, help=f"the check's JSON (default {CHECK_FILE})"
    )
    args = parser.parse_args()
    names = [n for n in args.programs.split(",") if n]
    unknown = [n for n in names if n not in {p.name for p in (*PROGRAMS_, CELL_397B)}]
    if unknown:
        parser.error(
            f"--programs: no variant {unknown[0]!r}; the variants: "
            + ", ".join(p.name for p in PROGRAMS_)
        )
    if args.compile:
        compile_programs([p for p in (*PROGRAMS_, CELL_397B) if not names or p.name in names])
        return 0
    check = run_check(Rates.of_chip(chip_by_name("v5e")))
    print_check(check, args.top)
    print_public_cell(check["cell_397b"], args.top)
    write_text_atomically(args.output, json.dumps(check, indent=1) + "\n")
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("step_estimate_check.py", main, (UserError,)))
