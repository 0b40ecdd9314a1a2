"""The MoE's grouped matmuls on a TPU chip, alone, at each of a few tilings of the Pallas kernel.

Why: the step's profile charges `local_sorted_ffn` with 494 ms of a 1.80 s step on tpu-v5e-1, where
its grouped matmuls' FLOPs take about 244 ms at the chip's peak (BENCHMARKS.md). The kernel
(`jax.experimental.pallas.ops.tpu.megablox.gmm`) walks the sorted rows in tiles of (tm, tk, tn):
a row tile that straddles two experts runs twice, and a weight tile is fetched again for each row
tile and step over k. This times the layer's three matmuls (gate and up [P, D] x [E, D, F], down
[P, F] x [E, F, D]) forward and backward as the engine runs them, at the preset's shapes, with the
expert sizes drawn from the preset's routing profile, so a tiling rule is chosen by the chip.

Each (tiling, matmul) is one jitted forward-and-backward (`jax.vjp` of the kernel: its gmm
forward, then the transposed gmm and the tgmm for the weights), timed over `chip_timing.REPEATS`
calls after a warm-up, median per call; the TFLOP/s count the matmul's own work, 3 x 2 P D F over
the rows the groups hold. A tiling the kernel cannot compile (its tiles outgrow the kernel's
memory) is reported as such, not skipped. Beside them, XLA's plain matmul of the same rows with
one expert's weights (`dense`): what the chip gives the same work without groups. Gate and up are
also timed as one matmul of width 2F (the engine runs them as two): its time against twice the
separate one's says what fusing them would save.

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/gmm_tiling_on_chip.py --output gmm_tiling.json

Remakes BENCHMARKS.md's row "tpu-v5e-1's step and MFU" (the kernel's share of what stops 35%);
benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md; gate and up joined (the tiling of
`prefuse_moe_weights`): benchmarks/reports/chip-round-6_tpu-v5e_2026-12-07.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from chip_timing import timed

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin.moe import gmm_tiling
from rl_trainer_bench.engine.config import tokens_per_group
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import check_output_file, write_text_atomically
from rl_trainer_bench.payload.routing_profile import fit_to_model, load_profile

# (tm, tk, tn) beside the engine's rule: rows a quarter, half and twice as tall, k whole (a weight
# tile then stays in VMEM across a group's row tiles) or halved, n halved. Each fits the kernel's
# 16 MiB of scoped VMEM on v5e, forward and backward (compiled for v5e:1x1 from a CPU host);
# (1024, 1024, 1024), (512, 2048, 1024) and (256, 2048, 1024) do not.
CANDIDATES = (
    (128, 1024, 1024),
    (256, 1024, 1024),
    (1024, 1024, 512),
    (1024, 512, 1024),
    (512, 2048, 512),
    (256, 2048, 512),
    (512, 512, 1024),
    (512, 1024, 512),
)


def expert_sizes(preset_name: str, layer: int, rows: int) -> np.ndarray:
    """[E] int32 pairs per expert summing to `rows`: one draw from the preset's routing profile
    (the shares the bench's micro-batch is built to), so the groups are as uneven as the run's."""
    engine = preset(preset_name).engine
    shares = fit_to_model(load_profile(None), engine.model).shares[layer]
    return np.random.default_rng(layer).multinomial(rows, shares).astype(np.int32)


def matmul_shapes(preset_name: str) -> dict[str, tuple[int, int, int]]:
    """name -> (P, K, N) of the sorted layer's grouped matmuls for one token group (its gate and up
    matmuls have one shape, timed once), and of gate and up as one matmul of the experts' two
    weights side by side: against twice the separate one's time, what fusing them would save (the
    rows read and each group's set-up once, not twice)."""
    engine = preset(preset_name).engine
    model = engine.model
    pairs = tokens_per_group(engine) * model.top_k
    d, f = model.d_model, model.expert_ffn_dim
    return {
        "gate and up, each": (pairs, d, f),
        "down": (pairs, f, d),
        "gate and up as one": (pairs, d, 2 * f),
    }


