"""Error rates of the A/B verdicts: how often nothing-changed is called FASTER or SLOWER, and the
smallest known effect each design finds at least 80% of the time.

Every experiment is a full `rl-trainer-bench ab` run (the command's own code path: run order or
schedule, driver loop, exact checks, score, report files) on the stand-in engine of the tests
(tests/stand_in_engine.py, `TimedEngine`), whose fwd_bwd does a fixed amount of real CPU work (a
chain of small float64 matmuls, calibrated once to `--call-ms`), so the step times carry this
machine's own noise and drift under whatever else runs on it. Designs:

    block        --order block        off, on, off', on'
    mirrored     --order mirrored     off, on, on', off' (the default until 2026-12-03)
    interleaved  --design interleaved one run, boundaries switched on a seeded schedule
    blocks       --order blocks --stop budget    6 blocks ABBA/BAAB, judged once (the CPU default)
    sequential   --order blocks --stop settled   the same, stopped at the first settled look

A/A: the two settings are the same (`off` against `same:STAGE_BEFORE_UPDATE=off`), so any FASTER
or SLOWER is a false positive. Known effect: `off` against `on` with an engine whose first fwd_bwd
after an update sleeps `delay` more when its input was not staged; a run detects it when the
verdict is FASTER. Usage (about 10-15 minutes on a shared 2-core host):

    PYTHONPATH=. python benchmarks/ab/ab_error_rates.py --aa-runs 20 --effect-runs 10

Raw per-run results go to benchmarks/results/ab_error_rates.json.

Remakes BENCHMARKS.md's ab suite; benchmarks/reports/ab-error-rates_cpu_2026-12-01.md,
benchmarks/reports/ab-sequential-half-block_simulated_2026-12-05.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread: the work is the same each call
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from stand_in_engine import StandInEngine, TimedEngine, stand_in_pool

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.bench.distributed import start_for_preset
from rl_trainer_bench.bench.driver import Bench

DESIGNS = {
    "block": ["--order", "block"],
    "mirrored": ["--order", "mirrored"],
    "interleaved": ["--design", "interleaved"],
    "blocks": ["--order", "blocks", "--stop", "budget"],
    "sequential": ["--order", "blocks", "--stop", "settled"],
}
AA_ARMS = "off,same:STAGE_BEFORE_UPDATE=off"
EFFECT_ARMS = "off,on"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "ab_error_rates.json"


def cpu_work(call_ms: float) -> Callable[[int], None]:
    """Real CPU work of about `call_ms` on an idle core: a chain of 64 x 64 matmuls."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)) / 8

    def chain(n: int) -> None:
        x = a
        for _ in range(n):
            x = np.tanh(x @ a)

    timings = []
    for _ in range(20):  # the fastest of 20: the core's own speed, not the load of the moment
        started = time.perf_counter()
        chain(200)
        timings.append((time.perf_counter() - started) / 200)
    count = max(1, round(call_ms / 1e3 / min(timings)))
    return lambda _call: chain(count)


