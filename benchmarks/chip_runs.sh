#!/usr/bin/env bash
# The one-chip v5e figures BENCHMARKS.md takes from the chip, one part per call, each well inside
# ten minutes, in the order given (estimates for tpu-v5e-1 on one v5e chip: its three programs
# compile in about 2 minutes cold, a step takes about 2 s, opening the chip 6 to 15 s):
#   headline  ~8 min  chip_headline.py, STAGE off then on, each with MEASURE_PEAK (its bisection,
#                     then the dumping compile of aot's figures, about 2 minutes each), aot's
#                     figures from the CPU host's reports (benchmarks/results)
#   ab        ~3 min  README's main job as a user runs it (`ab`, no preset), warm from the cache
#   peak-test ~3 min  the chip test of the measured peak (its run warm, its dumping compile cold)
#   tests     ~8 min  every chip-marked test (`-m tpu_chip`), README's command
#   sweep     ~2 min a size  chip_fit_sweep.py's runs, aot's verdicts from the CPU host's sweep;
#                     ROWS picks the sizes (default 3,5,6: 4 is the preset's own run)
#   aot-host  ~3 min  `aot --target local` under /usr/bin/time, beside the host memory of a
#                     process that only opens the chip, to split aot's 18 GiB on the chip host
# JAX's persistent compilation cache (.xla-cache in the checkout, kept between calls while the
# host is) lets a later part load what an earlier one compiled; each part says which compiles
# were cold. Results land in OUT/<part>.tar.gz (logs, JSON, tables; not XLA's dumps) and its log.
# Usage: bash benchmarks/chip_runs.sh PART OUT
set -euo pipefail
part=${1:?PART: headline, ab, peak-test, tests, sweep or aot-host}
out=${2:?OUT: the folder the results go to}
cd "$(dirname "$0")/.."
export JAX_COMPILATION_CACHE_DIR=$PWD/.xla-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export PYTHONUNBUFFERED=1
mkdir -p "$JAX_COMPILATION_CACHE_DIR" "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=benchmarks/results
py=${PYTHON:-python3}
run_part() {
case $part in
  headline)
    "$py" benchmarks/chip_headline.py --out "$work/headline" --skip-ab --from-aot \
      "$results/2026-12-06-aot-tpu-v5e-1-splash-preset-v5e-1x1.json" \
      "$results/2026-12-06-aot-tpu-v5e-1-splash-preset-stage-on-v5e-1x1.json" ;;
  ab)
    "$py" benchmarks/chip_headline.py --out "$work/ab" --ab-only ;;
  peak-test)
    "$py" -m pytest -q -m tpu_chip tests/bench/test_device_peak_on_chip.py ;;
  tests)
    "$py" -m pytest -q -m tpu_chip tests/ ;;
  sweep)
    "$py" benchmarks/chip_fit_sweep.py --out "$work/sweep" --rows "${ROWS:-3,5,6}" \
      --from-aot "$results/2026-12-06-chip-fit-sweep-aot-tpu-v5e-1-splash-v5e-1x1.json" ;;
  aot-host)
    mkdir -p "$work/aot-host"
    /usr/bin/time -v "$py" -c "import resource, jax; print(jax.devices()); print('host peak of\
 a process that opened the chip:', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 'KiB')" \
      > "$work/aot-host/open-chip.log" 2>&1
    /usr/bin/time -v "$py" -m rl_trainer_bench.cli aot --preset tpu-v5e-1 --target local \
      --output "$work/aot-host/aot-local.json" > "$work/aot-host/aot-local.log" 2>&1 || true ;;
  *)
    echo "PART: headline, ab, peak-test, tests, sweep or aot-host, not $part" >&2
    exit 2 ;;
esac
}
run_part 2>&1 | tee "$out/$part.log"
if [ -d "$work/$part" ]; then
  tar -czf "$out/$part.tar.gz" -C "$work" --exclude=hlo "$part"
fi
ls -la "$out"
