"""MoE routing, buffers and expert compute, on small arrays (no engine, no mesh)."""

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.engine import moe
from rl_trainer_bench.engine.config import expert_capacity


def test_slots_are_taken_in_token_order_and_pairs_past_capacity_drop():
    experts = jnp.array([[0, 1], [0, 2], [0, 1], [3, -1]])  # expert 0 wanted by tokens 0, 1, 2
    x = jnp.arange(4.0)[:, None] * jnp.ones((4, 3))
    buffer, slot, overflow = moe.dispatch(x, experts, num_experts=4, slots=2)
    assert bool(overflow)
    np.testing.assert_array_equal(buffer[0, :, 0], [0.0, 1.0])  # tokens 0 and 1 got expert 0
    assert int(slot[2, 0]) == 4 * 2  # token 2's pair to expert 0 dropped (spare row)
    assert int(slot[3, 1]) == 4 * 2  # the empty slot takes no buffer slot
    np.testing.assert_array_equal(buffer[1, :, 0], [0.0, 2.0])  # expert 1: tokens 0 and 2


def test_dropless_capacity_never_overflows():
    experts = jnp.tile(jnp.array([[0, 1]]), (16, 1))  # every token to the same two experts
    slots = expert_capacity(16, top_k=2, num_experts=8, factor=-1)
    _, _, overflow = moe.dispatch(jnp.ones((16, 4)), experts, num_experts=8, slots=slots)
    assert slots == 16 and not bool(overflow)


def test_replay_uses_exactly_the_given_experts_and_empty_slots_weigh_nothing():
    x = jax.random.normal(jax.random.key(0), (5, 8))
    router = jax.random.normal(jax.random.key(1), (8, 6))
    replayed = jnp.array([[5, 2], [0, -1], [3, 4], [1, 0], [2, 5]])
    valid = jnp.array([True, True, True, True, False])
    experts, gates = moe.route(x, router, 2, valid, replayed)
    np.testing.assert_array_equal(experts[:4], replayed[:4])
    np.testing.assert_array_equal(experts[4], [-1, -1])  # padding routes nowhere
    probs = jax.nn.softmax(x @ router)
    np.testing.assert_allclose(gates[1], [1.0, 0.0], rtol=1e-6)
    expected = probs[0, jnp.array([5, 2])] / probs[0, jnp.array([5, 2])].sum()
    np.testing.assert_allclose(gates[0], expected, rtol=1e-5)


def test_einsum_and_ragged_dot_agree_on_the_same_buffers():
    buffer = jax.random.normal(jax.random.key(0), (2, 3, 4, 5, 8))  # [Gr, Gc, E, C, D]
    gate, up, down = (
        jax.random.normal(jax.random.key(i), shape)
        for i, shape in ((1, (4, 8, 6)), (2, (4, 8, 6)), (3, (4, 6, 8)))
    )
    einsum = moe.experts_ffn(buffer, gate, up, down, "einsum")
    ragged = moe.experts_ffn(buffer, gate, up, down, "ragged_dot")
    np.testing.assert_allclose(einsum, ragged, rtol=1e-5, atol=1e-5)


def test_grouping_tokens_by_device_round_trips():
    x = jnp.arange(4 * 6 * 2).reshape(4, 6, 2)
    grouped = moe.group_tokens(x, 2, 3)
    assert grouped.shape == (2, 3, 4, 2)
    np.testing.assert_array_equal(grouped[1, 2, :, 0], x[2:4, 4:6, 0].reshape(-1))
    np.testing.assert_array_equal(moe.ungroup_tokens(grouped, 4, 6), x)
