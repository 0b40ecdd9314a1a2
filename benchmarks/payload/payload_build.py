"""How long the production cell's micro-batch takes to build on one core, and its peak memory.

Each measurement runs in a fresh child process pinned to one CPU with single-threaded BLAS/OpenMP,
so peak RSS (VmHWM) is the build's own. Three measurements:

- floor: allocate and fill an int16 array the size of `routed_experts` (np.full). On a virtual
  machine the first touch of fresh memory can dominate; this says how much of a build is that.
- build: `build_calibrated` for the preset, cold (first allocation of the process), then warm (a
  second micro-batch after the first was freed, so the memory is already backed).
- naive: the straightforward builder, `Generator.choice(E, K, replace=False, p=shares)` per token
  and layer, timed on a sample of tokens and extrapolated to the micro-batch's real tokens.

Usage: PYTHONPATH=. python benchmarks/payload/payload_build.py [--preset qwen3.5-397b-cell] [--repeats 2]

Remakes BENCHMARKS.md's payload suite; benchmarks/reports/payload-build_cpu_2026-11-30.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child_floor(preset_name: str) -> dict:
    import numpy as np

    from rl_trainer_bench.config.presets import preset

    engine = preset(preset_name).engine
    m = engine.model
    shape = (engine.micro_batch_rows, engine.seq_len, m.num_layers, m.top_k)
    start = time.perf_counter()
    routed = np.full(shape, -1, np.int16)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bytes": routed.nbytes, "peak_rss": _peak_rss_bytes()}


def child_build(preset_name: str) -> dict:
    from rl_trainer_bench.config.presets import preset
    from rl_trainer_bench.payload.build import build_calibrated
    from rl_trainer_bench.payload.routing_profile import load_profile

    engine = preset(preset_name).engine
    profile = load_profile(None)
    cold = build_calibrated(engine, profile, seed=0, index=0)
    nbytes, real = cold.payload.nbytes, int((cold.payload.segment_ids > 0).sum())
    missed, cold_seconds = cold.calibration.missed_layers, cold.seconds
    cold_peak = _peak_rss_bytes()
    del cold
    warm = build_calibrated(engine, profile, seed=0, index=1)
    return {
        "cold_seconds": cold_seconds,
        "warm_seconds": warm.seconds,
        "bytes": nbytes,
        "real_tokens": real,
        "cold_peak_rss": cold_peak,
        "missed_layers": missed,
    }


def child_naive(preset_name: str, sample_tokens: int) -> dict:
    import numpy as np

    from rl_trainer_bench.config.presets import preset
    from rl_trainer_bench.payload.routing_profile import fit_to_model, load_profile

    engine = preset(preset_name).engine
    m = engine.model
    shares = fit_to_model(load_profile(None), m).shares
    rng = np.random.default_rng(0)
    out = np.empty((sample_tokens, m.num_layers, m.top_k), np.int16)
    start = time.perf_counter()
    for token in range(sample_tokens):
        for layer in range(m.num_layers):
            out[token, layer] = rng.choice(m.num_experts, m.top_k, replace=False, p=shares[layer])
    seconds = time.perf_counter() - start
    return {"seconds_per_token": seconds / sample_tokens, "sample_tokens": sample_tokens}


def run_child(mode: str, preset_name: str, extra: list[str]) -> dict:
    env = {**os.environ, **SINGLE_THREAD, "PYTHONPATH": os.getcwd()}
    command = [sys.executable, __file__, "--child", mode, "--preset", preset_name, *extra]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-397b-cell")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--naive-tokens", type=int, default=200)
    parser.add_argument("--out", default="benchmarks/results/payload_build.json")
    parser.add_argument("--child", choices=("floor", "build", "naive"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
        if args.child == "floor":
            result = child_floor(args.preset)
        elif args.child == "build":
            result = child_build(args.preset)
        else:
            result = child_naive(args.preset, args.naive_tokens)
        print(json.dumps(result))
        return 0

    runs = {"floor": [], "build": []}
    for _ in range(args.repeats):  # build first: it pays any first-touch cost, not the floor
        runs["build"].append(run_child("build", args.preset, []))
        runs["floor"].append(run_child("floor", args.preset, []))
    naive = run_child("naive", args.preset, ["--naive-tokens", str(args.naive_tokens)])
    build = runs["build"]
    gb = build[0]["bytes"] / 1e9
    naive_seconds = naive["seconds_per_token"] * build[0]["real_tokens"]
    summary = {
        "preset": args.preset,
        "micro_batch_gb": gb,
        "floor_seconds": [r["seconds"] for r in runs["floor"]],
        "cold_build_seconds": [r["cold_seconds"] for r in build],
        "warm_build_seconds": [r["warm_seconds"] for r in build],
        "peak_rss_over_micro_batch": [r["cold_peak_rss"] / r["bytes"] for r in build],
        "naive_extrapolated_seconds": naive_seconds,
        "naive_sample_tokens": naive["sample_tokens"],
        "naive_over_warm_build": naive_seconds / min(r["warm_seconds"] for r in build),
        "calibration_missed_layers": [r["missed_layers"] for r in build],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(args.out), suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(summary, out, indent=1)
    os.replace(temporary, args.out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
