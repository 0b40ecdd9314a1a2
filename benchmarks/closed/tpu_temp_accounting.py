"""Where a TPU program's `temp_size_in_bytes` lies: XLA's buffer assignment, memory space by memory space.

`aot` counts a program's device footprint as XLA's argument, output and temp bytes (`memory_analysis`)
plus the state beside it. On the one-chip v5e cell that sum says 16.96 GiB, yet the same cell ran on
a 15.75 GiB chip (benchmarks/reports/chip-round-0_tpu-v5e_2026-12-05.md). This compiles each of a
cell's programs for a TPU target from this host, exactly as `aot` does, with XLA's dump switched on
for that compile alone, and sets `temp_size_in_bytes` beside what the buffer assignment itself
allocates: the one preallocated temporary block per memory space (HBM is color 0, the core's VMEM
color 1, SMEM color 2), the thread-local and constant buffers, and XLA's own peak of live buffers.
With `--probes` it does the same for small programs whose shapes make any gap easy to read: a layer
loop under `scan` and `checkpoint` (as it is, with twice the layers, with twice the tokens, twice
in a row, and with three matmuls in its body), the same layers unrolled, a sort and gather;
`--no-cell` compiles those alone.

What a compile gives is what the compiler planned; which figure the chip's runtime reserves when it
loads the program, only the chip can say (`tpu-v5e-facts.md`).

Usage (needs the [tpu] extra):
  JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/closed/tpu_temp_accounting.py \\
      --preset tpu-v5e-1 --target v5e:1x1 --probes --output temp_accounting.json

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/aot-one-chip-memory_v5e-v6e_2026-12-05.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.temp_block import dump_options
from rl_trainer_bench.preflight.aot.check import resolve_cell, state_bytes
from rl_trainer_bench.preflight.aot.compile import compile_plan
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

GIB = 1024**3
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*)$")
_COLOR = re.compile(r"color (\d+), ")


def buffer_assignment(folder: Path) -> dict[str, int]:
    """Bytes by kind in the one module's buffer assignment that `folder` holds: `temp_block_c<N>`
    for the preallocated temporary block of memory space N, `parameter`, `output`,
    `thread_local`, `constant`."""
    (path,) = folder.glob("*after_optimizations-buffer-assignment.txt")
    kinds: dict[str, int] = {}
    for line in path.read_text().splitlines():
        match = _ALLOCATION.match(line)
        if not match:
            continue
        size, rest = int(match.group(1)), match.group(2)
        color = _COLOR.match(rest)
        rest = rest[color.end() :] if color else rest
        if rest.startswith("preallocated-temp"):
            kind = f"temp_block_c{color.group(1) if color else 0}"
        elif rest.startswith("parameter"):
            kind = "parameter"
        elif rest.startswith("output"):
            kind = "output"
        else:
            kind = rest.split(":")[0].split(",")[0].replace("-", "_")
        kinds[kind] = kinds.get(kind, 0) + size
    return kinds


def dumped_compile(lowered, options: dict, folder: Path):
    """`lowered` compiled with `options`, its XLA dump in `folder`: (compiled, memory_analysis)."""
    compiled = lowered.compile(compiler_options={**options, **dump_options(folder)})
    return compiled, compiled.memory_analysis()


def accounting(name: str, analysis, kinds: dict[str, int], beside: int = 0) -> dict:
    """One program's figures, in bytes: XLA's, the assignment's, and the gap between them."""
    temp = int(analysis.temp_size_in_bytes)
    hbm_block = kinds.get("temp_block_c0", 0)
    resident_args = int(analysis.argument_size_in_bytes) + int(analysis.output_size_in_bytes)
    resident_args -= int(analysis.alias_size_in_bytes)
    return {
        "program": name,
        "temp_size": temp,
        "hbm_temp_block": hbm_block,
        "vmem_temp_block": kinds.get("temp_block_c1", 0),
        "thread_local": kinds.get("thread_local", 0),
        "temp_not_in_hbm_block": temp - hbm_block,
        "live_peak": int(getattr(analysis, "peak_memory_in_bytes", 0) or 0),
        "beside": beside,
        "code": int(analysis.generated_code_size_in_bytes),
        # aot's peak (preflight/aot/compile.ProgramMemory.peak: the code's bytes left out), and
        # the same sum with the assignment's HBM block in place of temp_size
        "peak_with_temp_size": resident_args + temp + beside,
        "peak_with_hbm_block": resident_args + hbm_block + beside,
        "buffer_assignment": kinds,
    }


