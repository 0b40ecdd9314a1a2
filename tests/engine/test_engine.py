"""The built-in engine on 8 host CPU devices as a 2x2x2 mesh, against a plain float32 reference.

Compiling is the slow part on 2 cores, so the tests share two configs (compiled programs are
reused across engines of one config) and build fresh engines where they need fresh state.
"""

import dataclasses
import gc
import re
import threading
import time

import gdn_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import input_copy, jax_engine
from rl_trainer_bench.engine.builtin.flops import micro_batch_flops
from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.builtin.programs import abstract_state, lower_programs
from rl_trainer_bench.engine.builtin.sharding import make_mesh
from rl_trainer_bench.engine.config import MeshConfig, MoeConfig
from rl_trainer_bench.engine.contract import ContractError, Engine, example_payload

# cpu-tiny at buffer factor 1.0: random routes overflow now and then, forced ones always do.
CONFIG = dataclasses.replace(
    PRESETS["cpu-tiny"].engine, moe=MoeConfig(ragged_buffer_factor=1.0, expert_compute="einsum")
)
MODEL = CONFIG.model
# CONFIG with one full-attention layer, for the tests whose check does not depend on the mixers
# (how programs compile, where the routing is read, where the optimizer state rests): smaller
# programs than CONFIG's, without its Gated DeltaNet layer, the slower of its two to compile.
ONE_LAYER = dataclasses.replace(
    CONFIG, model=dataclasses.replace(MODEL, layer_types=("full_attention",), num_layers=1)
)


def payload(seed=0, rows=CONFIG.micro_batch_rows, config=CONFIG, **kw):
    model = config.model
    return example_payload(
        rows,
        config.seq_len,
        model.vocab_size,
        num_layers=model.num_layers,
        top_k=model.top_k,
        num_experts=model.num_experts,
        segment_len=kw.pop("segment_len", 48),
        seed=seed,
        name=f"mb{seed}",
        **kw,
    )


@pytest.fixture(scope="module")
def compiled():
    """Compile CONFIG's programs once; later engines of CONFIG reuse them."""
    engine = JaxEngine(CONFIG)
    return engine.compile(payload())


def fresh_engine(compiled, config=CONFIG, replay=False):
    """An engine of `config` over its compiled programs; `replay`: its dropless replay's too (a
    run whose micro-batches drop pairs)."""
    engine = JaxEngine(config)
    if replay:
        engine.will_run([overflowing(seed=2, config=config)])
    engine.compile(payload(rows=config.micro_batch_rows, config=config))
    return engine


# ----------------------------------------------------------------------------------------------
# A plain float32 reference: unsharded, unchunked, dense experts, written for clarity.
# ----------------------------------------------------------------------------------------------


def _rms(x, scale):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + MODEL.rms_norm_eps) * scale


def _rope(x, positions):
    half = x.shape[-1] // 2
    freq = MODEL.rope_theta ** (-np.arange(half) / half)
    angle = positions[:, :, None, None] * freq
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate(
        [a * jnp.cos(angle) - b * jnp.sin(angle), b * jnp.cos(angle) + a * jnp.sin(angle)], -1
    )


def _swiglu(x, gate, up, down):
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


