"""How long the plan of an A/B that stops when settled takes to print its lines: the forecast
simulates the stopping rule (ab/sequential_forecast.py) before anything runs. Usage:

    PYTHONPATH=. python benchmarks/closed/ab_plan_forecast_time.py 50 200 1000

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/ab-sequential-half-block_simulated_2026-12-05.md.
"""

from __future__ import annotations

import sys
import time

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab


def main() -> int:
    for blocks in sys.argv[1:] or ["50", "200"]:
        argv = ["ab", "--stop", "settled", "--blocks", blocks, "--steps", "1"]
        run = ab.complete(cli.build_parser(["ab"]).parse_args(argv))
        started = time.perf_counter()
        lines = run.planned_lines(1, 1)
        print(f"{blocks} blocks: {time.perf_counter() - started:.2f} s; {lines[-1][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
