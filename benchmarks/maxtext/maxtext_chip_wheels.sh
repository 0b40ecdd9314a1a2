#!/usr/bin/env bash
# MaxText's engine on a TPU host that reaches no package index: its dependencies carried as wheels.
#
#   TUNIX_DIR=/path/to/tunix benchmarks/maxtext/maxtext_chip_wheels.sh download DIR  # reaches an index
#   benchmarks/maxtext/maxtext_chip_wheels.sh install DIR [VENV]                     # the TPU host, offline
#
# download: every wheel that maxtext 0.2.5 and the pins of benchmarks/maxtext/maxtext_venv.sh resolve to,
#   for CPython 3.11 on x86-64 Linux with glibc up to 2.36 (the one-chip v5e host's,
#   ../shared/reference/tpu-v5e-facts.md), into DIR, with the dependency closure (no source
#   distribution: the TPU host builds nothing); and the `tunix` package of a Tunix checkout
#   (TUNIX_DIR, as benchmarks/maxtext/maxtext_engine.sh takes it): MaxText's training engine imports
#   `tunix.experimental`, which google-tunix 0.1.7, the newest on the index, lacks.
# install: a venv (VENV, default /tmp/maxtext-chip-venv) whose python keeps PYTHONPATH first, so a
#   host whose JAX and libtpu are on PYTHONPATH (the v5e host's) keeps them, pip counting them as
#   installed; the other pins installed from DIR with no index; then maxtext and the start-up
#   hooks as maxtext_venv.sh puts them in every side environment, and the carried Tunix package
#   on the venv's path. Last, the check that the bench's adapter loads MaxText's training engine.
#   Then, from the project's folder: PYTHONPATH=$PYTHONPATH:$(pwd) VENV/bin/python -m
#   rl_trainer_bench.cli run --engine rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine ...
#
# Knobs: PYTHON (install: the interpreter the venv is made from, default python3),
# GLIBC_MINOR (download: the newest manylinux_2_N tag accepted, default 36).
#
# Remakes BENCHMARKS.md's maxtext suite; benchmarks/reports/maxtext-engine_cpu_2026-12-03.md,
# benchmarks/reports/chip-round-3_tpu-v5e_2026-12-06.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$REPO/benchmarks/maxtext/maxtext_venv.sh"  # BENCH_PINS, JAX_PINS, MAXTEXT_DEPS, MAXTEXT_PIN, finish_venv

usage() {
    echo "usage: $0 download DIR | install DIR [VENV]" >&2
    exit 2
}

download() {
    local dir=$1 platforms=() minor
    local tunix=${TUNIX_DIR:-}
    [ -n "$tunix" ] && [ -d "$tunix/tunix/experimental" ] || {
        echo "maxtext_chip_wheels.sh: TUNIX_DIR=${tunix:-(unset)} has no tunix/experimental: set" \
            "it to a checkout of Tunix" >&2
        exit 2
    }
    for minor in $(seq 17 "${GLIBC_MINOR:-36}"); do
        platforms+=(--platform "manylinux_2_${minor}_x86_64")
    done
    mkdir -p "$dir"
    printf '%s\n' "${JAX_PINS[@]}" > "$dir/jax-constraints.txt"
    pip download -q --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
        --abi abi3 --abi none --platform manylinux2014_x86_64 "${platforms[@]}" --platform any \
        -c "$dir/jax-constraints.txt" -d "$dir" \
        "${BENCH_PINS[@]}" "${MAXTEXT_DEPS[@]}"
    pip download -q --no-deps --only-binary=:all: --ignore-requires-python -d "$dir" "$MAXTEXT_PIN"
    rm -rf "$dir/tunix-checkout" && mkdir -p "$dir/tunix-checkout"
    cp -r "$tunix/tunix" "$dir/tunix-checkout/"
    echo "maxtext_chip_wheels.sh: $(find "$dir" -name '*.whl' | wc -l) wheels," \
        "$(du -sh "$dir" | cut -f1) in $dir" >&2
}

install() {
    local dir venv=${2:-/tmp/maxtext-chip-venv}
    [ -d "$1" ] || {
        echo "maxtext_chip_wheels.sh: install $1: no such folder; give the DIR of a download" >&2
        exit 2
    }
    dir=$(cd "$1" && pwd)
    [ -f "$dir/jax-constraints.txt" ] && [ -d "$dir/tunix-checkout/tunix" ] || {
        echo "maxtext_chip_wheels.sh: $dir holds no download (no jax-constraints.txt or tunix-checkout/): run" \
            "'TUNIX_DIR=... $0 download $1' on a host that reaches a package index" >&2
        exit 2
    }
    # Not --system-site-packages: the venv's start-up hooks import flax and JAX while its own
    # site folder is read, before the system's is on the path.
    "${PYTHON:-python3}" -m venv "$venv"
    local offline=(--no-index --find-links "$dir")
    # a JAX on PYTHONPATH satisfies the pins; else they come from the folder
    "$venv/bin/pip" install -q "${offline[@]}" -c "$dir/jax-constraints.txt" \
        "${BENCH_PINS[@]}" "${MAXTEXT_DEPS[@]}"
    finish_venv "$venv" "${offline[@]}"
    "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' |
        { read -r site; echo "$dir/tunix-checkout" > "$site/tunix_checkout.pth"; }
    PYTHONPATH="${PYTHONPATH:-}:$REPO" "$venv/bin/python" -c '
import jax
from rl_trainer_bench.engine.maxtext.adapter import load_maxtext
api = load_maxtext()  # what the adapter imports of MaxText training engine
print(f"MaxText training engine {api.version} imports beside jax {jax.__version__}")
'
}

case "${1:-}" in
    download) [ $# -eq 2 ] || usage; download "$2" ;;
    install) [ $# -ge 2 ] && [ $# -le 3 ] || usage; install "$2" "${3:-}" ;;
    *) usage ;;
esac