def reference_loss_sum(params, a):
    """GRPO loss (beta 0) of one micro-batch summed over its loss tokens, every expert pair kept;
    and the count of those tokens."""
    seg, pos = jnp.asarray(a["segment_ids"]), jnp.asarray(a["positions"], jnp.float32)
    t = seg.shape[1]
    x = params["embed"][a["input_ids"]]
    causal = np.tril(np.ones((t, t), bool))
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & causal
    groups = MODEL.num_heads // MODEL.num_kv_heads
    pattern = MODEL.layer_types
    for layer in range(MODEL.num_layers):
        kind = pattern[layer % len(pattern)]
        of_kind = [i for i in range(MODEL.num_layers) if pattern[i % len(pattern)] == kind]
        mixer = {  # this layer's mixer weights, stacked over the layers of its kind
            name: value[of_kind.index(layer)]
            for name, value in params.items()
            if name.startswith(
                ("gdn_",) if kind == "linear_attention" else ("wq", "wk", "wv", "wo")
            )
        }
        w = {name: params[name][layer] for name in ("router", "expert_gate", "expert_up")}
        w |= {name: params[name][layer] for name in ("expert_down", "shared_gate", "shared_up")}
        w |= {"shared_down": params["shared_down"][layer]}
        h = _rms(x, params["attn_norm"][layer])
        if kind == "linear_attention":
            x = x + gdn_reference.layer(h, mixer, seg, MODEL)
        else:
            q = _rope(jnp.einsum("btd,dhk->bthk", h, mixer["wq"]), pos)
            k = jnp.repeat(_rope(jnp.einsum("btd,dhk->bthk", h, mixer["wk"]), pos), groups, axis=2)
            v = jnp.repeat(jnp.einsum("btd,dhk->bthk", h, mixer["wv"]), groups, axis=2)
            scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(MODEL.head_dim)
            attn = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e30), axis=-1)
            out = jnp.einsum("bhqs,bshk->bqhk", attn, v) * (seg != 0)[:, :, None, None]
            if "wq_gate" in mixer:
                out = out * jax.nn.sigmoid(jnp.einsum("btd,dhk->bthk", h, mixer["wq_gate"]))
            x = x + jnp.einsum("bthk,hkd->btd", out, mixer["wo"])
        h = _rms(x, params["mlp_norm"][layer])
        probs = jax.nn.softmax(h @ params["router"][layer], axis=-1)
        chosen = jnp.asarray(a["routed_experts"][:, :, layer, :], jnp.int32)
        gates = jnp.where(chosen >= 0, jnp.take_along_axis(probs, jnp.maximum(chosen, 0), -1), 0)
        gates = gates / jnp.maximum(gates.sum(-1, keepdims=True), 1e-9)
        ffn = _swiglu(h, w["shared_gate"], w["shared_up"], w["shared_down"])
        for e in range(MODEL.num_experts):
            weight = jnp.sum(jnp.where(chosen == e, gates, 0.0), axis=-1, keepdims=True)
            ffn = ffn + weight * _swiglu(
                h, w["expert_gate"][e], w["expert_up"][e], w["expert_down"][e]
            )
        x = x + ffn
    logits = _rms(x, params["final_norm"]) @ params["head"]
    targets = jnp.concatenate([a["input_ids"][:, 1:], jnp.zeros_like(a["input_ids"][:, :1])], 1)
    next_seg = jnp.concatenate(
        [a["segment_ids"][:, 1:], jnp.zeros_like(a["segment_ids"][:, :1])], 1
    )
    m = (a["completion_mask"] != 0) & (a["segment_ids"] != 0) & (next_seg == a["segment_ids"])
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    ratio = jnp.exp(logp - a["old_logps"])
    clipped = jnp.clip(ratio, 1 - CONFIG.loss.epsilon, 1 + CONFIG.loss.epsilon_high)
    token = -jnp.minimum(ratio * a["advantages"], clipped * a["advantages"])
    return jnp.sum(token * m), m.sum()


@jax.jit
def reference_sum_and_grad(params, arrays):
    """The summed loss, its gradient, and the count of loss tokens: summed over micro-batches and
    divided by their count, the token mean of them all (compiled once, for CONFIG's rows)."""
    (total, count), grads = jax.value_and_grad(reference_loss_sum, has_aux=True)(params, arrays)
    return total, grads, count


def reference_value_and_grad(params, *micro_batches):
    """The token-mean loss over every loss token of `micro_batches`, and its gradient."""
    sums = [reference_sum_and_grad(params, arrays) for arrays in micro_batches]
    count = sum(c for _, _, c in sums)
    loss = sum(total for total, _, _ in sums) / count
    return loss, {name: sum(g[name] for _, g, _ in sums) / count for name in sums[0][1]}


def reference_params(engine):
    return {k: np.asarray(v) for k, v in jax.device_get(engine._state.params).items()}


def assert_gradients_close(got, want):
    for name in want:
        scale = np.abs(want[name]).max() + 1e-12
        np.testing.assert_allclose(got[name] / scale, want[name] / scale, atol=2e-4, err_msg=name)


# ----------------------------------------------------------------------------------------------


