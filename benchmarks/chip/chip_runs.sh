#!/usr/bin/env bash
# The one-chip v5e figures BENCHMARKS.md takes from the chip, part by part, in the order given;
# one call runs the parts named, each writing OUT/<part>.log and OUT/<part>.tar.gz (logs, JSON,
# tables; not XLA's dumps). Estimates for tpu-v5e-1 on one v5e chip (its three programs compile in
# about 85 s cold, side by side, a step takes about 2 s, opening the chip 8-9 s; INFERRED from those
# and the chip's runs in BENCHMARKS.md):
#   headline-off  ~5.5 min  chip_headline.py with STAGE off and MEASURE_PEAK: the preset's cold
#                     compile, 7 traced steps, the bisection (about 8 probe steps), then the
#                     dumping compile of aot's figures of the same programs (about 2 minutes),
#                     then `aot --target local` (two more compiles, about 3 minutes)
#   headline-on   ~5.5 min  the same with STAGE on: the same programs, loaded warm from the cache
#   ab        ~3 min  README's main job as a user runs it (`ab`, no preset), warm from the cache
#   peak-test ~3 min  the chip test of the measured peak (its run warm, its dumping compile cold)
#   tests     ~3.5 min README's chip-test command (`python -m pytest -q -m tpu_chip tests/`), every
#                     chip test in one call: the measured peak (the preset's run and aot's figures,
#                     cold: 95 s), then the kernels' tests at the smallest shapes that check each
#                     (13-25 s each; 207.5 s in all, MEASURED 2026-12-08); it prints each test's time
#                     (`--durations=0`)
#   kernel-tests ~2 min the kernels' chip tests alone, all but the measured peak: a contributor's
#                     check of a kernel change (INFERRED from `tests`)
#   sweep     ~1.8 min a size  chip_fit_sweep.py's runs, aot's verdicts from the CPU host's sweep;
#                     ROWS picks the sizes (default 3,5,6: 4 is the preset's own run)
#   aot-host  ~3 min  `aot --target local` (its JSON has its host peak) beside the host peak of
#                     a process that only opens the chip, to split aot's 18 GiB on the chip host
#   effects   ~4.5 min  two A/Bs of README's design with known extra work in one arm, about 1%
#                     and 7.2% of the step (3 and 31 matmuls of 4096 a call, by the 1.1-1.6 ms a
#                     matmul a step measured at 4, 7 and 26 a call: INFERRED sizes)
#   remat     ~4 min  the built-in engine's `remat_policy` full vs minimal on the preset (aot: minimal
#                     FITS at 14.74 GiB; its recomputation saved is the chip's to measure)
#   chunk     ~4 min  the Gated DeltaNet's chunk of 64 tokens against 128 on the preset
#                     (`linear_chunk_size`: half as many scan steps, a [C, C] term as wide as a
#                     vector register's 128 lanes, twice the work a chunk)
#   inverse   ~5 min  the Gated DeltaNet's triangular inverse by XLA and by the Pallas kernel
#                     (`linear_chunk_inverse`): alone (chunk_inverse_on_chip.py, seconds), its chip
#                     test, then an A/B of the two on the preset (two cold compiles side by side)
#   gdn-kernel ~6.5 min the Gated DeltaNet's chunked rule by XLA and by the Pallas kernels
#                     (`linear_chunk_kernel`): the rule alone at 1, 2 and 4 heads a kernel program
#                     (delta_rule_kernel_on_chip.py, ~2 min), an A/B of the two on the preset (two
#                     cold compiles one after the other, ~2.5 min), then each way's first two steps
#                     from the initial parameters, warm from the cache: the loss both ways (~1 min);
#                     the kernels' chip test (200 s measured) runs in `tests`
#   prefuse   ~4.5 min `prefuse_moe_weights` off and on, an A/B on the preset and the loss both ways,
#                     as gdn-kernel's
#   gate-up   ~6 min  `keep_moe_gate_up` off and on (the MoE's gate and up outputs formed again in
#                     the backward pass, or kept), an A/B on the preset and the loss both ways, as
#                     gdn-kernel's
#   keep-rule ~6 min  `keep_delta_rule_outputs` off and on (the delta rule's forward kernel run again
#                     in the backward pass, or its results kept), an A/B on the preset and the loss
#                     both ways, as gdn-kernel's
#   scan-layers ~6 min `scan_layers` true and false (the layers scanned, or one after another), an
#                     A/B on the preset and the loss both ways, as gdn-kernel's
#   conv      ~5 min  the Gated DeltaNet's short convolutions by XLA and by the Pallas kernels
#                     (`linear_conv_kernel`): alone (conv_kernel_on_chip.py, 4 small compiles),
#                     then an A/B on the preset and the loss both ways, as gdn-kernel's
#   ragged    ~3 min  the MoE's sorted pairs through the grouped-matmul kernel against XLA's
#                     ragged_dot (`expert_compute` sorted_gmm and sorted_ragged_dot, the same
#                     layout), an A/B on the preset and the loss both ways, as gdn-kernel's (169 s
#                     measured: ragged_dot 41 ms slower)
#   head      ~4 min  the output head's gradient formed in the forward pass against the backward's
#                     (`logps_gradient` saved_lse and in_forward: three matmuls of the head, not
#                     four), an A/B on the preset and the loss both ways, as gdn-kernel's (224 s
#                     measured: in_forward 41 ms faster, the preset's since)
#   heads     ~4.5 min the Gated DeltaNet kernels at two counts of value heads a program
#                     (`linear_chunk_kernel_heads`, HEADS, default "2 4"), an A/B on the preset and
#                     the loss both ways, as gdn-kernel's
#   peak      ~1.5 min the preset's run with MEASURE_PEAK (its bisection, about 8 probe steps) at
#                     engine flags PEAK_FLAGS (default none): its step, MFU and measured peak over 5
#                     scored steps, one turn of the pool (each of its 5 micro-batches trained 4
#                     times), warm from the cache where an A/B compiled its programs
#   matmul-chain ~1 min a chain of 16 dependent 128 x 128 matmuls a Pallas program at each matmul
#                     precision, beside XLA's (matmul_chain_on_chip.py: 5 small compiles)
#   gmm-tiling ~3 min the MoE's grouped matmuls alone at the engine's tiling and 8 others, and gate
#                     and up as one matmul of twice the width (gmm_tiling_on_chip.py: 27 small
#                     compiles, 21 calls each)
#   trace     ~3 min  the trace's cost table by engine function alone (chip_headline.py's run with
#                     STAGE on, 3 traced steps), no cache so every program is dumped, no peak or aot
#   rows      ~3.5 min the preset at ROWS rows a micro-batch (default 5) as trace's run, with
#                     MEASURE_PEAK (its bisection, about 8 probe steps): the step, MFU, measured
#                     peak and cost table at that size
#   builtin-mb1 ~2 min the built-in engine at the one size MaxText fits on the chip (1 row)
#   maxtext   ~9 min  MaxText's engine at that size through Tunix's worker (its compile about 200 s),
#                     then with MEASURE_PEAK through the adapter's own calls (MAXTEXT_DRIVER=maxtext:
#                     Tunix's worker ends at the first probe that does not fit; another 200 s
#                     compile); its interpreter is MAXTEXT_PYTHON, a venv of
#                     `maxtext_chip_wheels.sh install`
#   maxtext-peak ~5 min the second half of maxtext alone
#   maxtext-ab ~6 min MaxText's `remat_policy` full vs minimal at that size in one process (the
#                     full arm's programs from the cache the maxtext part filled)
#   boundary  ~2.3 min a size  README's main job (STAGE off vs on) at the preset's micro-batch
#                     with BOUNDARY_BYTES more host bytes in each (`extra_host_bytes`, bytes; unset:
#                     0, 64, 128, 256 and 512 MiB: aot's fit for each first), each size's programs
#                     a cold compile, then with BOUNDARY_SHORT_BYTES (unset: 512 MiB; empty: none) at
#                     MICRO_STEPS=2, the same programs from the cache, where the copy is a larger
#                     share of a shorter step; split the sizes over calls of ten minutes
#   interrupts ~4 min Ctrl-C and SIGTERM in the main job: 3 tries inside its compile (cold, up
#                     to 60 s in), 3 in its scored steps (warm from the cache `boundary` filled)
# JAX's persistent compilation cache (.xla-cache in the checkout, kept between calls while the
# host is) lets a later part load what an earlier one compiled; each part says which compiles
# were cold.
# Usage: bash benchmarks/chip/chip_runs.sh OUT PART...
#
# Remakes BENCHMARKS.md's chip rows, each naming its part; the chip rounds' reports,
# benchmarks/reports/chip-round-1_tpu-v5e_2026-12-06.md to chip-round-5.
set -euo pipefail
# The parts, in one list: the usage line and the check of the names given are both made from it
known_parts=(headline-off headline-on ab peak-test tests kernel-tests sweep aot-host effects remat
  chunk inverse gdn-kernel prefuse gate-up keep-rule scan-layers conv ragged head heads peak trace rows gmm-tiling matmul-chain
  builtin-mb1 maxtext maxtext-peak maxtext-ab boundary interrupts)
