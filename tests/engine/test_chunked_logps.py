"""Tunix's chunked log-prob pass on MaxText's model (engine/maxtext/head.py, ReplayingCall):
the split into hidden states and an output head gives the full-logits log-probs and gradients,
and the engine says which pass ran."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from maxtext_stand_in import (
    NativeHeadTunixMaxTextEngine,
    StandInModel,
    StandInTunixAdapter,
    StandInTunixMaxTextEngine,
    _init_params,
    initialize,
    per_token_logps,
)

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.contract import example_payloads_for
from rl_trainer_bench.engine.maxtext import head as maxtext_head
from rl_trainer_bench.engine.maxtext import tunix_grpo
from rl_trainer_bench.engine.maxtext.tunix_grpo import ReplayingCall

QWEN35 = PRESETS["cpu-tiny-qwen3.5"].engine


def _tiny_model(wrapped: bool):
    config = initialize(
        ["", "base_emb_dim=16", "vocab_size=97", "base_num_decoder_layers=2", "num_experts=4",
         "num_experts_per_tok=2", "decoder_block=qwen3_5", "init_weights_seed=3"]
    )  # fmt: skip
    model = StandInModel(_init_params(config), config)
    return StandInTunixAdapter(model) if wrapped else model


def _batch():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, 97, (2, 13)), jnp.int32)
    segments = jnp.asarray([[1] * 6 + [2] * 5 + [0] * 2, [1] * 13], jnp.int32)
    positions = jnp.asarray([list(range(6)) + list(range(5)) + [0, 0], list(range(13))], jnp.int32)
    routes = jnp.asarray(rng.integers(0, 4, (2, 13, 2, 2)), jnp.int32)
    return ids, positions, segments, routes


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("chunk", [5, 4, 64])  # 12 scored positions: padded, even, one chunk
def test_the_chunked_pass_gives_the_full_logits_log_probs_and_gradients(wrapped, chunk):
    model = _tiny_model(wrapped)
    ids, positions, segments, routes = _batch()
    split = maxtext_head.head_split(model, wrapped)
    assert split.kind == maxtext_head.DECODER
    weights = jnp.linspace(0.5, 1.5, ids.size).reshape(ids.shape)

    def logps(params, chunk_size):
        inner = dataclasses.replace(model.base if wrapped else model, params=params)
        bound = StandInTunixAdapter(inner) if wrapped else inner
        call = ReplayingCall(bound, routes, wrapped, split.kind)
        return per_token_logps(call, ids, positions, segments, chunk_size)

    params = (model.base if wrapped else model).params
    # the reference: the model's own call, its full [B, T, V] logits
    # compiled, not op by op: each compiles once in less time than its ops are dispatched
    values = [jax.jit(logps, static_argnums=1)(params, c) for c in (chunk, 0)]
    np.testing.assert_allclose(*values, rtol=1e-5, atol=1e-6)
    grads = [
        jax.jit(jax.grad(lambda p, c=c: jnp.sum(logps(p, c) * weights)))(params) for c in (chunk, 0)
    ]
    for name in params:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6)


def _trained(engine_type, config, payloads):
    engine = engine_type(config)
    engine.compile(payloads[0])
    for payload in payloads:
        engine.fwd_bwd(payload)
    engine.update()
    return engine, engine.get_metrics()["loss"], engine.engine.parameters()


def test_the_engine_trains_as_with_full_logits_and_says_which_pass_ran(monkeypatch):
    heads = []  # the chunks MaxText's output head was traced on
    head = maxtext_head.output_head
    monkeypatch.setattr(
        maxtext_head, "output_head", lambda t, hidden: heads.append(hidden.shape) or head(t, hidden)
    )
    config = dataclasses.replace(
        QWEN35,
        model=dataclasses.replace(QWEN35.model, vocab_size=128),
        loss=dataclasses.replace(QWEN35.loss, compute_logps_chunk_size=16),
    )
    payloads = example_payloads_for(config, 2, prefix="chunk")
    chunked, loss, params = _trained(StandInTunixMaxTextEngine, config, payloads)
    assert chunked.info()["chunked_logps"].startswith("applied, chunk 16, via MaxText's decoder:")
    assert heads and all(shape[1] == 16 for shape in heads)  # the head ran on 16-token chunks
    heads.clear()
    # the same cell where MaxText's model call runs multi-token prediction: no decoder-only split
    full_config = dataclasses.replace(config, trainer_maxtext_keys=(("mtp_num_layers", "1"),))
    full, full_loss, full_params = _trained(StandInTunixMaxTextEngine, full_config, payloads)
    assert full.info()["chunked_logps"] == (
        "not applied: compute_logps_chunk_size=16 is not applied: MaxText's model call runs"
        " multi-token prediction besides its decoder, which hidden states from the decoder alone"
        " would leave out; the full [B, T, V] logits are computed, more device memory than the"
        " trainer's pass"
    )
    assert heads == []  # the model's own call: its full logits
    np.testing.assert_allclose(loss, full_loss, rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(params[name], full_params[name], rtol=1e-5, atol=1e-7)


def test_a_maxtext_whose_model_takes_skip_lm_head_is_used_as_it_is():
    """The dense cell: MaxText hands Tunix its Transformer (no TunixMaxTextAdapter around it)."""
    dense = PRESETS["cpu-tiny-dense"].engine
    config = dataclasses.replace(dense, model=dataclasses.replace(dense.model, vocab_size=128))
    engine, loss, _ = _trained(
        NativeHeadTunixMaxTextEngine, config, example_payloads_for(config, 1)
    )
    assert engine.info()["chunked_logps"] == (
        "applied, chunk 512, via the model's own skip_lm_head and compute_final_logits"
    )
    assert np.isfinite(loss)


def test_a_transformer_without_the_decoders_parts_has_no_split():
    class Bare:
        def __call__(self, decoder_input_tokens, decoder_positions):
            return decoder_input_tokens

    split = maxtext_head.head_split(Bare(), wrapped=False)
    assert split.kind == maxtext_head.NONE
    assert split.why == (
        "this MaxText's model call takes no skip_lm_head and its Transformer lacks decoder,"
        " token_embedder, logits_from_hidden_states_for_vocab_tiling"
    )


def test_the_sharded_head_is_said_where_this_tunix_reads_it(tmp_path, monkeypatch):
    applied = tunix_grpo.ChunkedPass(1024, "MaxText's decoder")
    package = tmp_path / "tunix"
    (package / "rl").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rl" / "common.py").write_text("HEAD = 'plain'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert tunix_grpo.sharded_head(applied) == (
        "this Tunix does not read TUNIX_LOGPS_SHARDED_HEAD: its chunked pass has one head"
    )
    (package / "rl" / "common.py").write_text("os.environ.get('TUNIX_LOGPS_SHARDED_HEAD')\n")
    assert tunix_grpo.sharded_head(applied).startswith(
        "this Tunix reads TUNIX_LOGPS_SHARDED_HEAD (rl/common.py) in the chunked pass that runs"
    )
    unapplied = tunix_grpo.ChunkedPass(0, "why")
    assert tunix_grpo.sharded_head(unapplied).endswith(
        "only in the chunked pass, which does not run"
    )
