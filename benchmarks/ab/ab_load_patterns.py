"""False positives and power of the default `rl-trainer-bench ab` on cpu-tiny's own engine, under
the load patterns of a shared host.

Every experiment is the `ab` command's own code path (`ab.run`: run order, driver loop, exact
checks, score, report files) with its defaults, on the built-in JAX engine of cpu-tiny. The bench is
built and compiled once and shared by every experiment (the compile is off the clock in `ab` too),
so one experiment costs its steps only. Kinds:

    A/A     --arms off,same:STAGE_BEFORE_UPDATE=off   both settings the same
    zero    --arms off,on (the default)               a 20 KB staged copy: no effect a CPU can show
    slow    --arms off,on, and every step of an `on` arm sleeps --slow-ms more inside update():
            a known slowdown of that size (each of a comma list), which the verdict should call
            SLOWER

Loads: `ends` starts --burners busy processes (SIGCONT) for the first and last quarter of each
experiment's arms and pauses them (SIGSTOP) in the middle: a load heavier at the ends than in the
middle, the pattern that defeats a mirrored order; `as-it-comes` adds nothing (the host's other
work; the load average is recorded with every run). Designs: `default` (the command's defaults)
and `mirrored` (`--order mirrored --steps 8`, the earlier default) for comparison.

    PYTHONPATH=. python benchmarks/ab/ab_load_patterns.py --runs 20 --loads ends,as-it-comes

Per-run results go to --out (JSON, rewritten atomically after every run): the verdict, the delta
and its interval, each block's difference (the interval's units), the drawn schedule seed and the
blocks' orientations, and the load average before and after. `--rescore FILE --confidence C`
scores the recorded block differences of FILE's runs again at another confidence (same rule: the
t interval excludes 0 and |delta| > the 2% min effect) and prints the claims per condition, with
the median half-width of the interval: what another level would have said about the same runs.

Remakes BENCHMARKS.md's ab suite (the CPU design's false positives under load);
benchmarks/reports/ab-load-patterns_cpu_2026-12-03.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the stand-in's work: one BLAS thread, as
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # in ab_error_rates.py

import argparse
import contextlib
import io
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ab_error_rates import cpu_work

from rl_trainer_bench import cli
from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from stand_in_engine import TimedEngine, stand_in_pool

KINDS = {"A/A": "off,same:STAGE_BEFORE_UPDATE=off", "zero": "off,on", "slow": "off,on"}
DESIGNS = {"default": [], "mirrored": ["--order", "mirrored", "--steps", "8"]}
CLAIMS = ("FASTER", "SLOWER")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "ab_load_patterns.json"


class Burners:
    """Busy processes, paused until `load(True)`: the synthetic load."""

    def __init__(self, count: int):
        code = "while True: pass"
        self.pids = [subprocess.Popen([sys.executable, "-c", code]).pid for _ in range(count)]
        self.load(False)

    def load(self, on: bool) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT if on else signal.SIGSTOP)

    def close(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)


class SharedBench:
    """One compiled Bench for every experiment; the burners follow the arm's place in the run, and
    a `slow` experiment's staged arms sleep in update()."""

    def __init__(self, burners: Burners | None, stand_in_call_ms: float | None):
        self.stand_in_call_ms = stand_in_call_ms
        self.bench: Any = None
        self.log: Callable[[str], None] = print
        self.burners = burners
        self.arms = 0  # arms in the current experiment
        self.arm = 0  # arms started so far in it
        self.slow_s = 0.0

    def factory(self, plan, log):
        from rl_trainer_bench.bench.driver import Bench

        self.log = log
        if self.bench is None and self.stand_in_call_ms is None:
            self.bench = Bench(plan.config, lambda line: self.log(line), engine_config=plan.engine)
        elif self.bench is None:
            work = cpu_work(self.stand_in_call_ms)
            self.bench = Bench(
                plan.config,
                lambda line: self.log(line),
                engine_config=plan.engine,
                engine_factory=lambda _: TimedEngine(work),
                pool=stand_in_pool(3),
            )
        return self

    def build(self, stages) -> None:
        if self.bench.worker is None:
            self.bench.build(stages)
            self.compile_s = self.bench.compile()
            update = self.bench.engine.update
            self.slowing = False

            def slowed_update(*args, **kwargs):
                if self.slowing:
                    time.sleep(self.slow_s)
                return update(*args, **kwargs)

            self.bench.engine.update = slowed_update

    def compile(self) -> dict[str, float]:
        return self.compile_s

    def run(self, **kwargs):
        ends = self.arm < self.arms / 4 or self.arm >= self.arms * 3 / 4
        if self.burners is not None:
            self.burners.load(ends)
        self.slowing = self.slow_s > 0 and kwargs["stage"].before_update
        self.arm += 1
        try:
            return self.bench.run(**kwargs)
        finally:
            if self.burners is not None:
                self.burners.load(False)

    def close(self) -> None:
        """Kept open for the next experiment."""