def test_loss_and_gradient_match_the_float32_reference(compiled):
    engine = fresh_engine(compiled)
    p = payload(seed=1)
    params = reference_params(engine)
    want_loss, want_grads = reference_value_and_grad(params, p.arrays())
    engine.fwd_bwd(p)
    assert_gradients_close(engine.accumulated_gradient(), want_grads)
    engine.update()
    np.testing.assert_allclose(engine.get_metrics()["loss"], want_loss, rtol=1e-5)


def overflowing(seed, config=CONFIG):
    """A payload whose every token routes to experts 0..K-1: each group drops pairs."""
    p = payload(seed=seed, config=config)
    forced = np.where(p.routed_experts >= 0, np.arange(config.model.top_k, dtype=np.int16), -1)
    return dataclasses.replace(p, routed_experts=forced.astype(np.int16), digests={})


def test_forced_overflow_is_detected_replayed_once_and_gives_the_dropless_gradient(compiled):
    engine = fresh_engine(compiled)
    p = overflowing(seed=2)
    _, want_grads = reference_value_and_grad(reference_params(engine), p.arrays())
    engine.fwd_bwd(p)
    assert_gradients_close(engine.accumulated_gradient(), want_grads)
    engine.update()
    metrics = engine.get_metrics()
    assert metrics["overflow_count"] == 1 and metrics["replay_count"] == 1


def test_micro_batches_accumulate_to_the_gradient_of_one_batch_of_all_rows(compiled):
    engine = fresh_engine(compiled)
    first, second = payload(seed=3), payload(seed=4)
    # Unequal completion counts: averaging per-micro-batch means would differ from the step's
    # token mean only then.
    fewer = second.completion_mask.copy()
    fewer[:, : CONFIG.seq_len // 2] = 0
    second = dataclasses.replace(second, completion_mask=fewer, digests={})
    assert 0 < np.count_nonzero(fewer) < np.count_nonzero(first.completion_mask)
    # one batch of all rows: the sums of its two halves over the count of all their loss tokens
    want_loss, want_grads = reference_value_and_grad(
        reference_params(engine), first.arrays(), second.arrays()
    )
    engine.fwd_bwd(first)
    engine.fwd_bwd(second)
    assert_gradients_close(engine.accumulated_gradient(), want_grads)
    engine.update()
    metrics = engine.get_metrics()
    tokens = np.count_nonzero(first.completion_mask) + np.count_nonzero(fewer)
    assert metrics["loss_denominator"] == float(tokens)
    np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5)


# One micro-batch of sequences (prompt tokens, completion tokens, advantage) packed per row; the
# completion counts differ, so a token mean and a mean of per-sequence means disagree.
UNEQUAL_SEQUENCES = [
    [(20, 60, 0.5), (10, 8, 2.0)],
    [(30, 90, 1.0)],
    [(8, 4, 3.0), (16, 40, 0.25), (10, 20, 1.5)],
    [(50, 70, 0.75)],
]


def _packed(sequences_by_row, seed=0):
    """A payload packing each row's (prompt, completion, advantage) sequences from position 0, the
    loss mask on the completion tokens' predecessors, and every old log-prob at -40."""
    shape = (CONFIG.micro_batch_rows, CONFIG.seq_len)
    segments, positions, mask = (
        np.zeros(shape, np.int32),
        np.zeros(shape, np.int32),
        np.zeros(shape, np.int32),
    )
    advantages = np.zeros(shape, np.float32)
    for row, sequences in enumerate(sequences_by_row):
        start = 0
        for number, (prompt, completion, advantage) in enumerate(sequences, start=1):
            end = start + prompt + completion
            segments[row, start:end] = number
            positions[row, start:end] = np.arange(end - start)
            advantages[row, start:end] = advantage
            mask[row, start + prompt - 1 : end - 1] = 1  # predicts a completion token
            start = end
    rng = np.random.default_rng(seed)
    scores = rng.random((*shape, MODEL.num_layers, MODEL.num_experts))
    routed = np.argsort(scores, axis=-1)[..., : MODEL.top_k].astype(np.int16)
    routed[segments == 0] = -1
    return dataclasses.replace(
        payload(seed=seed),
        input_ids=rng.integers(0, MODEL.vocab_size, shape, dtype=np.int32),
        segment_ids=segments,
        positions=positions,
        completion_mask=mask,
        advantages=advantages,
        old_logps=np.full(shape, -40.0, np.float32),
        routed_experts=routed,
        digests={},
    )


