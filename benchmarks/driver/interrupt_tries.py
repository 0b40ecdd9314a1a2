"""Ctrl-C and SIGTERM at each phase of the main job, many times: how each stop ended.

Each try starts `rl-trainer-bench ab` (the main job: its own arguments after `--`) in a process
of its own, waits for a phase to begin (its line in the job's output), waits a drawn time in it
and signals: SIGINT, SIGTERM, or SIGINT twice. It records the exit code, the time from the signal
to the exit, every line the process printed after the signal and whether `ab.json` was left
marked incomplete, and calls a try clean when the code is the signal's (130, 143), every line
after the signal is the bench's own, one a signal at most (one for a single signal; a second one
that comes after the first's line may add its own), and nothing of the runtime's follows them (an
abort, a core, a traceback). The results file is rewritten after every try, so a stopped sweep keeps its tries.

Phases: `compile`, the engine's programs compiling side by side, with JAX's compilation cache
off so every try compiles; `steps`, the scored steps, with the environment's cache
(JAX_COMPILATION_CACHE_DIR) or one of the sweep's own, so at most the first try of that phase
compiles.

    PYTHONPATH=. python benchmarks/driver/interrupt_tries.py --tries 50 --output tries.json -- --steps 1

Remakes BENCHMARKS.md's row on clean stops; benchmarks/reports/clean-stops_cpu-v5e_2026-12-06.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rl_trainer_bench.io import check_output_file, write_text_atomically  # after the path set-up

PHASE_LINES = {"compile": "compiling bench1", "steps": "(scored)"}
# (phase, signals), in turn: each phase gets each way of stopping
ROTATION = [
    ("compile", [signal.SIGINT]),
    ("steps", [signal.SIGINT]),
    ("compile", [signal.SIGTERM]),
    ("steps", [signal.SIGTERM]),
    ("compile", [signal.SIGINT, signal.SIGINT]),
    ("steps", [signal.SIGINT, signal.SIGINT]),
]
STEPS_WAIT_S = 1.0  # the longest wait into the scored steps: a step of cpu-tiny, half of the chip's
CRASH_WORDS = ("terminate called", "FATAL", "Fatal Python error", "Traceback", "core dumped")


def one_try(
    ab_args: list[str], phase: str, signals: list[int], wait_s: float, cache: Path, folder: Path
) -> dict:
    """One `ab` signalled `wait_s` into `phase`: what it printed after, and how it ended."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if phase == "compile":  # cold: neither JAX's cache nor the bench's default one
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        env["COMPILE_CACHE"] = "off"
    else:  # the environment's cache where it names one (a warm one spares the chip a compile)
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))
    command = [sys.executable, "-m", "rl_trainer_bench.cli", "ab", *ab_args, "--out", str(folder)]
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    reached = None
    for line in process.stdout:
        if PHASE_LINES[phase] in line:
            reached = time.monotonic() - started
            break
    if reached is not None:
        time.sleep(wait_s)
        for signum in signals:
            process.send_signal(signum)
            time.sleep(0.05)
    signalled = time.monotonic()
    after, _ = process.communicate()
    said = [line for line in after.splitlines() if not line.startswith(("[ab", "[TrainerBench]"))]
    code = process.returncode
    report = folder / "ab.json"
    incomplete = json.loads(report.read_text()).get("incomplete") if report.exists() else None
    clean = (
        reached is not None
        and code == 128 + signals[0]
        and 1 <= len(said) <= len(signals)  # a second signal may add its own line
        and all(line.startswith("rl-trainer-bench ab: ") for line in said)
        and not any(word in after for word in CRASH_WORDS)
    )
    return {
        "phase": phase,
        "signals": [signal.Signals(signum).name for signum in signals],
        "phase_reached_s": None if reached is None else round(reached, 2),
        "wait_in_phase_s": round(wait_s, 2),
        "exit_code": code,
        "exit_after_signal_s": round(time.monotonic() - signalled, 3),
        "lines_after_signal": said,
        "ab_json_incomplete": incomplete,
        "clean": clean,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=50, help="how many tries (default 50)")
    parser.add_argument(
        "--phases",
        default="compile,steps",
        help="the phases to signal in, comma-separated (compile, steps; default both)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the draw of the waits (default 0)")
    parser.add_argument(
        "--compile-wait",
        type=float,
        default=3.0,
        help="the longest wait into the compile before signalling, seconds (default 3: cpu-tiny's"
        " compile; the chip's preset compiles for about 85 s)",
    )
    parser.add_argument("--output", required=True, help="the results file (JSON)")
    parser.add_argument("ab_args", nargs="*", help="the main job's arguments, after --")
    args = parser.parse_args()
    phases = args.phases.split(",")
    if args.tries < 1 or not phases or not set(phases) <= set(PHASE_LINES) or args.compile_wait < 0:
        parser.error(
            f"--tries takes 1 or more, --phases a list of {', '.join(PHASE_LINES)},"
            " --compile-wait 0 or more"
        )
    output = check_output_file(args.output, "--output")
    rotation = [each for each in ROTATION if each[0] in phases]
    draw = random.Random(args.seed)
    tries = []
    with tempfile.TemporaryDirectory(prefix="interrupt-tries-") as scratch:
        for index in range(args.tries):
            phase, signals = rotation[index % len(rotation)]
            longest = args.compile_wait if phase == "compile" else STEPS_WAIT_S
            folder = Path(scratch) / f"try-{index}"
            result = one_try(
                args.ab_args,
                phase,
                signals,
                draw.uniform(0, longest),
                Path(scratch) / "cache",
                folder,
            )
            tries.append(result)
            print(json.dumps(result), flush=True)
            summary = {
                "command": ["rl-trainer-bench", "ab", *args.ab_args],
                "tries": len(tries),
                "clean": sum(each["clean"] for each in tries),
                "runs": tries,
            }
            write_text_atomically(output, json.dumps(summary, indent=1) + "\n")
    print(f"{summary['clean']} of {len(tries)} tries clean; wrote {output}")
    return 0 if summary["clean"] == len(tries) else 1


if __name__ == "__main__":
    sys.exit(main())