def one_ab(design: str, arms: str, engine: Callable[[], StandInEngine], steps: int, seed: int):
    """One `ab` run; returns its verdict and delta (the report's figures)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "ab"
        argv = ["ab", "--arms", arms, "--steps", str(steps), "--knob", "MICRO_STEPS=2"]
        argv += [*DESIGNS[design], "--schedule-seed", str(seed), "--out", str(out)]
        args = cli.build_parser(["ab"]).parse_args(argv)

        def make_bench(plan, log):
            return Bench(
                plan.config,
                log,
                engine_config=plan.engine,
                engine_factory=lambda _: engine(),
                pool=stand_in_pool(3),
            )

        with contextlib.redirect_stdout(io.StringIO()):
            code = ab.run(args, make_bench=make_bench)
        report = json.loads((out / "ab.json").read_text())
    (delta,) = report["score"]["deltas"]
    return {
        "design": design,
        "exit": code,
        "verdict": report["verdict"],
        "delta_ms": delta["delta_s"] * 1e3,
        "delta_pct": delta["delta_pct"],
        "ci_ms": [delta["ci_low_s"] * 1e3, delta["ci_high_s"] * 1e3],
        "noise_floor_ms": (report["score"]["noise_floor_s"] or 0.0) * 1e3,
        "drift_moved_ms": report["score"]["drift"]["moved_s"] * 1e3,
        "baseline_median_ms": delta["baseline_median_s"] * 1e3,
        "scored_steps": sum(not r["warmup"] for a in report["arms"] for r in a["records"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa-runs", type=int, default=20)
    parser.add_argument("--effect-runs", type=int, default=10)
    parser.add_argument("--delays-ms", default="0.5,1,2,4,8")
    parser.add_argument("--call-ms", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--designs", default=",".join(DESIGNS))
    args = parser.parse_args()
    designs = args.designs.split(",")
    delays = [float(d) for d in args.delays_ms.split(",")]
    work = cpu_work(args.call_ms)
    start_for_preset(cli_preset().host_devices)
    started = time.time()
    runs = []

    def record(kind: str, delay_ms: float, result: dict) -> None:
        runs.append({"kind": kind, "delay_ms": delay_ms, **result})
        write(args, runs, summarise(runs, designs, delays))  # a stopped run keeps what it measured
        print(
            f"[{time.time() - started:6.0f}s] {kind} delay={delay_ms}ms {result['design']}: "
            f"{result['verdict']} delta {result['delta_ms']:+.2f} ms ({result['delta_pct']:+.1f}%)",
            flush=True,
        )

    for index in range(args.aa_runs):  # designs alternate, so load changes hit them alike
        for design in designs:
            record(
                "A/A", 0.0, one_ab(design, AA_ARMS, lambda: TimedEngine(work), args.steps, index)
            )
    for index in range(args.effect_runs):
        for delay in delays:
            for design in designs:
                engine = lambda d=delay: TimedEngine(work, boundary_delay_s=d / 1e3)  # noqa: E731
                record("effect", delay, one_ab(design, EFFECT_ARMS, engine, args.steps, index))
    summary = summarise(runs, designs, delays)
    print(json.dumps(summary, indent=1))
    write(args, runs, summary)
    return 0


def write(args: argparse.Namespace, runs: list[dict], summary: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"args": vars(args), "summary": summary, "runs": runs}, indent=1) + "\n"
    )


def summarise(runs: list[dict], designs: list[str], delays: list[float]) -> dict:
    """False-positive rate per design; detection rate per design and delay; the smallest delay
    detected in at least 80% of runs."""
    out = {}
    for design in designs:
        aa = [r for r in runs if r["kind"] == "A/A" and r["design"] == design]
        false = [r for r in aa if r["verdict"] in ("FASTER", "SLOWER")]
        detection = {}
        for delay in delays:
            effect = [
                r
                for r in runs
                if r["kind"] == "effect" and r["design"] == design and r["delay_ms"] == delay
            ]
            found = [r for r in effect if r["verdict"] == "FASTER"]
            detection[str(delay)] = f"{len(found)}/{len(effect)}"
        smallest = next(
            (
                d
                for d in delays
                if _fraction(detection[str(d)]) >= 0.8
                and all(_fraction(detection[str(e)]) >= 0.8 for e in delays if e > d)
            ),
            None,
        )
        out[design] = {
            "aa_false_positive": f"{len(false)}/{len(aa)}",
            "aa_verdicts": {v: sum(r["verdict"] == v for r in aa) for v in _verdicts(aa)},
            "aa_median_abs_delta_ms": float(np.median([abs(r["delta_ms"]) for r in aa]))
            if aa
            else None,
            "detected_faster": detection,
            "smallest_delay_detected_80pct_ms": smallest,
            "median_step_ms": float(np.median([r["baseline_median_ms"] for r in aa]))
            if aa
            else None,
            "mean_scored_steps_aa": float(np.mean([r["scored_steps"] for r in aa])) if aa else None,
        }
    return out


def _fraction(text: str) -> float:
    found, total = (int(x) for x in text.split("/"))
    return found / total if total else 0.0


def _verdicts(runs: list[dict]) -> list[str]:
    return sorted({r["verdict"] for r in runs})


def cli_preset():
    from rl_trainer_bench.config import knobs

    return knobs.preset("cpu-tiny")


if __name__ == "__main__":
    sys.exit(main())