def test_one_micro_batch_loss_is_the_token_mean_over_sequences_of_unequal_length(compiled):
    """Old log-probs of -40 put every ratio far above 1 + epsilon_high (the model's log-probs are
    near -log 512), so each loss token costs exactly -(1 + 0.28) x its sequence's advantage,
    whatever the weights: the loss is -1.28 x sum(advantage x completion tokens) / 292 tokens =
    -1.28 x 240.5 / 292; a mean of per-sequence means would be -1.28 x 9 / 7."""
    assert CONFIG.loss.epsilon_high == 0.28 and CONFIG.loss.beta == 0.0
    engine = fresh_engine(compiled)
    engine.fwd_bwd(_packed(UNEQUAL_SEQUENCES))
    engine.update()
    metrics = engine.get_metrics()
    assert metrics["loss_denominator"] == 292.0
    np.testing.assert_allclose(metrics["loss"], -1.28 * 240.5 / 292, rtol=1e-6)


def test_prepared_input_trains_bit_identically_to_the_plain_payload(compiled):
    plain, staged = fresh_engine(compiled), fresh_engine(compiled)
    first, second = payload(seed=5), payload(seed=6)
    plain.fwd_bwd(first)
    plain.fwd_bwd(second)
    plain.update()
    prepared = staged.prepare_fwd_bwd_input(first)
    assert prepared.name == "mb5" and prepared.issue_seconds >= 0
    assert staged.wait_for_device() >= 0 and prepared.ready_at is not None
    staged.fwd_bwd(prepared)
    staged.fwd_bwd(second)
    staged.update()
    assert staged.parameter_digest() == plain.parameter_digest()
    assert staged.get_metrics() == plain.get_metrics()


def test_prepare_returns_before_its_copy_is_done_and_the_copy_arrives_whole(compiled, monkeypatch):
    """A staged copy that takes 0.6 s (a stand-in for a slow link): the staging call returns at
    once, the arrays are not there yet, and waiting for the device waits for them."""
    whole = input_copy.InputCopy.whole

    def slow_copy(self, arrays):
        time.sleep(0.6)
        return whole(self, arrays)

    engine = fresh_engine(compiled)
    monkeypatch.setattr(input_copy.InputCopy, "whole", slow_copy)
    started = time.perf_counter()
    prepared = engine.prepare_fwd_bwd_input(payload(seed=8))
    assert time.perf_counter() - started < 0.3 and prepared.issue_seconds < 0.3
    assert prepared.ready_at is None
    assert engine.wait_for_device() > 0.3 and prepared.ready_at is not None
    np.testing.assert_array_equal(
        np.asarray(prepared.arrays["input_ids"]), payload(seed=8).input_ids
    )
    assert engine.info()["input_copy"] == "host->device, each array whole: none cut"


def test_train_step_moves_only_in_update_and_metrics_are_complete(compiled):
    engine = fresh_engine(compiled)
    assert isinstance(engine, Engine) and engine.get_metrics() == {}
    p = payload(seed=7)
    engine.fwd_bwd(p)
    engine.fwd_bwd(p)
    assert engine.train_step == 0 and engine.completion_marker() is not None
    assert engine.update() == 1 and engine.train_step == 1
    metrics = engine.get_metrics(clear_cache=False)
    assert metrics["tokens"] == 2 * int(np.count_nonzero(p.segment_ids))
    assert metrics["loss_denominator"] == 2 * float(np.count_nonzero(p.completion_mask))
    assert metrics["mult_prob_error_max"] > 0 and metrics["grad_norm"] > 0
    assert engine.get_metrics() == metrics and engine.get_metrics() == {}
    # the run's header names the engine as the ENGINE knob does, not a second name
    assert engine.info()["engine"] == "rl_trainer_bench.engine.builtin.jax_engine:JaxEngine"


