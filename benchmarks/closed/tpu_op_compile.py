"""Compile single MoE routing ops at a preset's per-device shapes for one chip of a TPU slice.

Why: the production cell's forward-backward programs take minutes to compile and hold tens of GiB
of temporaries; which op costs what is easier to see one op at a time. Each op is compiled on one
device of the slice's topology (from this host, nothing runs on a TPU) and reported with XLA's
compile seconds, generated code size and temporary bytes.

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python benchmarks/closed/tpu_op_compile.py \
        --preset qwen3.5-397b-cell --target tpu7x:4x4x8

Shapes (docs/engine.md legend): N tokens per group on a device, A the expert-axis size, K experts
per token, D the model width; the dropless replay sorts P = A N K pairs of A N gathered tokens.

Closed (benchmarks/closed/README.md); its report:
benchmarks/reports/aot-compile-time_tpu7x-v5p_2026-12-02.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.config import tokens_per_group
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.aot.targets import resolve_target


def ops(tokens: int, pairs: int, width: int, top_k: int, dtype) -> dict:
    """name -> (function, argument shapes) for the routing ops of one MoE layer."""
    index = jax.ShapeDtypeStruct((tokens, top_k), jnp.int32)
    rows = jax.ShapeDtypeStruct((pairs, width), dtype)
    keys = jax.ShapeDtypeStruct((pairs,), jnp.int32)
    gates = jax.ShapeDtypeStruct((tokens, top_k), jnp.float32)
    return {
        "argsort of the pairs (stable)": (lambda k: jnp.argsort(k, stable=True), (keys,)),
        "inverse permutation (scatter of P indices)": (
            lambda o: jnp.zeros_like(o).at[o].set(jnp.arange(pairs, dtype=o.dtype)),
            (keys,),
        ),
        "gather rows to pairs [P, D]": (
            lambda t, o: t[o // top_k],
            (jax.ShapeDtypeStruct((tokens, width), dtype), keys),
        ),
        "gather [N, K, D] then sum over K": (
            lambda r, i, g: jnp.einsum(
                "nkd,nk->nd", r[i], g.astype(dtype), preferred_element_type=jnp.float32
            ),
            (rows, index, gates),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3.5-397b-cell")
    parser.add_argument("--target", default="tpu7x:4x4x8")
    args = parser.parse_args()
    try:
        config = preset(args.preset).engine
        device = resolve_target(args.target).devices[0]
    except UserError as error:  # an unknown preset or slice, or no libtpu here: one line
        print(f"tpu_op_compile: {error}", file=sys.stderr)
        sys.exit(2)
    tokens = config.mesh.expert * tokens_per_group(config)
    pairs = tokens * config.model.top_k
    single = jax.sharding.SingleDeviceSharding(device)
    results = []
    for name, (fn, shapes) in ops(
        tokens, pairs, config.model.d_model, config.model.top_k, jnp.dtype(config.model.dtype)
    ).items():
        placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=single) for s in shapes]
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(*placed).compile()
        seconds = time.perf_counter() - start
        memory = compiled.memory_analysis()
        row = {
            "op": name,
            "compile_seconds": round(seconds, 1),
            "generated_code_mib": round(memory.generated_code_size_in_bytes / 2**20, 2),
            "temp_gib": round(memory.temp_size_in_bytes / 2**30, 2),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    print(
        json.dumps({"preset": args.preset, "target": args.target, "tokens": tokens, "pairs": pairs})
    )


if __name__ == "__main__":
    main()
