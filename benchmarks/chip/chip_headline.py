"""The chip's headline figures in one call: step, MFU, peaks, boundary idle, A/B interval, compiles.

On a host with one TPU chip, for its one-chip preset (`presets.ONE_CHIP_PRESETS`), one command after
the other (one process at a time can hold the chip):
  1. `run` with STAGE_BEFORE_UPDATE off, then on: scored steps traced with the profiler, then
     MEASURE_PEAK's bisection; the step's median time and MFU, the compile times, the measured peak
     beside aot's sum for the same programs, and the device's idle time at each step boundary read
     from the trace's program line on the chip (not from host clocks); with XLA's dump of the
     programs, the trace's op times by engine function (`trace_cost_by_source.md` in each run's
     folder, `preflight/hlo/trace_ops.py`) and, for the largest functions, by op with each op's
     opcode and shapes (`trace_ops_by_source.md`);
  2. `aot --target local` with the stage off and on: the predicted step and peak, and the host
     memory the compile took; or, with `--from-aot OFF.json ON.json`, aot's reports of the same
     cell compiled for the chip's topology from a CPU host (`aot --target v5e:1x1 --output`: the
     chip's own compile, to the byte; BENCHMARKS.md), which spares the chip two compiles;
  3. `ab` without a preset (README's main job): its first lines, its verdict and its interval in %
     of the step. `--skip-ab` leaves it out, `--ab-only` runs it alone and adds it to OUT's
     `headline.json` of an earlier call where there is one (each call then fits in 10 minutes).
Writes every command's output under OUT, `headline.json` and `headline.md` (the table for
BENCHMARKS.md). A host without a chip this process can open is refused unless `--allow-cpu` (the
plumbing only: no peak, no device line in the trace).

JAX's persistent compilation cache: where JAX_COMPILATION_CACHE_DIR is set (or `--compilation-cache
DIR`), every command compiles into it (else none does: COMPILE_CACHE=off, not the bench's default), so a program compiled once (the preset's take about 2 minutes
on a v5e) loads in seconds in the later commands; each compile time is labelled cold (compiled
here: the cache gained the program's entry) or warm (loaded from the cache). The compile that reads
a program's HBM temporary block (MEASURE_PEAK's aot figures, `aot`) always compiles: XLA dumps
the buffer assignment only then (engine/temp_block.py).

Usage:  PYTHONPATH=. python benchmarks/chip/chip_headline.py --out "$OUT" --compilation-cache /tmp/xla
The cost table before the TPU kernels, the padded einsum's and XLA attention's (one more call,
no A/B):
        PYTHONPATH=. python benchmarks/chip/chip_headline.py --out "$OUT/before" --skip-ab \
            --engine-flags "expert_compute=einsum attention=xla"

Remakes BENCHMARKS.md's rows "tpu-v5e-1's step and MFU" and "tpu-v5e-1's device peak" (parts
headline-off, headline-on and trace of chip_runs.sh);
benchmarks/reports/chip-round-1_tpu-v5e_2026-12-06.md,
benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md.
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

from rl_trainer_bench.chips import local_chips
from rl_trainer_bench.config.presets import one_chip_preset
from rl_trainer_bench.io import write_text_atomically
from rl_trainer_bench.preflight.hlo.trace_ops import (
    device_lines,
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

# The functions, and the ops of each, `trace_ops_by_source.md` lists: the largest first
TRACED_FUNCTIONS, TRACED_OPS = 8, 8

GIB = 1024**3
_COMPILE = re.compile(r"compile program=(\S+) seconds=([\d.]+)")
STAGES = ("off", "on")
_PRESET_LINE = re.compile(r"\bpreset: \S+ \(chosen by ")


CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def cached_programs() -> set[str]:
    """The programs (JAX's module names, `jit_fwd_bwd`) the persistent cache holds; its entries
    are named `<module>-<key>-cache`. Empty without a cache."""
    folder = os.environ.get(CACHE_VARIABLE)
    if not folder or not Path(folder).is_dir():
        return set()
    return {entry.name.rsplit("-", 2)[0] for entry in Path(folder).glob("*-cache")}


def bench(
    args: list[str], out: Path, name: str, xla_flags: str = "", allowed: tuple[int, ...] = (0, 1)
) -> tuple[str, float, set[str]]:
    """`rl-trainer-bench ARGS` in a process of its own, its output kept as OUT/name.log; the
    caller's XLA_FLAGS are dropped, `xla_flags` given instead. An exit status not `allowed`
    stops the script (aot exits 1 for DOES NOT FIT, which is a figure here). Returns its output,
    its seconds and the programs it compiled into the persistent cache (`cold`: all of them
    when there is no cache)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    if env.get(CACHE_VARIABLE):
        # every compile goes in, not only those over JAX's one second
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    else:  # no cache here means none: not the bench's default folder (docs/run.md)
        env["COMPILE_CACHE"] = "off"
    before = cached_programs()
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
    return done.stdout, seconds, cached_programs() - before


def preset_line(stdout: str) -> str:
    """The line `run` and `ab` open with: which preset they time and what chose it."""
    return next((line for line in stdout.splitlines() if _PRESET_LINE.search(line)), "")


def compile_times(stdout: str, compiled_here: set[str]) -> dict[str, dict]:
    """The run's compile lines, each with whether it compiled (cold) or loaded from the cache."""
    cold = not os.environ.get(CACHE_VARIABLE)
    return {
        m.group(1): {
            "seconds": float(m.group(2)),
            "cold": cold or f"jit_{m.group(1)}" in compiled_here,
        }
        for m in _COMPILE.finditer(stdout)
    }


def boundary_idle(events: list[dict]) -> list[float]:
    """Seconds between the end of each `update` program on the first device and the start of the
    next program there, from the profiler's Chrome trace (its per-device program line)."""
    line = device_lines(events).get("XLA Modules", [])
    gaps = []
    for done, following in itertools.pairwise(line):
        if "update" in done["name"]:
            gaps.append((following["ts"] - done["ts"] - done["dur"]) / 1e6)
    return gaps


def run_figures(
    out: Path, preset: str | None, stage: str, steps: int, measure: bool, flags: str
) -> dict:
    """One `run` of `preset` (None: the one `run` chooses, as README's main job does) at `stage`,
    traced over its scored steps, its programs dumped by XLA so the trace's op times are charged
    to the engine's functions. A run whose programs came from the persistent cache dumps none:
    its ops are charged by the dumps of the other stage's run in `out` (the same programs)."""
    folder = out / f"run-stage-{stage}"
    warmup = 2
    args = ["run", *(["--preset", preset] if preset else [])]
    args += ["--steps", str(steps), "--warmup-steps", str(warmup)]
    args += ["--stage-before-update", stage, "--results-dir", str(folder)]
    args += ["--profile-steps", f"{warmup}:{warmup + steps - 1}"]
    args += ["--measure-peak", "on" if measure else "off", "--engine-flags", flags]
    dump = f"--xla_dump_to={folder / 'hlo'} --xla_dump_hlo_as_text"
    stdout, seconds, compiled_here = bench(args, out, folder.name, dump)
    events = read_trace(folder / "profile")
    rows = write_trace_tables(folder, op_events(events), dumped_ops(out), steps)
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    scored = [r for r in records if not r["warmup"]]
    peak_file = folder / "device_peak.json"
    return {
        "preset_line": preset_line(stdout),
        "step_s": statistics.median(r["step_s"] for r in scored),
        "mfu": statistics.median(r["mfu"] for r in scored) if scored[0]["mfu"] else None,
        "replays": [r["replay_count"] for r in scored],
        "compiles": compile_times(stdout, compiled_here),
        "device_peak": json.loads(peak_file.read_text()) if peak_file.exists() else None,
        "boundary_idle_s": boundary_idle(events),
        "trace_cost_by_source": rows,
        "wall_s": seconds,
    }


def write_trace_tables(folder: Path, ops: list, dumped: tuple, steps: int) -> list[dict]:
    """The trace's op times by engine function (`trace_cost_by_source.md`) and, for the largest
    functions, by op with what each op is (`trace_ops_by_source.md`: the dumps are not kept);
    returns the functions' rows."""
    sources, descriptions = dumped
    rows = time_by_source(ops, sources)
    write_text_atomically(
        folder / "trace_cost_by_source.md", markdown_table(rows, steps, 25) + "\n"
    )
    tables = []
    for row in rows[:TRACED_FUNCTIONS]:
        by_op = time_by_op(ops, sources, row["source"])
        tables.append(
            f"## `{row['source']}`\n\n{ops_table(by_op, steps, TRACED_OPS, descriptions)}\n\n"
            f"By kind:\n\n{kinds_table(time_by_kind(by_op, descriptions), steps, TRACED_OPS)}"
        )
    write_text_atomically(folder / "trace_ops_by_source.md", "\n\n".join(tables) + "\n")
    return rows


def aot_figures(out: Path, preset: str, stage: str, flags: str) -> dict:
    """aot's figures for the cell at `stage`, from `aot --target local` run here."""
    report = out / f"aot-stage-{stage}.json"
    args = ["aot", "--preset", preset, "--target", "local", "--stage-before-update", stage]
    args += ["--engine-flags", flags]
    bench([*args, "--output", str(report)], out, report.stem)
    return read_aot(report, preset, stage)


def read_aot(report: Path, preset: str, stage: str) -> dict:
    """The figures of aot's report (`aot --output`) of `preset` at `stage`; SystemExit naming
    the file where it is of another cell, or not aot's report."""
    try:
        figures = json.loads(report.read_text())
        cell = (figures["preset"], figures["stage_before_update"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--from-aot: {report} is not aot's report (--output): {error}") from None
    if cell != (preset, stage == "on"):
        raise SystemExit(
            f"--from-aot: {report} is preset {cell[0]} with the stage"
            f" {'on' if cell[1] else 'off'}, not {preset} with it {stage}: give the reports of"
            " this preset, the stage off then on"
        )
    estimate = figures.get("time_estimate") or {}
    return {
        "report": str(report),
        "target": figures["target"],
        "peak_bytes": figures["peak_bytes"],
        "fits": figures["fits"],
        "program_peaks": {p["name"]: p.get("peak") for p in figures["programs"]},
        "predicted_step_s": estimate.get("step_seconds"),
        "predicted_mfu": estimate.get("mfu"),
        "host_peak_bytes": figures["host_peak_bytes"],
        "compile_s": figures["compile_seconds"],
    }


def ab_figures(out: Path) -> dict:
    """README's main job as a user runs it: `ab` with no preset, its preset line kept."""
    folder = out / "ab"
    stdout, seconds, compiled_here = bench(["ab", "--out", str(folder)], out, "ab")
    report = json.loads((folder / "ab.json").read_text())
    delta = report["score"]["deltas"][0]
    half = (delta["ci_high_s"] - delta["ci_low_s"]) / 2
    return {
        "preset_line": preset_line(stdout),
        "compiled_cold": sorted(compiled_here),
        "verdict": report["verdict"],
        "delta_pct": delta["delta_pct"],
        "ci_half_width_pct": 100 * half / delta["baseline_median_s"],
        "confidence": report["score"]["confidence"],
        "wall_s": seconds,
    }


def table(figures: dict) -> str:
    """The Markdown rows BENCHMARKS.md takes: one per figure, the stages run side by side."""
    stages = list(figures.get("run", {})) or list(STAGES)
    rows = [
        "| figure | " + " | ".join(f"STAGE {stage}" for stage in stages) + " |",
        "| --- |" + " --- |" * len(stages),
    ]

    def row(label, read):
        cells = [read(stage) for stage in stages]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    ab = figures.get("ab")
    if "run" not in figures:  # an --ab-only call on its own
        rows.append(ab_row(ab))
        return "\n".join(rows)
    run, aot = figures["run"], figures["aot"]

    def peak(stage):
        measured = (run[stage]["device_peak"] or {}).get("measured")
        if not measured:
            return "-"
        low = measured["peak_more_than"]
        return f"{(low or 0) / GIB:.2f} to {measured['peak_at_most'] / GIB:.2f} GiB"

    row("the run's preset line", lambda s: f"`{run[s]['preset_line']}`")
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

    def same_programs(stage):
        model = (run[stage]["device_peak"] or {}).get("aot_model")
        if not model:
            return "-"
        return f"{max(p['peak'] for p in model.values()) / GIB:.2f} GiB"

    row("aot's model of the run's own programs (device_peak.json, ESTIMATE)", same_programs)
    row(
        "device idle at the boundary (trace, median)",
        lambda s: (
            f"{1e3 * statistics.median(run[s]['boundary_idle_s']):.2f} ms"
            if run[s]["boundary_idle_s"]
            else "-"
        ),
    )
    row(
        "compiles (run; cold: compiled, warm: from the persistent cache)",
        lambda s: ", ".join(
            f"{k} {v['seconds']:.0f} s {'cold' if v['cold'] else 'warm'}"
            for k, v in run[s]["compiles"].items()
        ),
    )
    row(
        "aot's host memory (its target)",
        lambda s: f"{aot[s]['host_peak_bytes'] / GIB:.2f} GiB ({aot[s]['target']})",
    )
    if ab:
        rows.append(ab_row(ab))
    return "\n".join(rows)


def ab_row(ab: dict) -> str:
    """The A/B's table row: the preset line a user sees first, its verdict and interval."""
    return (
        f"| A/B (README's main job, `ab`): its preset line, verdict, interval |"
        f" `{ab['preset_line']}`; {ab['verdict']}, +-{ab['ci_half_width_pct']:.3f}% of the"
        " step |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "chip_headline")))
    parser.add_argument("--steps", type=int, default=5, help="scored steps per run")
    parser.add_argument("--allow-cpu", action="store_true", help="run the plumbing on the CPU")
    parser.add_argument(
        "--preset", help="default: the one `run` chooses (the chip's one-chip preset on a chip)"
    )
    parser.add_argument(
        "--engine-flags",
        default="",
        help="ENGINE_FLAGS for run and aot, e.g. expert_compute=einsum for the padded layout",
    )
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument(
        "--skip-ab", action="store_true", help="leave out the A/B (its preset is the same)"
    )
    parts.add_argument(
        "--ab-only",
        action="store_true",
        help="the A/B alone, added to the headline.json an earlier call wrote in --out, if any",
    )
    parser.add_argument(
        "--stages",
        choices=("off,on", "off", "on"),
        metavar="off,on|off|on",
        default="off,on",
        help="STAGE_BEFORE_UPDATE of the runs (one per call keeps a call short)",
    )
    parser.add_argument(
        "--from-aot",
        nargs=2,
        type=Path,
        metavar=("OFF_JSON", "ON_JSON"),
        help="aot's reports (--output) with the stage off and on, instead of aot on this host",
    )
    parser.add_argument(
        "--compilation-cache",
        type=Path,
        default=os.environ.get(CACHE_VARIABLE),
        help=f"JAX's persistent compilation cache for every command (default: {CACHE_VARIABLE})",
    )
    args = parser.parse_args()
    chip = local_chips.usable_tpu(os.environ)
    chips_own = one_chip_preset(chip)
    on_chip = chips_own is not None
    if not on_chip and not args.allow_cpu:
        parser.error("needs one TPU chip with a one-chip preset, openable here (or --allow-cpu)")
    if args.compilation_cache:
        args.compilation_cache.mkdir(parents=True, exist_ok=True)
        os.environ[CACHE_VARIABLE] = str(args.compilation_cache.resolve())
    preset = args.preset or (chips_own.name if chips_own else "cpu-tiny")
    args.out.mkdir(parents=True, exist_ok=True)
    earlier = args.out / "headline.json"
    if args.ab_only:
        figures = json.loads(earlier.read_text()) if earlier.exists() else {"preset": None}
        figures["ab"] = ab_figures(args.out)
    else:
        figures = {
            "preset": preset,
            "engine_flags": args.engine_flags,
            "chip": chip.describe() if chip else None,
            "compilation_cache": os.environ.get(CACHE_VARIABLE),
            "run": {},
            "aot": {},
        }
        stages = args.stages.split(",")
        if args.from_aot:  # read before any run: a wrong file costs no chip time
            reports = dict(zip(STAGES, args.from_aot, strict=True))
            figures["aot"] = {stage: read_aot(reports[stage], preset, stage) for stage in stages}
        for stage in stages:
            figures["run"][stage] = run_figures(
                args.out, args.preset, stage, args.steps, on_chip, args.engine_flags
            )
            if not args.from_aot:
                figures["aot"][stage] = aot_figures(args.out, preset, stage, args.engine_flags)
        figures["ab"] = None if args.skip_ab else ab_figures(args.out)
    write_text_atomically(earlier, json.dumps(figures, indent=1))
    write_text_atomically(args.out / "headline.md", table(figures) + "\n")
    print(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
