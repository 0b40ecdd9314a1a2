"""The Gated DeltaNet's chunked rule on a TPU chip, alone: the XLA path against the Pallas kernels
(`linear_chunk_kernel`), time and error, at a micro-batch of the preset's shapes.

Why: the step's profile charges the Gated DeltaNet's rows with about 495 ms of a 1.76 s step on
tpu-v5e-1 (benchmarks/reports/chip-round-5_tpu-v5e_2026-12-06.md), mostly element-wise passes over chunk terms in HBM; this
times the rule alone (q and k as the convolution gives them, through normalisation, the rule and
back), so the kernels' share of a step change is their own. Each arm is jitted over the same inputs
(`gdn_reference.cell_inputs`: packed rows, the layer's bfloat16 q, k and v) and timed over
`chip_timing.REPEATS` calls after a warm-up, median per call: the forward alone and the forward with
the gradient of every input. Arms: the XLA path with either inverse (`linear_chunk_inverse` xla and
pallas), and the kernels at 1, 2 and 4 heads a program (`linear_chunk_kernel_heads`, the engine
key). The error is each arm's largest difference from the per-token recurrence in
float64 (on the host's CPU, the first row's first key head and its value heads), over the largest
value, of the output and of each input's gradient.

Usage (on a host with one TPU chip):
  PYTHONPATH=. python benchmarks/chip/delta_rule_kernel_on_chip.py --output delta_rule.json

Remakes the Gated DeltaNet kernel's figures in BENCHMARKS.md's chip suite;
benchmarks/reports/chip-round-6_tpu-v5e_2026-12-07.md.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from chip_timing import (
    chip_parser,
    forward_and_gradient,
    positive,
    preset_on_the_chip,
    timing_words,
)

from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.delta_rule_kernel import chunked_delta_rule
from rl_trainer_bench.engine.builtin.gated_deltanet import layer_delta_rule
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.errors import run_guarded
from rl_trainer_bench.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine"))
from gdn_reference import cell_inputs, recurrence

NAMES = ("out", "q", "k", "v", "log_decay", "beta")
# tpu-v5e-1's rule a step: 3 linear layers x 4 micro-batches, each a forward and, as the layer is
# rematerialized, a forward and backward
CALLS_A_STEP = 12


def arms(model, per_program):
    """name -> the rule on the layer's q, k, v, log decay, beta and segment ids."""
    found = {
        f"xla, linear_chunk_inverse={inverse}": functools.partial(
            layer_delta_rule, config=model, inverse=inverse, kernel="xla"
        )
        for inverse in ("xla", "pallas")
    }
    for heads in per_program:
        found[f"kernels, {heads} head(s) a program"] = functools.partial(
            chunked_delta_rule, chunk_size=model.linear_chunk_size,
            query_scale=model.linear_key_head_dim**-0.5, heads_per_program=heads,
        )  # fmt: skip
    return found


def float64_reference(model, arrays, segments, weights):
    """The output and gradients of the first row's first key head and its value heads, by the
    per-token recurrence in float64 on the host's CPU."""
    share = model.linear_num_value_heads // model.linear_num_key_heads
    q, k, v, log_decay, beta = (
        x[:1, :, :1] if i < 2 else x[:1, :, :share] for i, x in enumerate(arrays)
    )
    scale = model.linear_key_head_dim**-0.5

    def loss(q, k, v, log_decay, beta):
        def unit(x):
            return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)

        q, k = (jnp.repeat(x, share, axis=2) for x in (unit(q) * scale, unit(k)))
        out = recurrence(q, k, v, log_decay, beta, jnp.asarray(segments[:1]))
        return jnp.sum(out * weights[:1, :, :share]), out

    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))
        (_, out), grads = value_and_grad(
            *(np.asarray(x, np.float64) for x in (q, k, v, log_decay, beta))
        )
        return [np.asarray(a) for a in (out, *grads)]


def errors(share, got, want):
    """name -> the largest |difference| over the largest |value|, on the reference's slice."""
    sliced = [x[:1, :, :1] if i in (1, 2) else x[:1, :, :share] for i, x in enumerate(got)]
    return {
        name: float(np.abs(np.asarray(a, np.float64) - w).max() / np.abs(w).max())
        for name, a, w in zip(NAMES, sliced, want, strict=True)
    }


def main(argv: list[str]) -> int:
    parser = chip_parser(__doc__)
    parser.add_argument(
        "--heads-per-program", type=positive, nargs="+", default=[1, 2, 4],
        help="the kernels' heads a program, one arm each (1 2 4)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    engine = preset_on_the_chip(args.preset, args.output)
    model = engine.model
    *arrays, segments, weights = cell_inputs(model, engine.micro_batch_rows, engine.seq_len)
    inputs = [jnp.asarray(x, jnp.bfloat16) for x in arrays[:3]]
    inputs += [jnp.asarray(x) for x in arrays[3:]]
    want = float64_reference(model, [np.asarray(x) for x in inputs], segments, weights)
    share = model.linear_num_value_heads // model.linear_num_key_heads
    report = {"device": jax.devices()[0].device_kind, "preset": args.preset, "arms": {}}
    with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
        for name, rule in arms(model, args.heads_per_program).items():
            arm, got = forward_and_gradient(
                lambda *x, rule=rule: rule(*x, jnp.asarray(segments)), inputs, weights, CALLS_A_STEP
            )
            arm["error_against_float64"] = errors(share, got, want)
            report["arms"][name] = arm
            worst = max(arm["error_against_float64"].items(), key=lambda item: item[1])
            print(
                f"{name}: {timing_words(arm, CALLS_A_STEP)}; error against float64: largest"
                f" {worst[1]:.2e} ({worst[0]}), {arm['error_against_float64']}"
            )
    write_text_atomically(args.output, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_guarded("delta_rule_kernel_on_chip.py", lambda: main(sys.argv[1:])))
