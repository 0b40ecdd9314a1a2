"""The chunked gated delta rule against a float64 per-token recurrence of its defining formula."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gdn_reference import packed_segments, recurrence
from jax.sharding import NamedSharding, PartitionSpec

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.gated_deltanet import context_delta_rule
from rl_trainer_bench.engine.builtin.linear_attention import gated_delta_rule
from rl_trainer_bench.engine.builtin.programs import check_config
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError

HEADS, KEY_DIM, VALUE_DIM = 2, 8, 6


def reference(q, k, v, log_decay, beta, segment_ids):
    """S_t = a_t S + b_t (v_t - a_t S k_t) k_t^T, o_t = S_t q_t, per token in float64."""
    q, k, v, log_decay, beta = (np.asarray(x, np.float64) for x in (q, k, v, log_decay, beta))
    segment_ids = np.asarray(segment_ids)
    rows, length, heads, _ = q.shape
    out = np.zeros((*q.shape[:3], v.shape[-1]))
    for row in range(rows):
        state = np.zeros((heads, v.shape[-1], k.shape[-1]))
        for t in range(length):
            if t == 0 or segment_ids[row, t] != segment_ids[row, t - 1]:
                state = np.zeros_like(state)
            a, b = np.exp(log_decay[row, t]), beta[row, t]
            predicted = np.einsum("hvk,hk->hv", state, k[row, t]) * a[:, None]
            update = (b[:, None] * (v[row, t] - predicted))[:, :, None] * k[row, t][:, None, :]
            state = a[:, None, None] * state + update
            if segment_ids[row, t]:
                out[row, t] = np.einsum("hvk,hk->hv", state, q[row, t])
    return out


def random_inputs(seed, rows, length):
    rng = np.random.default_rng(seed)
    shape = (rows, length, HEADS)
    q = rng.normal(size=(*shape, KEY_DIM)) / np.sqrt(KEY_DIM)
    k = rng.normal(size=(*shape, KEY_DIM))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(*shape, VALUE_DIM))
    log_decay = -rng.uniform(0.0, 1.0, size=shape)
    beta = rng.uniform(0.0, 1.0, size=shape)
    arrays = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, log_decay, beta))
    return (*arrays, jnp.asarray(packed_segments(rng, rows, length)))


@pytest.mark.parametrize(
    ("chunk_size", "length"), [(4, 16), (4, 19), (8, 13), (16, 40), (64, 37), (128, 300)]
)
def test_chunked_form_equals_the_per_token_recurrence(chunk_size, length):
    inputs = random_inputs(chunk_size * 100 + length, 3, length)
    out = jax.jit(gated_delta_rule, static_argnames="chunk_size")(*inputs, chunk_size=chunk_size)
    np.testing.assert_allclose(np.asarray(out), reference(*inputs), atol=2e-5, rtol=1e-4)


def test_segment_start_resets_the_state_and_padding_contributes_nothing():
    """Changing the first segment leaves the second unchanged; padding may even hold NaN."""
    q, k, v, log_decay, beta, _ = random_inputs(7, 1, 24)
    segments = jnp.asarray([[1] * 10 + [2] * 11 + [0] * 3])
    rule = jax.jit(lambda *x: gated_delta_rule(*x, chunk_size=4))
    out = rule(q, k, v, log_decay, beta, segments)
    first = jnp.arange(24)[None, :, None] < 10
    padding = jnp.arange(24)[None, :, None] >= 21

    def changed(x, first_value):
        mask_first, mask_padding = (m[..., None] if x.ndim == 4 else m for m in (first, padding))
        return jnp.where(mask_padding, jnp.nan, jnp.where(mask_first, first_value(x), x))

    again = rule(
        *(changed(x, lambda x: x + 3.0) for x in (q, k, v)),
        *(changed(x, lambda x: x * 0.5) for x in (log_decay, beta)),
        segments,
    )
    np.testing.assert_array_equal(np.asarray(again[:, 21:]), 0.0)
    np.testing.assert_allclose(np.asarray(again[:, 10:]), np.asarray(out[:, 10:]), atol=1e-6)
    assert not np.allclose(np.asarray(again[:, :10]), np.asarray(out[:, :10]), atol=1e-3)


def test_gradients_equal_the_recurrences():
    inputs = random_inputs(11, 2, 18)
    weights = jax.random.normal(jax.random.key(0), (2, 18, HEADS, VALUE_DIM))

    def loss(fn):
        return lambda *x: jnp.sum(fn(*x, inputs[-1]) * weights)

    chunked = jax.jit(
        jax.grad(loss(lambda *x: gated_delta_rule(*x, chunk_size=4)), argnums=(0, 1, 2, 3, 4))
    )(*inputs[:-1])
    expected = jax.jit(jax.grad(loss(recurrence), argnums=(0, 1, 2, 3, 4)))(*inputs[:-1])
    for name, got, want in zip(
        ("q", "k", "v", "log_decay", "beta"), chunked, expected, strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, err_msg=name)


def test_context_shards_equal_one_shard_on_eight_devices():
    """T over 4 context shards (2 x 4 x 1 mesh), spans of 7 tokens padded to chunks of 4: as one
    program over the shard dim, and as the engine runs it, each device its own span under
    `shard_map` with the spans' maps gathered from its peers.

    One row is a single segment across all shards and slow decays, so every shard's incoming state
    matters; the other starts segments inside a shard and at a shard's first token (token 14), and
    ends in padding.
    """
    q, k, v, log_decay, beta, _ = random_inputs(5, 2, 28)
    inputs = (
        q,
        k,
        v,
        log_decay * 0.05,
        beta,
        jnp.asarray([[3] * 28, [1] * 5 + [2] * 9 + [4] * 11 + [0] * 3]),
    )
    weights = jax.random.normal(jax.random.key(1), (2, 28, HEADS, VALUE_DIM))
    mesh = sharding.make_mesh(MeshConfig(fsdp=2, context=4, expert=1))

    def loss(shards):
        def fn(*x):
            out = gated_delta_rule(*x, chunk_size=4, context_shards=shards)
            return jnp.sum(out * weights), out

        return jax.value_and_grad(fn, argnums=(0, 1, 2, 3, 4), has_aux=True)

    (_, single), single_grads = jax.jit(loss(1))(*inputs)
    np.testing.assert_allclose(np.asarray(single), reference(*inputs), atol=2e-5, rtol=1e-4)
    placed = [
        jax.device_put(x, NamedSharding(mesh, PartitionSpec(("fsdp", "expert"), "context")))
        for x in inputs
    ]
    with jax.set_mesh(mesh):
        (_, split), split_grads = jax.jit(loss(4))(*placed)
        (_, mapped), mapped_grads = jax.jit(
            jax.value_and_grad(
                lambda *x: (lambda out: (jnp.sum(out * weights), out))(
                    context_delta_rule(*x, inputs[-1], chunk_size=4)
                ),
                argnums=(0, 1, 2, 3, 4),
                has_aux=True,
            )
        )(*placed[:-1])
    for name, out, grads in (
        ("one program", split, split_grads),
        ("per device", mapped, mapped_grads),
    ):
        np.testing.assert_allclose(
            np.asarray(out), np.asarray(single), atol=2e-5, rtol=1e-4, err_msg=name
        )
        for got, want in zip(grads, single_grads, strict=True):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4, err_msg=name
            )


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"layer_types": ("linear_attention", "mamba")}, "engine config layer_types="),
        ({"num_layers": 3}, "engine config num_layers=3: must be a multiple of len(layer_types)"),
        ({"linear_num_value_heads": 3}, "engine config linear_num_value_heads=3"),
        ({"linear_key_head_dim": 0}, "engine config linear_* shapes="),
    ],
)
def test_bad_layer_pattern_or_linear_shapes_are_refused_naming_the_field(changes, named):
    tiny = PRESETS["cpu-tiny"].engine
    hybrid = dataclasses.replace(
        tiny.model,
        layer_types=("linear_attention", "full_attention"),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    check_config(dataclasses.replace(tiny, model=hybrid))
    bad = dataclasses.replace(tiny, model=dataclasses.replace(hybrid, **changes))
    with pytest.raises(ContractError, match=re.escape(named)):
        check_config(bad)


@pytest.mark.parametrize("size", [1, 6, 16])
def test_the_blocked_inverse_solves_like_xlas_triangular_solve_in_value_and_gradient(size):
    """Chunks of a power of two and not: the doubling blocks against XLA's triangular solve, and
    its own backward pass against autodiff of that solve."""
    from rl_trainer_bench.engine.builtin.linear_attention import unit_lower_solve

    keys = jax.random.split(jax.random.key(size), 3)
    strict = jnp.tril(jax.random.normal(keys[0], (3, 2, size, size)) * 0.3, -1)
    rhs = jax.random.normal(keys[1], (3, 2, size, 5))
    weights = jax.random.normal(keys[2], rhs.shape)

    def xla(a, b):
        system = a + jnp.eye(size)
        return jax.lax.linalg.triangular_solve(
            system, b, left_side=True, lower=True, unit_diagonal=True
        )

    def loss(solve):
        return lambda a, b: jnp.sum(jnp.sin(solve(a, b)) * weights)

    np.testing.assert_allclose(
        jax.jit(unit_lower_solve)(strict, rhs), xla(strict, rhs), rtol=1e-5, atol=1e-5
    )
    got_a, got_b = jax.jit(jax.grad(loss(unit_lower_solve), argnums=(0, 1)))(strict, rhs)
    want_a, want_b = jax.jit(jax.grad(loss(xla), argnums=(0, 1)))(strict, rhs)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-4, atol=1e-5)
    # Only the strictly lower part is a variable of the system.
    np.testing.assert_allclose(got_a, jnp.tril(want_a, -1), rtol=1e-4, atol=1e-5)


def test_the_convolution_stops_at_segment_starts_across_context_shards():
    """Per device of the 2x2x2 mesh (T over 2 context shards), against taps summed per token:
    a segment that crosses the shard boundary reads the previous shard's tokens, one that starts
    there does not, and no token reads across a segment start or before its row."""
    from rl_trainer_bench.engine.builtin.gated_deltanet import context_conv

    rows, length, width, taps = 4, 12, 3, 4
    x = jax.random.normal(jax.random.key(4), (rows, length, width))
    kernel = jax.random.normal(jax.random.key(5), (taps, width))
    segments = np.array(
        [
            [1] * 12,  # one segment across the boundary at 6
            [1] * 6 + [2] * 6,  # a segment starts at the boundary
            [1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 0, 0],  # starts inside shards, ends in padding
            [5] * 4 + [0] * 3 + [5] * 5,  # the same id again after padding is a new segment
        ]
    )
    want = np.zeros((rows, length, width))
    xs, ks = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    for r in range(rows):
        for t in range(length):
            for j in range(taps):
                if t - j < 0 or len(set(segments[r, t - j : t + 1])) > 1:
                    break
                want[r, t] += xs[r, t - j] * ks[j]
    want = want / (1 + np.exp(-want))  # SiLU
    mesh = sharding.make_mesh(MeshConfig(fsdp=2, context=2, expert=2))
    with jax.set_mesh(mesh):
        got = jax.jit(context_conv)(x, kernel, jnp.asarray(segments))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
