"""The chip's headline figures in one call: step, MFU, peaks, boundary idle, A/B interval, compiles.

On a host with one TPU chip, for its one-chip preset (`presets.ONE_CHIP_PRESETS`), one command after
the other (one process at a time can hold the chip):
  1. `run` with STAGE_BEFORE_UPDATE off, then on: scored steps traced with the profiler, then
     MEASURE_PEAK's bisection; the step's median time and MFU, the compile times, the measured peak
     beside aot's sum for the same programs, and the device's idle time at each step boundary read
     from the trace's program line on the chip (not from host clocks); with XLA's dump of the
     programs, the trace's op times by engine function (`trace_cost_by_source.md` in each run's
     folder, `preflight/hlo/trace_ops.py`);
  2. `aot --target local` with the stage off and on: the predicted step and peak, and the host
     memory the compile took;
  3. `ab` at its defaults (README's main job): its verdict and its interval in % of the step.
Writes every command's output under OUT, `headline.json` and `headline.md` (the table for
BENCHMARKS.md). A host without a chip is refused unless `--allow-cpu` (the plumbing only: no peak,
no device line in the trace).

Usage:  PYTHONPATH=. python benchmarks/chip_headline.py --out "$OUT"
The cost table before the TPU kernels, the padded einsum's and XLA attention's (one more call,
no A/B):
        PYTHONPATH=. python benchmarks/chip_headline.py --out "$OUT/before" --skip-ab \
            --engine-flags "expert_compute=einsum attention=xla"
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rl_trainer_bench import local_chips
from rl_trainer_bench.config.presets import ONE_CHIP_PRESETS
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.preflight.hlo.trace_ops import (
    device_lines,
    dumped_sources,
    markdown_table,
    op_events,
    read_trace,
    time_by_source,
)

GIB = 1024**3
_COMPILE = re.compile(r"compile program=(\S+) seconds=([\d.]+)")
STAGES = ("off", "on")


def bench(
    args: list[str], out: Path, name: str, xla_flags: str = "", allowed: tuple[int, ...] = (0, 1)
) -> tuple[str, float]:
    """`rl-trainer-bench ARGS` in a process of its own, its output kept as OUT/name.log; the
    caller's XLA_FLAGS are dropped, `xla_flags` given instead. An exit status not `allowed`
    stops the script (aot exits 1 for DOES NOT FIT, which is a figure here)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rl_trainer_bench.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - started
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode not in allowed:
        raise SystemExit(f"{name}: exit {done.returncode}; see {out / name}.log")
    return done.stdout, seconds


def boundary_idle(events: list[dict]) -> list[float]:
    """Seconds between the end of each `update` program on the first device and the start of the
    next program there, from the profiler's Chrome trace (its per-device program line)."""
    line = device_lines(events).get("XLA Modules", [])
    gaps = []
    for done, following in itertools.pairwise(line):
        if "update" in done["name"]:
            gaps.append((following["ts"] - done["ts"] - done["dur"]) / 1e6)
    return gaps


def run_figures(out: Path, preset: str, stage: str, steps: int, measure: bool, flags: str) -> dict:
    """One `run` of the preset at `stage`, traced over its scored steps, its programs dumped by
    XLA so the trace's op times are charged to the engine's functions."""
    folder = out / f"run-stage-{stage}"
    warmup = 2
    args = ["run", "--preset", preset, "--steps", str(steps), "--warmup-steps", str(warmup)]
    args += ["--stage-before-update", stage, "--results-dir", str(folder)]
    args += ["--profile-steps", f"{warmup}:{warmup + steps - 1}"]
    args += ["--measure-peak", "on" if measure else "off", "--engine-flags", flags]
    dump = f"--xla_dump_to={folder / 'hlo'} --xla_dump_hlo_as_text"
    stdout, seconds = bench(args, out, folder.name, dump)
    events = read_trace(folder / "profile")
    rows = time_by_source(op_events(events), dumped_sources(folder / "hlo"))
    write_text_atomically(
        folder / "trace_cost_by_source.md", markdown_table(rows, steps, 25) + "\n"
    )
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    scored = [r for r in records if not r["warmup"]]
    peak_file = folder / "device_peak.json"
    return {
        "step_s": statistics.median(r["step_s"] for r in scored),
        "mfu": statistics.median(r["mfu"] for r in scored) if scored[0]["mfu"] else None,
        "replays": [r["replay_count"] for r in scored],
        "compile_s": {m.group(1): float(m.group(2)) for m in _COMPILE.finditer(stdout)},
        "device_peak": json.loads(peak_file.read_text()) if peak_file.exists() else None,
        "boundary_idle_s": boundary_idle(events),
        "trace_cost_by_source": rows,
        "wall_s": seconds,
    }


