"""Tunix's chunked log-prob pass on MaxText's model against the full logits: equal, and how much
device memory the compiled GRPO loss's forward-backward takes each way.

The model is maxtext 0.2.5's, built as the MaxText adapter builds it (its words, its mesh), in the
route-replaying call MaxText's engine under Tunix's driver hands Tunix's loss
(`tunix_grpo.ReplayingCall`: `maxtext.head` finds the split). Tunix's own `algo_core.grpo_loss_fn`
then runs once with `compute_logps_chunk_size=CHUNK` (its chunked pass: `skip_lm_head`, then the
head on CHUNK tokens at a time under remat) and once with 0 (the full [B, T, V] logits, what the
pod ran before the split). It prints the per-token log-probs' and the gradients' largest
differences, and XLA's temp bytes of each compiled forward-backward on this CPU.

Usage (the side environment of benchmarks/maxtext/maxtext_venv.sh, and a Tunix checkout's `tunix/`):
  PYTHONPATH=.:$TUNIX_DIR /tmp/maxtext-bench-venv/bin/python benchmarks/maxtext/maxtext_chunked_logps.py \\
      --rows 2 --seq-len 1024 --vocab 65536 --chunk 256

Remakes BENCHMARKS.md's maxtext suite; benchmarks/reports/maxtext-engine_cpu_2026-12-03.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import example_payloads_for
from rl_trainer_bench.engine.maxtext import aot as maxtext_aot
from rl_trainer_bench.engine.maxtext import cpu_lowerings, tunix_grpo
from rl_trainer_bench.engine.maxtext import head as maxtext_head
from rl_trainer_bench.engine.maxtext.adapter import load_maxtext

MIB = 1024**2


def _engine_config(args: argparse.Namespace):
    cell = PRESETS[args.preset].engine
    return dataclasses.replace(
        cell,
        model=dataclasses.replace(cell.model, vocab_size=args.vocab),
        mesh=MeshConfig(),
        micro_batch_rows=args.rows,
        seq_len=args.seq_len,
        loss=dataclasses.replace(cell.loss, compute_logps_chunk_size=args.chunk),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-tiny-qwen3.5")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=65_536)
    parser.add_argument("--chunk", type=int, default=256)
    args = parser.parse_args()
    from flax import nnx
    from tunix.rl import algo_core, common

    config = _engine_config(args)
    cpu_lowerings.use_xla_triangular_solve()  # as the adapter on a CPU: jaxlib's LAPACK call hangs
    api, tunix = load_maxtext(), tunix_grpo.load_tunix()
    words = maxtext_aot.maxtext_args(api, config, tempfile.mkdtemp(), "cpu").words
    hyper = api.build_config(words)
    wrapped = api.tunix_adapter_wraps(hyper.model_name)
    engine = api.engine_type(
        hyper,
        mesh=api.build_mesh(hyper, jax.devices()),
        wrap_with_tunix_adapter=wrapped,
        tokenizer_pad_id=tunix_grpo.PAD_ID if wrapped else None,
    )
    split = maxtext_head.head_split(engine.model, wrapped)
    print(
        f"maxtext {api.version}: model {type(engine.model).__name__};"
        f" split: {split.kind}: {split.why}"
    )
    routed = tunix_grpo.to_train_example(example_payloads_for(config, 1)[0], tunix)
    example = jax.tree.map(jnp.asarray, routed.train_example)
    algo_config = tunix_grpo.grpo_config(tunix, config.loss)
    call = tunix_grpo.load_tunix().replaying(
        engine.model, routed.routed_experts, wrapped, split.kind
    )
    graphdef, params, rest = nnx.split(call, nnx.Param, ...)

    def loss(params, chunk):
        model = nnx.merge(graphdef, params, rest)
        out = algo_core.grpo_loss_fn(
            model, example, algo_config, 0, 0, compute_logps_chunk_size=chunk
        )
        return out.primary_loss.unreduced_sum

    def logps(chunk):
        state = nnx.state(call)
        return common.compute_per_token_logps(
            graphdef_all, state, example.prompt_ids, example.completion_ids, 0, 0,
            segment_ids=example.segment_ids, segment_positions=example.segment_positions,
            chunk_size=chunk,
        )  # fmt: skip

    graphdef_all, _ = nnx.split(call)
    results = {}
    for chunk in (args.chunk, 0):
        step = jax.jit(jax.value_and_grad(loss), static_argnums=1)
        compiled = step.lower(params, chunk).compile()
        value, grads = compiled(params)
        temp = compiled.memory_analysis().temp_size_in_bytes
        results[chunk] = (value, grads, temp, np.asarray(logps(chunk)))
    chunked, full = results[args.chunk], results[0]
    grad_diff = max(
        float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
        for a, b in zip(jax.tree.leaves(chunked[1]), jax.tree.leaves(full[1]), strict=True)
    )
    logits = args.rows * args.seq_len * args.vocab * 4
    print(f"cell: {args.preset}, {args.rows} x {args.seq_len} tokens, vocab {args.vocab:,}")
    print(f"full [B, T, V] float32 logits of the micro-batch: {logits / MIB:,.0f} MiB")
    print(f"fwd_bwd temp, full logits:  {full[2] / MIB:,.1f} MiB")
    print(f"fwd_bwd temp, chunk {args.chunk}: {chunked[2] / MIB:,.1f} MiB")
    print(f"loss sums: chunked {float(chunked[0]):.6f}, full {float(full[0]):.6f}")
    print(f"per-token log-probs, largest |difference|: {np.max(np.abs(chunked[3] - full[3])):.3g}")
    print(f"gradients, largest difference / largest |full|, over the leaves: {grad_diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