def one_ab(shared: SharedBench, kind: str, design: str, slow_ms: float) -> dict[str, Any]:
    arms = KINDS[kind]
    argv = ["ab", "--arms", arms, *DESIGNS[design]]
    if shared.stand_in_call_ms is not None:
        argv += ["--knob", "MICRO_STEPS=2"]  # the stand-in pool's shape, as ab_error_rates.py
    args = cli.build_parser(["ab"]).parse_args([*argv, "--out", "unused"])
    order = args.order
    shared.arms = len(ab_arms.parse_arms(arms, order))
    shared.arm = 0
    shared.slow_s = slow_ms / 1e3 if kind == "slow" else 0.0
    load_before = os.getloadavg()[0]
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        args.out = Path(folder) / "ab"
        with contextlib.redirect_stdout(io.StringIO()):
            code = ab.run(args, make_bench=shared.factory)
        report = json.loads((args.out / "ab.json").read_text())
    (delta,) = report["score"]["deltas"]
    differences = report["score"]["block_differences_s"].get(delta["name"], [])
    return {
        "kind": kind,
        "design": design,
        "slow_ms": shared.slow_s * 1e3,
        "exit": code,
        "verdict": report["verdict"],
        "delta_ms": delta["delta_s"] * 1e3,
        "delta_pct": delta["delta_pct"],
        "ci_ms": [delta["ci_low_s"] * 1e3, delta["ci_high_s"] * 1e3],
        "baseline_median_ms": delta["baseline_median_s"] * 1e3,
        "score_design": report["score"]["design"],
        "confidence": report["score"]["confidence"],
        "schedule_seed": report["settings"]["schedule_seed"],
        "block_orientations": report.get("block_orientations"),
        "block_differences_ms": [d * 1e3 for d in differences],
        "seconds": time.time() - started,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def summarise(runs: list[dict]) -> dict[str, Any]:
    """Claims (FASTER/SLOWER) per load, design and kind: false positives for A/A and zero, the
    detection rate (SLOWER) for slow."""
    out: dict[str, Any] = {}
    for run in runs:
        slow = f" {run['slow_ms']:g} ms" if run["kind"] == "slow" else ""
        key = f"{run['load']} / {run['design']} / {run['kind']}{slow}"
        entry = out.setdefault(key, {"runs": 0, "claims": 0, "slower": 0, "verdicts": {}})
        entry["runs"] += 1
        entry["claims"] += run["verdict"] in CLAIMS
        entry["slower"] += run["verdict"] == "SLOWER"
        entry["verdicts"][run["verdict"]] = entry["verdicts"].get(run["verdict"], 0) + 1
    return out


def _kinds(kinds: str, slow_ms: str) -> list[tuple[str, float]]:
    """Each kind with its slowdown: `slow` once per value of --slow-ms, the others with none."""
    return [
        (kind, float(ms))
        for kind in kinds.split(",")
        for ms in (slow_ms.split(",") if kind == "slow" else ["0"])
    ]


def rescore(path: Path, confidence: float) -> dict[str, Any]:
    """Claims per condition had the blocks' t interval been at `confidence` (runs with block
    differences only), and each condition's median interval half-width in ms."""
    import numpy as np
    from scipy import stats

    out: dict[str, Any] = {}
    for run in json.loads(path.read_text())["runs"]:
        units = np.asarray(run.get("block_differences_ms") or [], dtype=np.float64)
        if len(units) < 2:
            continue
        half = stats.t.ppf(0.5 + confidence / 2, len(units) - 1) * stats.sem(units)
        mean, bar = float(units.mean()), 0.02 * run["baseline_median_ms"]
        claim = abs(mean) > half and abs(mean) > bar
        slow = f" {run['slow_ms']:g} ms" if run["kind"] == "slow" else ""
        entry = out.setdefault(f"{run['kind']}{slow}", {"runs": 0, "claims": 0, "half_ms": []})
        entry["runs"] += 1
        entry["claims"] += int(claim)
        entry["half_ms"].append(float(half))
    for entry in out.values():
        entry["half_ms"] = round(float(np.median(entry["half_ms"])), 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per load, design and kind")
    parser.add_argument("--loads", default="ends,as-it-comes")
    parser.add_argument("--kinds", default="zero,A/A,slow")
    parser.add_argument("--designs", default="default")
    parser.add_argument("--slow-ms", default="10", help="slow kind: ms per step, comma list")
    parser.add_argument("--slow-every", type=int, default=1, help="slow runs on every Nth index")
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--engine", choices=["real", "stand-in"], default="real")
    parser.add_argument("--call-ms", type=float, default=25.0, help="stand-in: work per fwd_bwd")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rescore", type=Path, help="score FILE's recorded runs again, run none")
    parser.add_argument("--confidence", type=float, default=0.95, help="with --rescore")
    args = parser.parse_args()
    if args.rescore is not None:
        print(json.dumps(rescore(args.rescore, args.confidence), indent=1))
        return 0
    from rl_trainer_bench.bench.distributed import start_for_preset
    from rl_trainer_bench.config import knobs

    start_for_preset(knobs.preset("cpu-tiny").host_devices)
    print(f"engine {args.engine}, load average {os.getloadavg()}", flush=True)
    runs: list[dict] = []
    started = time.time()
    shared = SharedBench(None, None if args.engine == "real" else args.call_ms)
    for load in args.loads.split(","):
        burners = Burners(args.burners) if load == "ends" else None
        shared.burners = burners
        try:
            for index in range(args.runs):  # kinds and designs take turns: load changes hit all
                for kind, slow_ms in _kinds(args.kinds, args.slow_ms):
                    if kind == "slow" and index % args.slow_every:
                        continue
                    for design in args.designs.split(","):
                        result = {
                            "load": load,
                            "index": index,
                            **one_ab(shared, kind, design, slow_ms),
                        }
                        runs.append(result)
                        content = {
                            "args": vars(args) | {"out": str(args.out)},
                            "summary": summarise(runs),
                            "runs": runs,
                        }
                        write_text_atomically(args.out, json.dumps(content, indent=1) + "\n")
                        print(
                            f"[{time.time() - started:6.0f}s] {load} {design} {kind}: {result['verdict']} "
                            f"delta {result['delta_ms']:+.2f} ms ({result['delta_pct']:+.1f}%) "
                            f"CI [{result['ci_ms'][0]:+.2f}, {result['ci_ms'][1]:+.2f}] "
                            f"{result['seconds']:.0f}s load {result['load_before']:.1f}",
                            flush=True,
                        )
        finally:
            if burners is not None:
                burners.close()
    print(json.dumps(summarise(runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
