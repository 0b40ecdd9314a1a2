"""The Gated DeltaNet's short convolutions on a TPU chip, alone: the XLA path against the Pallas
kernels (`linear_conv_kernel`), time and difference, at a micro-batch of the preset's shapes.

Why: the step's trace charges `gated_deltanet.py:local_conv` about 79 ms of a 1.9 s step on
tpu-v5e-1 at 5 rows against about 44 ms of its ops' rooflines (chip round 7); this times the
convolution and its SiLU alone on the layer's q, k and v projection (bfloat16, [rows, tokens,
2 Hk Dk + Hv Dv]), the forward alone and the forward with the gradients of the input and the
taps, so a step's change under `linear_conv_kernel=pallas` can be split into its parts. Each arm
is jitted over the same inputs and timed over `chip_timing.REPEATS` calls after a warm-up, median
per call; each arm's output and gradients are compared with the XLA path's (the largest
difference over the largest value).

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/conv_kernel_on_chip.py --output conv.json

Remakes the short convolution's figures in BENCHMARKS.md's chip suite (`chip_runs.sh` part
`conv`); benchmarks/reports/chip-round-8_tpu-v5e_2026-12-07.md says what it is for.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from chip_timing import chip_parser, forward_and_gradient, preset_on_the_chip, timing_words

from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.gated_deltanet import context_conv
from rl_trainer_bench.engine.builtin.programs import check_config
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.errors import UserError, run_guarded
from rl_trainer_bench.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine"))
from gdn_reference import conv_inputs

# tpu-v5e-1's convolutions a step: 3 linear layers x 4 micro-batches, each a forward and, as the
# layer is rematerialized, a forward and backward
CALLS_A_STEP = 12
NAMES = ("out", "x", "taps")


def main(argv: list[str]) -> int:
    args = chip_parser(__doc__).parse_args(argv)
    engine = preset_on_the_chip(args.preset, args.output)
    m = engine.model
    # the kernels' shapes, refused in one line before any chip time (a preset whose q, k and v are
    # not whole lanes, or that splits rows over context)
    check_config(
        dataclasses.replace(engine, model=dataclasses.replace(m, linear_conv_kernel="pallas"))
    )
    segments, x, kernel, weights = conv_inputs(m, engine.micro_batch_rows, engine.seq_len)
    segments, weights = jnp.asarray(segments), jnp.asarray(weights)
    x, kernel = jnp.asarray(x, jnp.bfloat16), jnp.asarray(kernel, jnp.bfloat16)
    report = {"device": jax.devices()[0].device_kind, "preset": args.preset, "arms": {}}
    with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
        results = {
            method: forward_and_gradient(
                lambda x, kernel, method=method: context_conv(x, kernel, segments, method),
                [x, kernel],
                weights,
                CALLS_A_STEP,
            )
            for method in ("xla", "pallas")
        }
    for method, (arm, got) in results.items():
        arm["difference_from_xla"] = {
            name: float(np.abs(a - w).max() / np.abs(w).max())
            for name, a, w in zip(NAMES, got, results["xla"][1], strict=True)
        }
        report["arms"][f"linear_conv_kernel={method}"] = arm
        print(
            f"linear_conv_kernel={method}: {timing_words(arm, CALLS_A_STEP)}; difference from"
            f" xla: {arm['difference_from_xla']}"
        )
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(
        run_guarded(
            "conv_kernel_on_chip.py", lambda: main(sys.argv[1:]), (UserError, ContractError)
        )
    )
