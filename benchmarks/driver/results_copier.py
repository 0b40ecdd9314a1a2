"""What copying results as the run goes costs, and how soon a finished step is copied.

`bench/results_copy.copying` starts a separate process that looks at RESULTS_DIR every few
seconds and copies each file that changed. This script plays a run against it on this host: it
appends one `results.jsonl` line per simulated step (every `--step-seconds`, a 1 KiB line like a
step record) to a folder that also holds a profile trace of `--trace-mib`, with a local folder
as RESULTS_URI, and measures, per step, the seconds from the line's fsync to its appearance in
the copy (the copy's lag), and the copier process's CPU seconds over the whole run (from
/proc/PID/stat: user + system). Usage (about `--steps x --step-seconds` seconds):

    PYTHONPATH=. python benchmarks/driver/results_copier.py --steps 12 --step-seconds 5

Prints one line of figures; nothing is written outside a temporary folder.

Remakes BENCHMARKS.md's driver suite; benchmarks/reports/results-copier_cpu_2026-12-04.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from rl_trainer_bench.bench import results_copy

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _copied_lines(uri: Path) -> int:
    found = list(uri.glob("*/results.jsonl"))
    return len(found[0].read_text().splitlines()) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--trace-mib", type=int, default=64)
    parser.add_argument("--interval", type=float, default=results_copy.FOLLOW_SECONDS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="results-copier-") as scratch:
        folder, uri = Path(scratch) / "results", Path(scratch) / "volume"
        (folder / "profile").mkdir(parents=True)
        (folder / "profile" / "trace.pb").write_bytes(os.urandom(args.trace_mib << 20))
        said: list[str] = []
        lags = []
        started = time.monotonic()
        with results_copy.copying(folder, str(uri), said.append, args.interval):
            copier = int(said[0].split("(pid ")[1].split(",")[0])
            with (folder / "results.jsonl").open("a") as results:
                for step in range(args.steps):
                    time.sleep(args.step_seconds)
                    results.write(f'{{"step": {step}, "pad": "{"x" * 1000}"}}\n')
                    results.flush()
                    os.fsync(results.fileno())
                    written = time.monotonic()
                    while _copied_lines(uri) <= step:
                        time.sleep(0.01)
                    lags.append(time.monotonic() - written)
            cpu = _cpu_seconds(copier)
        wall = time.monotonic() - started
    print(
        f"steps={args.steps} step_s={args.step_seconds:g} interval_s={args.interval:g}"
        f" trace_mib={args.trace_mib} lag_s median={statistics.median(lags):.2f}"
        f" max={max(lags):.2f} copier_cpu_s={cpu:.2f} over wall_s={wall:.1f}"
        f" ({100 * cpu / wall:.2f}% of one core)"
    )


if __name__ == "__main__":
    main()