def test_check_engine_command_passes_the_built_in_engine(compiled, capsys):
    code = cli.main(
        [
            "check-engine",
            "--preset",
            "cpu-tiny",
            "--engine-flags",
            "ragged_buffer_factor=1.0 expert_compute=einsum",
        ]
    )
    assert code == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "conforms" in out
    # cpu-tiny's state (5,359,120 bytes of parameters and moments, the 5.36 MB of
    # benchmarks/reports/ab-one-state_cpu_2026-12-04.md, and
    # a few scalars) trained by a second engine, then the first again, with nothing copied: the
    # bytes beside the first engine's stay within a few scalars
    measured = re.search(
        r"check-engine: share_state: a second engine over the state \(([\d,]+) bytes\) stepped,"
        r" then the first again; live arrays beside the first engine's: ([+-][\d,]+) bytes once"
        r" built, ([+-][\d,]+) after its step, ([+-][\d,]+) after the first's",
        out,
    )
    assert measured, out
    state, *growth = (int(figure.replace(",", "")) for figure in measured.groups())
    assert 5_359_120 <= state <= 5_359_120 + 64
    assert all(abs(grown) <= 1024 for grown in growth), growth


class _LateBackground(jax_engine.Background):
    """The engine's initial state made a second late: it arrives after the engine is built, as it
    may on a loaded host. Its other background calls (the compiles, the digest) run as they do."""

    def __init__(self, call, name):
        delay = 1.0 if name == "engine-initial-state" else 0.0
        super().__init__(lambda: (time.sleep(delay), call())[1], name)


@pytest.mark.parametrize("late_state", [False, True], ids=["state-on-time", "state-late"])
def test_check_engine_fails_a_share_state_that_allocates_a_state(
    compiled, capsys, monkeypatch, late_state
):
    """An engine whose share_state builds an engine with a state of its own: check-engine names
    share_state (a whole state more) and take_shared_state (its update does not continue the
    first engine's state); also when the state is made after the engine is built."""
    monkeypatch.setattr(JaxEngine, "share_state", lambda self, config: JaxEngine(config))
    if late_state:
        monkeypatch.setattr(jax_engine, "Background", _LateBackground)
    code = cli.main(
        [
            "check-engine",
            "--preset",
            "cpu-tiny",
            "--engine-flags",
            "ragged_buffer_factor=1.0 expert_compute=einsum",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert re.search(
        r"check-engine: FAIL share_state: building the second engine added 5,359,1\d\d bytes"
        r" \(100% of the state's 5,359,1\d\d\) to the live arrays: it allocated a state of its own",
        out,
    ), out
    assert (
        "check-engine: FAIL take_shared_state: the second engine's update returned train step 1,"
        " not 3"
    ) in out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda p: {"input_ids": p.input_ids[:, :-1]}, "field input_ids is int32"),
        (lambda p: {"advantages": p.advantages.astype(np.float64)}, "field advantages is float64"),
        (lambda p: {"routed_experts": np.full_like(p.routed_experts, 8)}, "expert id 8"),
        (lambda p: {"routed_experts": None}, "field routed_experts is missing"),
    ],
)
def test_bad_payload_raises_one_error_naming_the_field(compiled, change, named):
    engine = fresh_engine(compiled)
    p = payload(seed=8)
    bad = dataclasses.replace(p, **change(p), digests={})
    with pytest.raises(ContractError, match=named):
        engine.fwd_bwd(bad)


def test_mesh_that_does_not_match_the_devices_is_refused():
    with pytest.raises(ContractError, match="x expert=1 = 4 devices, but 8 are available"):
        JaxEngine(dataclasses.replace(CONFIG, mesh=MeshConfig(fsdp=2, context=2, expert=1)))
    with pytest.raises(ContractError, match="micro_batch_rows=6: must be a positive multiple"):
        JaxEngine(dataclasses.replace(CONFIG, micro_batch_rows=6))