def cell_programs(args, root: Path) -> list[dict]:
    """Every program of the cell, lowered and given options as `aot` does, each compiled with
    its own dump."""
    cell = resolve_cell(args.preset, args.target, "", args.engine_flags)
    state = state_bytes(cell.config, cell.mesh, stage_before_update=args.stage)
    rows = []
    for name, lowered, options in compile_plan(cell.config, cell.mesh):
        _, analysis = dumped_compile(lowered, options, root / name)
        beside = residency.beside(name, state)
        rows.append(accounting(name, analysis, buffer_assignment(root / name), beside))
        print(f"compiled {name}", file=sys.stderr, flush=True)
    return rows


def probe_programs(target: str, root: Path) -> list[dict]:
    """Small programs on the target's first device (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from rl_trainer_bench.preflight.aot.targets import resolve_target

    device = resolve_target(target).devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)

    def spec(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def scanned(h, w, body=lambda h, wl: jnp.tanh(h @ wl)):
        h, _ = jax.lax.scan(jax.checkpoint(lambda h, wl: (body(h, wl), None)), h, w)
        return h

    def layers_scanned(w, x):
        return jax.grad(lambda w: (scanned(x, w).astype(jnp.float32) ** 2).sum())(w)

    def two_scans(w, v, x):
        def loss(w, v):
            return (scanned(scanned(x, w), v).astype(jnp.float32) ** 2).sum()

        return jax.grad(loss, argnums=(0, 1))(w, v)

    def three_matmul_body(w, x):
        def body(h, wl):
            return jnp.tanh(jnp.tanh(jnp.tanh(h @ wl) @ wl.T) @ wl)

        return jax.grad(lambda w: (scanned(x, w, body).astype(jnp.float32) ** 2).sum())(w)

    def layers_unrolled(w, x):
        def loss(w):
            h = x
            for layer in range(w.shape[0]):
                h = jnp.tanh(h @ w[layer])
            return (h.astype(jnp.float32) ** 2).sum()

        return jax.grad(loss)(w)

    def sort_gather(x, keys):
        return (x[jnp.argsort(keys)] * 2).cumsum(0)

    weights, tokens = spec((8, 4096, 4096)), spec((16384, 4096))
    probes = {
        "probe_layers_scanned": (layers_scanned, (weights, tokens)),
        "probe_scanned_16_layers": (layers_scanned, (spec((16, 4096, 4096)), tokens)),
        "probe_scanned_2x_tokens": (layers_scanned, (weights, spec((32768, 4096)))),
        "probe_two_scans": (two_scans, (weights, weights, tokens)),
        "probe_three_matmul_body": (three_matmul_body, (weights, tokens)),
        "probe_layers_unrolled": (layers_unrolled, (weights, tokens)),
        "probe_sort_gather": (sort_gather, (spec((65536, 2048)), spec((65536,), jnp.int32))),
    }
    rows = []
    for name, (function, arguments) in probes.items():
        _, analysis = dumped_compile(jax.jit(function).lower(*arguments), {}, root / name)
        rows.append(accounting(name, analysis, buffer_assignment(root / name)))
    return rows


def table(rows: list[dict]) -> str:
    columns = (
        ("temp_size", "temp_size"),
        ("hbm_temp_block", "HBM block"),
        ("vmem_temp_block", "VMEM block"),
        ("temp_not_in_hbm_block", "temp - HBM"),
        ("live_peak", "live peak"),
        ("peak_with_temp_size", "peak (temp)"),
        ("peak_with_hbm_block", "peak (HBM)"),
    )
    lines = [f"{'program':24}" + "".join(f"{title:>13}" for _, title in columns) + "   (GiB)"]
    for row in rows:
        lines.append(
            f"{row['program']:24}" + "".join(f"{row[key] / GIB:13.3f}" for key, _ in columns)
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tpu-v5e-1")
    parser.add_argument("--target", default="v5e:1x1")
    parser.add_argument("--engine-flags", default="")
    parser.add_argument("--stage", action="store_true", help="count the staged micro-batch")
    parser.add_argument("--probes", action="store_true", help="also the small programs")
    parser.add_argument("--no-cell", action="store_true", help="the small programs alone")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, quiet_libtpu():
        root = Path(folder)
        rows = [] if args.no_cell else cell_programs(args, root)
        if args.probes or args.no_cell:
            rows += probe_programs(args.target, root)
    cell = "no cell" if args.no_cell else f"{args.preset}, engine flags {args.engine_flags or '-'}"
    print(f"{cell} on {args.target}")
    print(table(rows))
    if args.output:
        args.output.write_text(json.dumps({"preset": args.preset, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