def aot_figures(out: Path, preset: str, stage: str, flags: str) -> dict:
    report = out / f"aot-stage-{stage}.json"
    args = ["aot", "--preset", preset, "--target", "local", "--stage-before-update", stage]
    args += ["--engine-flags", flags]
    bench([*args, "--output", str(report)], out, report.stem)
    figures = json.loads(report.read_text())
    estimate = figures.get("time_estimate") or {}
    return {
        "peak_bytes": figures["peak_bytes"],
        "fits": figures["fits"],
        "program_peaks": {p["name"]: p.get("peak") for p in figures["programs"]},
        "predicted_step_s": estimate.get("step_seconds"),
        "predicted_mfu": estimate.get("mfu"),
        "host_peak_bytes": figures["host_peak_bytes"],
        "compile_s": figures["compile_seconds"],
    }


def ab_figures(out: Path) -> dict:
    folder = out / "ab"
    _, seconds = bench(["ab", "--out", str(folder)], out, "ab")
    report = json.loads((folder / "ab.json").read_text())
    delta = report["score"]["deltas"][0]
    half = (delta["ci_high_s"] - delta["ci_low_s"]) / 2
    return {
        "verdict": report["verdict"],
        "delta_pct": delta["delta_pct"],
        "ci_half_width_pct": 100 * half / delta["baseline_median_s"],
        "confidence": report["score"]["confidence"],
        "wall_s": seconds,
    }


def table(figures: dict) -> str:
    """The Markdown rows BENCHMARKS.md takes: one per figure, STAGE off and on side by side."""
    rows = ["| figure | STAGE off | STAGE on |", "| --- | --- | --- |"]

    def row(label, read):
        cells = [read(stage) for stage in STAGES]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    run, aot = figures["run"], figures["aot"]

    def peak(stage):
        measured = (run[stage]["device_peak"] or {}).get("measured")
        if not measured:
            return "-"
        low = measured["peak_more_than"]
        return f"{(low or 0) / GIB:.2f} to {measured['peak_at_most'] / GIB:.2f} GiB"

    row("step (median, MEASURED)", lambda s: f"{run[s]['step_s']:.3f} s")
    row("MFU (MEASURED)", lambda s: f"{100 * run[s]['mfu']:.1f}%" if run[s]["mfu"] else "-")
    row(
        "step predicted by aot (ESTIMATE)",
        lambda s: (
            "-" if aot[s]["predicted_step_s"] is None else f"{aot[s]['predicted_step_s']:.3f} s"
        ),
    )
    row("device peak of a step (MEASURED bracket)", peak)
    row("peak by aot's model (ESTIMATE)", lambda s: f"{aot[s]['peak_bytes'] / GIB:.2f} GiB")
    row(
        "device idle at the boundary (trace, median)",
        lambda s: (
            f"{1e3 * statistics.median(run[s]['boundary_idle_s']):.2f} ms"
            if run[s]["boundary_idle_s"]
            else "-"
        ),
    )
    row(
        "compiles (run)",
        lambda s: ", ".join(f"{k} {v:.0f} s" for k, v in run[s]["compile_s"].items()),
    )
    row("aot's host memory", lambda s: f"{aot[s]['host_peak_bytes'] / GIB:.2f} GiB")
    ab = figures["ab"]
    if ab:
        rows.append(
            f"| A/B (README's main job): verdict, interval | {ab['verdict']},"
            f" +-{ab['ci_half_width_pct']:.3f}% of the step | |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "chip_headline")))
    parser.add_argument("--steps", type=int, default=5, help="scored steps per run")
    parser.add_argument("--allow-cpu", action="store_true", help="run the plumbing on the CPU")
    parser.add_argument("--preset", help="default: the chip's one-chip preset")
    parser.add_argument(
        "--engine-flags",
        default="",
        help="ENGINE_FLAGS for run and aot, e.g. expert_compute=einsum for the padded layout",
    )
    parser.add_argument(
        "--skip-ab", action="store_true", help="leave out the A/B (its preset is the same)"
    )
    args = parser.parse_args()
    chip = local_chips.local_tpu()
    on_chip = chip is not None and chip.chips == 1 and chip.kind in ONE_CHIP_PRESETS
    if not on_chip and not args.allow_cpu:
        parser.error("needs one TPU chip with a one-chip preset on this host (or --allow-cpu)")
    preset = args.preset or (ONE_CHIP_PRESETS[chip.kind] if on_chip else "cpu-tiny")
    args.out.mkdir(parents=True, exist_ok=True)
    figures = {
        "preset": preset,
        "engine_flags": args.engine_flags,
        "chip": chip.describe() if chip else None,
        "run": {},
        "aot": {},
    }
    for stage in STAGES:
        figures["run"][stage] = run_figures(
            args.out, preset, stage, args.steps, on_chip, args.engine_flags
        )
        figures["aot"][stage] = aot_figures(args.out, preset, stage, args.engine_flags)
    figures["ab"] = None if args.skip_ab else ab_figures(args.out)
    (args.out / "headline.json").write_text(json.dumps(figures, indent=1))
    (args.out / "headline.md").write_text(table(figures) + "\n")
    print(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