def test_lowering_allocates_nothing_and_covers_every_program():
    """ONE_LAYER's programs: what lowering allocates does not depend on the mixers, and they lower
    in under half of CONFIG's time."""
    mesh = make_mesh(ONE_LAYER.mesh)
    gc.collect()  # earlier tests' arrays may be collected during the lowering: count only new ones
    before = {id(array) for array in jax.live_arrays()}
    lowered = lower_programs(ONE_LAYER, mesh)
    state = abstract_state(ONE_LAYER, mesh)
    assert [array for array in jax.live_arrays() if id(array) not in before] == []
    assert set(lowered) == {"fwd_bwd", "fwd_bwd_dropless", "update"}
    assert state["params"]["expert_gate"].shape == (1, 8, 64, 64)
    assert set(state) == {"params", "opt_state", "grad_accum"}


def test_model_flops_follow_the_accounting():
    """cpu-tiny made hybrid: one gated full-attention layer, one Gated DeltaNet (docs/engine.md)."""
    p = payload(seed=9)
    m = dataclasses.replace(
        MODEL,
        attention_output_gate=True,
        layer_types=("linear_attention", "full_attention"),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_chunk_size=32,
    )
    hybrid = dataclasses.replace(CONFIG, model=m)
    assert m.num_layers == 2
    tokens = int(np.count_nonzero(p.segment_ids))
    attention = (
        3 * m.d_model * m.num_heads * m.head_dim + 2 * m.d_model * m.num_kv_heads * m.head_dim
    )
    keys = m.linear_num_key_heads * m.linear_key_head_dim
    values = m.linear_num_value_heads * m.linear_value_head_dim
    linear = m.d_model * (2 * keys + 3 * values + 2 * m.linear_num_value_heads)
    linear += m.linear_conv_kernel_dim * (2 * keys + values)
    ffn = m.d_model * m.num_experts + 3 * m.d_model * (
        m.top_k * m.expert_ffn_dim + m.shared_expert_ffn_dim
    )
    squares = CONFIG.micro_batch_rows * (CONFIG.seq_len // 48) * 48**2 / 2
    want = 6 * tokens * (attention + linear + 2 * ffn + m.d_model * m.vocab_size)
    want += 12 * m.num_heads * m.head_dim * squares
    c, dk, dv = m.linear_chunk_size, m.linear_key_head_dim, m.linear_value_head_dim
    want += 6 * tokens * m.linear_num_value_heads * (2 * c * dk + c * (dk + dv) / 2 + c * dv)
    want += 6 * tokens * m.linear_num_value_heads * 3 * dk * dv
    assert micro_batch_flops(hybrid, p.segment_ids, count_remat=False) == pytest.approx(want)
    assert micro_batch_flops(hybrid, p.segment_ids, count_remat=True) == pytest.approx(4 / 3 * want)


# The formulation before the pairs were counted and the head's gradient written by hand.
SORTED_AUTODIFF = dataclasses.replace(
    ONE_LAYER,
    moe=dataclasses.replace(ONE_LAYER.moe, pair_ranking="sort"),
    loss=dataclasses.replace(ONE_LAYER.loss, logps_gradient="autodiff"),
)


def test_the_backward_pass_reads_the_routing_rather_than_sorting_again(compiled):
    """One sort of the routed pairs per layer kind in each forward-backward program when pairs
    are ranked by a sort (none when counted): the layer's remat keeps the routing (moe.ROUTING)
    instead of recomputing it in the backward pass. The programs read are the engines' own, of
    ONE_LAYER (one layer kind; the routing is the MoE layer's whatever the mixer), which the next
    test trains."""
    for config, sorts in ((SORTED_AUTODIFF, 1), (ONE_LAYER, 0)):
        programs = fresh_engine(compiled, config, replay=True)._compiled
        for name in ("fwd_bwd", "fwd_bwd_dropless"):
            hlo = programs[name].as_text()
            assert len(re.findall(r" sort\(", hlo)) == sorts, (name, config.moe.pair_ranking)


def test_counted_ranks_and_the_saved_lse_gradient_train_as_sort_and_autodiff_did(compiled):
    """The defaults (pairs counted, the head's gradient by hand) against the previous formulation
    on the same micro-batches: the same loss to 1e-6 relative and the same gradient to 1e-5 of
    each weight's largest entry (float32: only summation order differs), overflows alike. ONE_LAYER:
    ranking pairs and the head's gradient do not depend on the mixers."""
    new, old = fresh_engine(compiled, ONE_LAYER), fresh_engine(compiled, SORTED_AUTODIFF)
    for seed in (1, 2):
        for engine in (new, old):
            engine.fwd_bwd(payload(seed=seed, config=ONE_LAYER))
    got, want = new.accumulated_gradient(), old.accumulated_gradient()
    for name in want:
        scale = np.abs(want[name]).max() + 1e-12
        np.testing.assert_allclose(got[name] / scale, want[name] / scale, atol=1e-5, err_msg=name)
    for engine in (new, old):
        engine.update()
    got, want = new.get_metrics(), old.get_metrics()
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    assert got["overflow_count"] == want["overflow_count"]


def test_an_offloaded_optimizer_state_rests_in_host_memory_and_trains_the_same(compiled):
    """optimizer_memory_host_offload: the state between programs is in pinned host memory, the
    report counts it there (nothing beside fwd_bwd), and two steps give the same parameters (of
    ONE_LAYER: where the state rests does not depend on the mixers)."""
    from rl_trainer_bench.engine import residency
    from rl_trainer_bench.engine.builtin import programs

    offload = dataclasses.replace(
        ONE_LAYER, optimizer=dataclasses.replace(ONE_LAYER.optimizer, memory_host_offload=True)
    )
    engines = [fresh_engine(compiled, ONE_LAYER), fresh_engine(compiled, offload)]
    for engine in engines:
        for step in range(2):
            engine.fwd_bwd(payload(seed=20 + step, config=ONE_LAYER))
            engine.update()
    plain, offloaded = (e._state for e in engines)
    kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(offloaded.opt_state)}
    assert kinds == {"pinned_host"}
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(offloaded.params)} == {"device"}
    for got, want in zip(jax.tree.leaves(offloaded), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    mesh = make_mesh(ONE_LAYER.mesh)
    state = programs.state_beside(offload, mesh)
    resident = programs.state_beside(ONE_LAYER, mesh)
    assert state["opt_state"] == 0 and state["host_memory"] == resident["opt_state"] > 0
    assert residency.beside("fwd_bwd", state) == 0


def test_program_memory_is_aots_peak_of_the_same_programs(compiled):
    """MEASURE_PEAK prints the engine's figures as aot's peak: the same sum aot's own rows make,
    for the programs the run compiled."""
    from rl_trainer_bench.engine import residency
    from rl_trainer_bench.preflight.aot.check import state_bytes
    from rl_trainer_bench.preflight.aot.compile import compile_programs

    engine = fresh_engine(compiled, replay=True)
    figures = engine.program_memory()
    state = state_bytes(CONFIG, engine.mesh, stage_before_update=True)
    rows = {name: row for name, _, row in compile_programs(CONFIG, engine.mesh)}
    assert set(figures) == set(rows) == {"fwd_bwd", "fwd_bwd_dropless", "update"}
    for name, row in rows.items():
        assert figures[name]["temp"] == row.temp
        assert figures[name]["beside"] == residency.beside(name, state) > 0
        assert figures[name]["peak"] == row.resident + residency.beside(name, state)


def test_the_programs_compile_side_by_side(monkeypatch):
    """Each program's compile starts before any finishes: the three meet at a barrier inside their
    compiles, which a compile one after another would never reach (its first waits alone). The
    run has a micro-batch that drops pairs (`will_run`), so the dropless replay compiles with the
    others (without one it waits: test_pair_drops.py). ONE_LAYER's programs, as the routing test
    compiles them: how they compile does not depend on the model, and where JAX's cache holds them
    from that test each still compiles through `_compile`, only sooner."""
    meeting = threading.Barrier(3, timeout=60)
    compile_now = jax_engine._compile

    def meet_then_compile(lowered, options):
        meeting.wait()
        return compile_now(lowered, options)

    monkeypatch.setattr(jax_engine, "_compile", meet_then_compile)
    monkeypatch.setattr(jax_engine, "_COMPILED", {})
    engine = JaxEngine(ONE_LAYER)
    engine.will_run([overflowing(seed=2, config=ONE_LAYER)])
    seconds = engine.compile(payload(config=ONE_LAYER))
    assert set(seconds) == {"fwd_bwd", "fwd_bwd_dropless", "update"}
    assert all(s > 0 for s in seconds.values())
