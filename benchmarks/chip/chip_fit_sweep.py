"""FITS exactly where the step runs? One cell's size swept across a chip's memory: aot's verdict
beside the chip's own answer, size by size.

For each size (rows per micro-batch of the one-chip preset, `train_micro_batch_size`), two
answers from separate processes:
  - aot's: `rl-trainer-bench aot --preset P --target T --engine-flags train_micro_batch_size=R`
    (T = `local` on the chip, or the chip's name, `v5e:1x1`, from a CPU host with the [tpu]
    extra): FITS or DOES NOT FIT, and the peak it predicts;
  - the chip's: `rl-trainer-bench run --preset P --steps 1 --warmup-steps 1 --engine-flags ...`:
    the step ran, or a program did not load (RESOURCE_EXHAUSTED), which is the chip's no.
The sizes should straddle the limit: on v5e aot puts the preset at 14.20 GiB with 4 rows, 15.50
with 7, and 8 rows past the chip's 15.75 GiB (BENCHMARKS.md).
`--aot-only` gives aot's half from a CPU host; `--from-aot FILE` reads it on the chip, so the
chip's minutes go to the runs (107 s a size on a v5e: the chip opened, three compiles side by
side, two steps), and `--rows` splits the sweep over several calls. Each size's programs are
its own, so every size compiles cold; a size run again loads them from the compile cache
(JAX_COMPILATION_CACHE_DIR in benchmarks/chip/chip_runs.sh, else the bench's default folder). Writes OUT/sweep.json and OUT/sweep.md.

Usage:
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/chip/chip_fit_sweep.py \\
      --target v5e:1x1 --aot-only --out "$OUT"            # on a CPU host
  PYTHONPATH=. python benchmarks/chip/chip_fit_sweep.py --out "$OUT" \
      --from-aot benchmarks/results/2026-12-06-chip-fit-sweep-aot-tpu-v5e-1-splash-v5e-1x1.json

Remakes BENCHMARKS.md's row "aot's fit verdict against the chip";
benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md (the chip's half),
benchmarks/reports/aot-one-chip-memory_v5e-v6e_2026-12-05.md (aot's half).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chip_headline import GIB, bench

from rl_trainer_bench.io import write_text_atomically

LOAD_FAILURE = "RESOURCE_EXHAUSTED"


def aot_verdict(out: Path, preset: str, target: str, rows: int) -> dict:
    """aot's peak and verdict for the preset at `rows` rows per micro-batch."""
    report = out / f"aot-rows-{rows}.json"
    args = ["aot", "--preset", preset, "--target", target, "--output", str(report)]
    bench([*args, "--engine-flags", f"train_micro_batch_size={rows}"], out, report.stem)
    figures = json.loads(report.read_text())
    return {"peak_bytes": figures["peak_bytes"], "fits": figures["fits"]}


def run_verdict(out: Path, preset: str, rows: int) -> str:
    """`ran` when one step ran on the chip at `rows`, `did not load` when a program did not."""
    name = f"run-rows-{rows}"
    args = ["run", "--preset", preset, "--steps", "1", "--warmup-steps", "1"]
    args += ["--engine-flags", f"train_micro_batch_size={rows}"]
    args += ["--results-dir", str(out / name)]
    bench(args, out, name, allowed=tuple(range(256)))
    results = out / name / "results.jsonl"
    records = (
        [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    )
    if any(not record["warmup"] for record in records):
        return "ran"
    if LOAD_FAILURE in (out / f"{name}.log").read_text():
        return "did not load"
    raise SystemExit(f"{name}: neither ran nor failed to load; see {out / name}.log")


def table(sweep: list[dict]) -> str:
    rows = [
        "| rows per micro-batch | aot's peak | aot's verdict | the chip | agree |",
        "| --- | --- | --- | --- | --- |",
    ]
    for size in sweep:
        verdict = "FITS" if size["fits"] else "DOES NOT FIT"
        chip = size.get("chip", "-")
        agree = "-" if chip == "-" else ("yes" if size["fits"] == (chip == "ran") else "NO")
        rows.append(
            f"| {size['rows']} | {size['peak_bytes'] / GIB:.2f} GiB | {verdict} | {chip} | {agree} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("chip_fit_sweep"))
    parser.add_argument("--preset", default="tpu-v5e-1")
    parser.add_argument("--target", default="local", help="aot's target (local on the chip)")
    parser.add_argument(
        "--rows", default="3,4,5,6,7,8", help="rows per micro-batch, comma-separated"
    )
    parser.add_argument("--aot-only", action="store_true", help="aot's verdicts alone (CPU host)")
    parser.add_argument("--from-aot", type=Path, help="aot's verdicts from an earlier --aot-only")
    args = parser.parse_args()
    try:
        sizes = [int(r) for r in args.rows.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser.error(f"--rows: give whole numbers of 1 or more, comma-separated, not {args.rows!r}")
    known = {}
    if args.from_aot:
        try:
            earlier = json.loads(args.from_aot.read_text())
            known = {s["rows"]: s for s in earlier["sweep"]}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
            parser.error(f"--from-aot: not a sweep.json of --aot-only ({error})")
        if earlier.get("preset") != args.preset:
            parser.error(
                f"--from-aot: its sweep is of preset {earlier.get('preset')!r}, not"
                f" --preset {args.preset}: give the same preset"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = []
    for rows in sizes:
        size = known.get(rows) or {
            "rows": rows,
            **aot_verdict(args.out, args.preset, args.target, rows),
        }
        if not args.aot_only:
            size = {**size, "chip": run_verdict(args.out, args.preset, rows)}
        sweep.append(size)
        document = {"preset": args.preset, "target": args.target, "sweep": sweep}
        write_text_atomically(args.out / "sweep.json", json.dumps(document, indent=1))
    write_text_atomically(args.out / "sweep.md", table(sweep) + "\n")
    print(table(sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
