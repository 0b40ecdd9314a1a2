"""The fit table of a preset on TPU slices at full depth: one `aot` run per slice, in a child process.

Each slice is compiled by `rl-trainer-bench aot` in its own process (libtpu and the compiled
programs leave nothing behind for the next slice), timed from outside, and its peak host memory read
from the child's resource usage. The report's JSON gives the rest: each program's device peak and
headroom, compile time, and the time estimate. Prints one markdown table of memory and one of the
estimated times beside the public measured ones, and writes the raw reports to --results.

The public figures are MaxText's, for this cell on 128 Ironwood chips (`tpu7x:4x4x8`): a regular
micro-batch's fwd_bwd 10.945 s, 100.007 s per step with STAGE_BEFORE_UPDATE on (107.727 s off),
MICRO_STEPS=9.

Usage (needs the [tpu] extra):
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/aot/aot_fit_table.py \\
      --slice tpu7x:4x4x8 --slice 'v5p:4x8x8=--mesh_fsdp=16 --mesh_context=8 ...'

Remakes BENCHMARKS.md's row "The 397B cell's fit on its slices";
benchmarks/reports/aot-397b-fit_tpu7x-v5p_2026-12-05.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rl_trainer_bench.preflight.step_estimate import PUBLIC_MEASURED

PUBLIC = PUBLIC_MEASURED[("qwen3.5-397b-cell", "tpu7x:4x4x8")]
GIB = 1024**3


def run_slice(preset: str, target: str, trainer_argv: str, extra: list[str]) -> dict:
    """One `aot` run in a child process: its JSON report, exit status, wall time and peak RSS."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "report.json"
        command = [
            sys.executable,
            "-m",
            "rl_trainer_bench.cli",
            "aot",
            f"--preset={preset}",
            f"--target={target}",
            f"--trainer-argv={trainer_argv}",
            f"--output={output}",
            *extra,
        ]
        started = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        result = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
        wall = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        report = json.loads(output.read_text()) if output.exists() else None
    return {
        "target": target,
        "trainer_argv": trainer_argv,
        "exit_status": result.returncode,
        "wall_seconds": wall,
        # The largest child so far: each slice runs after the previous one, so a smaller later
        # child reads the earlier peak; the report's own host_peak_bytes is per process.
        "children_peak_rss_bytes": max(peak, before) * 1024,
        "report": report,
        "stdout": result.stdout,
        "stderr_tail": result.stderr[-4000:],
    }


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f} GiB"


def memory_rows(run: dict) -> list[str]:
    report = run["report"]
    if report is None:
        return [f"| {run['target']} | no report (exit {run['exit_status']}) | | | | | | | |"]
    memory = report["memory_bytes"]
    rows = []
    for program in report["programs"]:
        if program["peak"] is None:
            what = "OUT OF MEMORY" if program["out_of_memory"] else "FAILED"
            needed = f": needs {_gib(program['needed'])}" if program["needed"] else ""
            peak, headroom = f"{what}{needed}", "-"
        else:
            peak = _gib(program["peak"])
            headroom = (
                f"{_gib(memory - program['peak'])} ({100 * (1 - program['peak'] / memory):.1f}%)"
            )
        rows.append(
            f"| {run['target']} | {program['name']} | {_gib(program['temp'])} |"
            f" {_gib(program.get('temp_block'))} | {peak} | {_gib(program.get('live_peak'))} |"
            f" {headroom} | {program['compile_seconds']:.1f} s | |"
        )
    rows.append(
        f"| {run['target']} | device peak | | | {_gib(report['peak_bytes'])} of {_gib(memory)} | |"
        f" {_gib(report['headroom_bytes'])}: {_verdict(report)} | {run['wall_seconds']:.0f} s"
        f" wall (exit {run['exit_status']}) | {_gib(report['host_peak_bytes'])} |"
    )
    return rows


def _verdict(report: dict) -> str:
    verdict = {True: "FITS", False: "DOES NOT FIT", None: "UNKNOWN"}[report["fits"]]
    if not report["fits"]:
        return verdict
    margin = f"{100 * report['min_headroom']:g}% margin"
    if report["margin_met"]:
        return f"{verdict}, {margin} free"
    short = report["margin_bytes"] - report["headroom_bytes"]
    return f"{verdict}, BELOW the {margin} by {_gib(short)}"


def _seconds(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"


def time_rows(run: dict) -> list[str]:
    report = run["report"]
    estimate = report and report["time_estimate"]
    if not estimate:
        return [f"| {run['target']} | no estimate | | | | | |"]
    fwd_bwd = estimate["program_seconds"].get("fwd_bwd")
    bounds = estimate.get("bounds") or {}
    floor = (bounds.get("compute_seconds") or {}).get("fwd_bwd")
    mfu, ceiling = estimate["mfu"], bounds.get("mfu_ceiling")
    ratio = "" if fwd_bwd is None else f", {fwd_bwd / PUBLIC['fwd_bwd']:.2f}x"
    return [
        f"| {run['target']} | {_seconds(fwd_bwd)} (public {PUBLIC['fwd_bwd']} s{ratio}) | "
        f"{_seconds(floor)} | {_seconds(estimate['step_seconds'], 2)} (public"
        f" {PUBLIC['step_stage_on']} s on, {PUBLIC['step_stage_off']} s off) | "
        f"{_seconds(bounds.get('step_floor_seconds'), 2)} | "
        f"{estimate['replay_probability']:.3g} | "
        + ("-" if mfu is None else f"{100 * mfu:.1f}%")
        + " | "
        + ("-" if ceiling is None else f"{100 * ceiling:.1f}%")
        + " |"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-397b-cell")
    parser.add_argument(
        "--slice",
        action="append",
        required=True,
        help="TARGET or 'TARGET=TRAINER ARGV' (repeat for several slices)",
    )
    parser.add_argument("--results", default="benchmarks/results/aot_fit_table.json")
    parser.add_argument("extra", nargs="*", help="more `aot` arguments, after --")
    args = parser.parse_args()
    runs = []
    for spec in args.slice:
        target, _, trainer_argv = spec.partition("=")
        print(
            f"aot_fit_table: compiling {args.preset} for {target} ...", file=sys.stderr, flush=True
        )
        runs.append(run_slice(args.preset, target, trainer_argv, args.extra))
    Path(args.results).write_text(json.dumps(runs, indent=1) + "\n")
    print(
        "| slice | program | temp_size | HBM temp block | device peak | XLA live peak | headroom"
        " | compile | host peak |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print("\n".join(memory_rows(run)))
    print()
    print(
        "| slice | fwd_bwd, ESTIMATE | fwd_bwd, LOWER BOUND | step, ESTIMATE | step, LOWER BOUND"
        " | P(replay) | MFU, ESTIMATE | MFU, UPPER BOUND |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print("\n".join(time_rows(run)))
    return 0 if all(run["exit_status"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
