#!/usr/bin/env bash
# README's main job (`rl-trainer-bench ab`, no flags) run twice as a user runs it, with a compile
# cache of its own that starts empty: the first run compiles and keeps its programs, the second
# loads them. Prints each run's wall seconds, compile lines, cache line and verdict, and writes
# OUT/first.log, OUT/second.log and OUT/first/, OUT/second/ (the A/B's files). On a host with one
# TPU chip it times the chip's preset, elsewhere cpu-tiny on the CPU. Remakes BENCHMARKS.md's
# "The main job on the CPU, run twice" row (benchmarks/reports/compile-cache_cpu_2026-12-07.md).
# Usage: bash benchmarks/ab/main_job_twice.sh OUT   (PYTHON: the interpreter, default python3)
set -euo pipefail
out=${1:?OUT: a folder for the logs, the A/B files and the compile cache}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
rm -rf "$out/compile-cache"
export COMPILE_CACHE=$out/compile-cache PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
for run in first second; do
  started=$(date +%s.%N)
  status=0
  "$py" -m rl_trainer_bench.cli ab --out "$out/$run" > "$out/$run.log" 2>&1 || status=$?
  ended=$(date +%s.%N)
  echo "$run: wall $(awk "BEGIN { printf \"%.1f\", $ended - $started }") s, exit $status"
  grep -E "compile (program|wall)|compile cache: hits|^verdict" "$out/$run.log" | sed 's/^/  /' || true
done