def forward_backward(tiling, sizes, interpret):
    """The kernel's forward and backward of rows x weights at `tiling`, jitted."""
    # Pallas' TPU kernels: imported where they run, as the engine does
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    def fn(rows, weights, grad):
        out, pull = jax.vjp(
            lambda r, w: gmm(r, w, sizes, r.dtype, tiling, interpret=interpret), rows, weights
        )
        return out, pull(grad)

    return jax.jit(fn)


def dense_forward_backward():
    """XLA's own matmul of every row with the first expert's weights, forward and backward, jitted:
    the same work as the grouped matmul without groups, what the chip gives a plain matmul."""

    def fn(rows, weights, grad):
        out, pull = jax.vjp(lambda r, w: r @ w[0], rows, weights)
        return out, pull(grad)

    return jax.jit(fn)


def one_tiling(tiling, shape, sizes, interpret) -> dict:
    """Median ms and TFLOP/s of one matmul's forward and backward at `tiling` (None: XLA's dense
    matmul), or why it failed."""
    p, k, n = shape
    keys = jax.random.split(jax.random.key(0), 3)
    rows = jax.random.normal(keys[0], (p, k), jnp.bfloat16)
    weights = jax.random.normal(keys[1], (sizes.shape[0], k, n), jnp.bfloat16) * k**-0.5
    grad = jax.random.normal(keys[2], (p, n), jnp.bfloat16)
    if tiling is None:
        fn = dense_forward_backward()
    else:
        fn = forward_backward(tuple(tiling), jnp.asarray(sizes), interpret)
    try:
        seconds = statistics.median(timed(fn, rows, weights, grad))
    except (ValueError, jax.errors.JaxRuntimeError) as error:  # the kernel's refusal: a result
        return {"error": str(error).splitlines()[0][:300]}
    work = 3 * 2 * int(sizes.sum()) * k * n
    return {"median_ms": seconds * 1e3, "tflops": work / seconds / 1e12}


def sweep(preset_name: str, layer: int, candidates, interpret: bool) -> dict:
    """Every candidate tiling (the engine's rule first), then XLA's dense matmul, on each matmul
    shape."""
    report = {}
    for name, shape in matmul_shapes(preset_name).items():
        sizes = expert_sizes(preset_name, layer, shape[0])
        rule = gmm_tiling(*shape)
        # a tile no larger than its dimension (a small preset, in the interpreter)
        clipped = dict.fromkeys(tuple(map(min, c, shape)) for c in candidates)
        rows = {}
        for tiling in (rule, *(c for c in clipped if c != rule)):
            label = "x".join(map(str, tiling)) + (" (engine)" if tiling == rule else "")
            rows[label] = one_tiling(tiling, shape, sizes, interpret)
            print(f"{name} {shape} {label}: {rows[label]}", flush=True)
        rows["dense"] = one_tiling(None, shape, sizes, interpret)
        print(f"{name} {shape} dense (XLA's matmul, no groups): {rows['dense']}", flush=True)
        report[name] = {"shape": shape, "sizes": sizes.tolist(), "tilings": rows}
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", default="tpu-v5e-1", help="whose shapes and routing (tpu-v5e-1)"
    )
    parser.add_argument(
        "--layer", type=int, default=2, help="whose expert sizes (2: tpu-v5e-1's hottest)"
    )
    parser.add_argument("--output", type=Path, required=True, help="the JSON report")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="Pallas' interpreter, off a TPU (checks the script)",
    )
    args = parser.parse_args(argv)
    check_output_file(args.output, "--output")  # before any chip time
    layers = preset(args.preset).engine.model.num_layers  # an unknown preset: its one-line error
    if not 0 <= args.layer < layers:
        raise UserError(f"--layer {args.layer}: {args.preset} has layers 0 to {layers - 1}")
    if not args.interpret and jax.default_backend() != "tpu":
        raise UserError("needs a TPU chip this process can open (or --interpret, to check it)")
    report = {"device": jax.devices()[0].device_kind, "preset": args.preset, "layer": args.layer}
    report["matmuls"] = sweep(args.preset, args.layer, CANDIDATES, args.interpret)
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("gmm_tiling_on_chip.py", lambda: main(sys.argv[1:])))