parts="${known_parts[*]}"
out=${1:?OUT: the folder the results go to}
shift
[ $# -gt 0 ] || { echo "PART: name one or more of $parts" >&2; exit 2; }
for part in "$@"; do
  known=""
  for name in "${known_parts[@]}"; do [ "$part" != "$name" ] || known=yes; done
  [ -n "$known" ] || { echo "PART: one of $parts, not $part" >&2; exit 2; }
done
cd "$(dirname "$0")/../.."
export JAX_COMPILATION_CACHE_DIR=$PWD/.xla-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # the checkout, after a JAX of the host
mkdir -p "$JAX_COMPILATION_CACHE_DIR" "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=benchmarks/results
py=${PYTHON:-python3}
# MaxText's keys that tpu-v5e-1 needs to reach MaxText at all, and the size it fits
# (docs/maxtext.md)
maxtext_flags=num_moe_token_chunks=1,ragged_buffer_factor=-1,train_micro_batch_size=1
maxtext_run() { "${MAXTEXT_PYTHON:?MAXTEXT_PYTHON: a venv of maxtext_chip_wheels.sh install}" \
  -m rl_trainer_bench.cli "$@"; }
# MEASURE_PEAK through the adapter's own calls: Tunix's worker ends at the first probe that does not fit
maxtext_peak() { MAXTEXT_DRIVER=maxtext maxtext_run run --preset tpu-v5e-1 --engine maxtext \
  --engine-flags "$maxtext_flags" --steps 2 --measure-peak on --results-dir "$1"; }
# KEY=VALUE ($2) on the preset, into $work/$1: the loss of its warm-up step (the initial parameters
# and the pool's first micro-batches, the same for every run of the preset's seed) and of the step after
first_losses() {
  local log="$work/$1/loss-${2#*=}.log"
  "$py" -m rl_trainer_bench.cli run --preset tpu-v5e-1 --engine-flags "$2" \
    --warmup-steps 1 --steps 1 --results-dir "$work/$1/loss-${2#*=}" > "$log" 2>&1 \
    || { tail -30 "$log"; return 1; }
  sed -n "s/.*\(step=[0-9]*\) \(warmup=[01]\) .* \(loss=[^ ]*\) .*/$2 \1 \2 \3/p" "$log"
}
# An A/B of KEY ($2) at VALUES ($3, $4) on the preset into $work/$1, then the loss each way; every
# command runs, the part fails if any did
ab_and_losses() {
  local status=0
  mkdir -p "$work/$1"
  local first=$3 second=$4  # an arm's name starts with a letter: v2 for the value 2
  [[ $first =~ ^[A-Za-z] ]] || first=v$first
  [[ $second =~ ^[A-Za-z] ]] || second=v$second
  "$py" -m rl_trainer_bench.cli ab --arms "$first:$2=$3,$second:$2=$4" --out "$work/$1/ab" || status=1
  for value in "$3" "$4"; do
    first_losses "$1" "$2=$value" || status=1
  done
  return $status
}
# chip_headline.py's run of the preset with STAGE on, 3 traced steps, into $work/$1, at engine
# flags $2, MEASURE_PEAK $3; no cache, so every program is dumped and the trace charged to them
traced_run() {
  (unset JAX_COMPILATION_CACHE_DIR; "$py" - "$work/$1" "$2" "$3" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks/chip")
import chip_headline
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
figures = chip_headline.run_figures(out, "tpu-v5e-1", "on", 3, sys.argv[3] == "on", sys.argv[2])
(out / "run.json").write_text(json.dumps(figures, indent=1))
print({name: figures[name] for name in ("step_s", "mfu", "boundary_idle_s", "device_peak")})
EOF
  )
}
run_part() {
case $part in
  headline-off|headline-on)
    "$py" benchmarks/chip/chip_headline.py --out "$work/$part" --skip-ab --stages "${part#headline-}" ;;
  ab)
    "$py" benchmarks/chip/chip_headline.py --out "$work/ab" --ab-only ;;
  peak-test)
    "$py" -m pytest -q -m tpu_chip tests/bench/test_device_peak_on_chip.py ;;
  tests)
    "$py" -m pytest -q -m tpu_chip tests/ --durations=0 ;;
  kernel-tests)
    "$py" -m pytest -q -m tpu_chip tests/engine/ --durations=0 ;;
  sweep)
    "$py" benchmarks/chip/chip_fit_sweep.py --out "$work/sweep" --rows "${ROWS:-3,5,6}" \
      --from-aot "$results/2026-12-06-chip-fit-sweep-aot-tpu-v5e-1-splash-v5e-1x1.json" ;;
  aot-host)  # aot's JSON has its own host peak (host_peak_bytes); this one only opens the chip
    mkdir -p "$work/aot-host"
    "$py" -c "import resource, jax; print(jax.devices()); print('host peak of a process that\
 opened the chip:', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 'KiB')"
    "$py" -m rl_trainer_bench.cli aot --preset tpu-v5e-1 --target local \
      --output "$work/aot-host/aot-local.json" || [ $? = 1 ] ;;  # 1: DOES NOT FIT, a figure
  effects)
    for flops in 4e11 4.3e12; do
      "$py" -m rl_trainer_bench.cli ab --arms "off,more:extra_device_work=$flops" \
        --out "$work/effects/extra-$flops"
    done ;;
  remat)
    "$py" -m rl_trainer_bench.cli ab --arms "full:remat_policy=full,minimal:remat_policy=minimal" \
      --out "$work/remat" ;;
  chunk)
    "$py" -m rl_trainer_bench.cli ab --arms "c64:linear_chunk_size=64,c128:linear_chunk_size=128" \
      --out "$work/chunk" ;;
  inverse)
    mkdir -p "$work/inverse"
    "$py" benchmarks/chip/chunk_inverse_on_chip.py --output "$work/inverse/inverse.json"
    "$py" -m pytest -q -m tpu_chip tests/engine/test_unit_lower_inverse_on_chip.py
    "$py" -m rl_trainer_bench.cli ab --arms "xla:linear_chunk_inverse=xla,pallas:linear_chunk_inverse=pallas" \
      --out "$work/inverse/ab" ;;
  gdn-kernel)  # every command runs; the part fails if any did
    mkdir -p "$work/gdn-kernel"
    status=0
    "$py" benchmarks/chip/delta_rule_kernel_on_chip.py --output "$work/gdn-kernel/delta_rule.json" || status=1
    ab_and_losses gdn-kernel linear_chunk_kernel xla pallas || status=1
    return $status ;;
  prefuse)
    ab_and_losses prefuse prefuse_moe_weights false true ;;
  gate-up)
    ab_and_losses gate-up keep_moe_gate_up false true ;;
  keep-rule)
    ab_and_losses keep-rule keep_delta_rule_outputs false true ;;
  scan-layers)
    ab_and_losses scan-layers scan_layers true false ;;
  conv)  # every command runs; the part fails if any did
    mkdir -p "$work/conv"
    status=0
    "$py" benchmarks/chip/conv_kernel_on_chip.py --output "$work/conv/conv.json" || status=1
    ab_and_losses conv linear_conv_kernel xla pallas || status=1
    return $status ;;
  ragged)
    ab_and_losses ragged expert_compute sorted_gmm sorted_ragged_dot ;;
  head)
    ab_and_losses head logps_gradient saved_lse in_forward ;;
  heads)  # HEADS: the two values, default "2 4"
    read -r first second <<< "${HEADS:-2 4}"
    ab_and_losses heads linear_chunk_kernel_heads "$first" "$second" ;;
  peak)
    "$py" -m rl_trainer_bench.cli run --preset tpu-v5e-1 --warmup-steps 1 --steps 5 --measure-peak on \
      --engine-flags "${PEAK_FLAGS:-}" --results-dir "$work/peak" ;;
  matmul-chain)
    mkdir -p "$work/matmul-chain"
    "$py" benchmarks/chip/matmul_chain_on_chip.py --output "$work/matmul-chain/matmul_chain.json" ;;
  gmm-tiling)
    mkdir -p "$work/gmm-tiling"
    "$py" benchmarks/chip/gmm_tiling_on_chip.py --output "$work/gmm-tiling/gmm_tiling.json" ;;
  trace)
    traced_run trace "" off ;;
  rows)
    traced_run rows "train_micro_batch_size=${ROWS:-5}" on ;;
  builtin-mb1)
    "$py" -m rl_trainer_bench.cli run --preset tpu-v5e-1 --engine-flags train_micro_batch_size=1 --steps 4 \
      --results-dir "$work/builtin-mb1" ;;
  maxtext)
    maxtext_run run --preset tpu-v5e-1 --engine maxtext --engine-flags "$maxtext_flags" --steps 4 \
      --results-dir "$work/maxtext/tunix"
    maxtext_peak "$work/maxtext/peak" ;;
  maxtext-peak)
    maxtext_peak "$work/maxtext-peak" ;;
  maxtext-ab)
    maxtext_run ab --preset tpu-v5e-1 --engine maxtext --knob "ENGINE_FLAGS=$maxtext_flags" \
      --arms "full:maxtext.remat_policy=full,minimal:maxtext.remat_policy=minimal" \
      --out "$work/maxtext-ab" ;;
  boundary)
    for bytes in ${BOUNDARY_BYTES-0 67108864 134217728 268435456 536870912}; do
      "$py" -m rl_trainer_bench.cli ab --knob "ENGINE_FLAGS=extra_host_bytes=$bytes" \
        --out "$work/boundary/bytes-$bytes"
    done
    for bytes in ${BOUNDARY_SHORT_BYTES-536870912}; do
      "$py" -m rl_trainer_bench.cli ab --knob "ENGINE_FLAGS=extra_host_bytes=$bytes" \
        --knob MICRO_STEPS=2 --out "$work/boundary/bytes-$bytes-micro-steps-2"
    done ;;
  interrupts)
    mkdir -p "$work/interrupts"
    "$py" benchmarks/driver/interrupt_tries.py --tries 6 --compile-wait 60 \
      --output "$work/interrupts/tries.json" ;;
esac
}
failed=""
for part in "$@"; do
  started=$SECONDS
  run_part 2>&1 | tee "$out/$part.log" || failed="$failed $part"
  echo "$part: $((SECONDS - started)) s" | tee -a "$out/$part.log"
  if [ -d "$work/$part" ]; then  # what the part wrote, also when it failed
    tar -czf "$out/$part.tar.gz" -C "$work" --exclude=hlo --exclude=profile --exclude='*.xplane.pb' "$part"
  fi
done
ls -la "$out"
[ -z "$failed" ] || { echo "failed:$failed" >&2; exit 1; }
