"""`fwd_bwd`'s gradient sum, added layer by layer in the backward pass (docs/engine.md, "The
gradient sum"), against JAX's autodiff of the same loss added after it.

Two blocks of (linear, linear, full) layers, so a block holds a run of two layers of one mixer and
every weight's rows come from both the block index and the place in its run. With
`scan_layers=false` the same trips run one after another: `model.layer_loop` against `lax.scan`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from config_payloads import config_payload

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import model, programs, sharding
from rl_trainer_bench.engine.builtin.loss import micro_batch_loss
from rl_trainer_bench.engine.config import MeshConfig, MoeConfig

TINY = PRESETS["cpu-tiny"].engine
CONFIG = dataclasses.replace(
    TINY,
    model=dataclasses.replace(
        TINY.model,
        num_layers=6,
        layer_types=("linear_attention", "linear_attention", "full_attention"),
    ),
    mesh=MeshConfig(),
    # buffers of two even shares: random routes fit them, forced routes overflow them (each of
    # the first experts takes every real token of a group), and a micro-batch that overflows is
    # replayed later
    moe=MoeConfig(ragged_buffer_factor=2.0, expert_compute="einsum"),
    micro_batch_rows=1,
    seq_len=64,
)
MODEL = CONFIG.model
FACTOR = CONFIG.moe.ragged_buffer_factor


def _batch(seed, forced=False):
    arrays = config_payload(CONFIG, seed).arrays()
    if forced:  # every pair to the first experts: past their buffers in every layer
        routes = arrays["routed_experts"]
        arrays["routed_experts"] = np.where(routes >= 0, np.arange(MODEL.top_k), -1).astype(
            routes.dtype
        )
    return {name: jnp.asarray(a) for name, a in arrays.items()}


@pytest.fixture(scope="module")
def setup():
    mesh = sharding.make_mesh(CONFIG.mesh, jax.devices("cpu")[:1])
    methods = programs.resolved_methods(CONFIG, "cpu")
    params = model.init_params(MODEL, jax.random.key(3))
    # a running sum that is not zero, so a sum that drops or doubles it is seen
    keys = jax.random.split(jax.random.key(4), len(params))
    start = {
        name: jax.random.normal(key, p.shape, p.dtype)
        for key, (name, p) in zip(keys, params.items(), strict=True)
    }

    def autodiff(params, batch):
        def loss(p):
            hidden, _, _ = model.decoder(
                p,
                batch,
                MODEL,
                capacity_factor=FACTOR,
                token_chunks=1,
                methods=methods,
                sums=None,
            )
            return micro_batch_loss(hidden, p["head"], batch, CONFIG.loss)[0]

        return jax.grad(loss)(params)

    fwd_bwd = programs.build_programs(CONFIG, methods).fwd_bwd

    def summed(params, sums, batch):
        return fwd_bwd(params, sums, programs.zero_stats(), batch, FACTOR)

    with jax.set_mesh(mesh):
        yield params, start, jax.jit(autodiff), jax.jit(summed)


def test_each_layers_gradient_lands_in_its_own_rows_of_the_running_sum(setup):
    params, start, autodiff, summed = setup
    batch = _batch(seed=1)
    want = autodiff(params, batch)
    got = summed(params, start, batch)
    assert int(got.overflow) == 0
    for name, grad in want.items():
        grad = np.asarray(grad)
        scale = np.abs(grad).max()
        assert scale > 0, name
        added = (np.asarray(got.grad_sum[name]) - np.asarray(start[name])) / scale
        np.testing.assert_allclose(added, grad / scale, atol=1e-4, err_msg=name)


def test_a_micro_batch_to_be_replayed_leaves_the_sum_as_it_was(setup):
    params, start, _, summed = setup
    got = summed(params, start, _batch(seed=2, forced=True))
    assert int(got.overflow) == 1
    for name, value in start.items():
        np.testing.assert_array_equal(np.asarray(got.grad_sum[name]), np.asarray(value), name)
    stats = {name: float(value) for name, value in got.step_stats.items()}
    assert stats["overflow_count"] == 1
    assert stats["loss_sum"] == 0 and stats["tokens"] == 0


def test_the_layers_one_after_another_are_the_scans_trips():
    """`layer_loop` without a scan: the same carry and the same stacked outputs as `lax.scan`, in
    order, with a carry that is a pair and trips that each read their own slice of two stacks (the
    decoder's: the weights and routes, the rows of the gradient sum)."""

    def trip(carry, xs):
        total, count = carry
        weights, rows = xs
        total = total * 0.5 + weights.sum() * rows
        return (total, count + rows), total + rows

    xs = (jnp.arange(12.0).reshape(3, 2, 2), jnp.array([3, 5, 7]))
    carry = (jnp.float32(1.0), jnp.int32(0))
    want_carry, want_out = jax.lax.scan(trip, carry, xs)
    got_carry, got_out = model.layer_loop(trip, carry, xs, scan=False)
    np.testing.assert_array_equal(np.asarray(got_out), np.asarray(want_out))
    for got, want in zip(got_carry, want_carry, strict=True):
        assert got.item() == want.item()
    assert want_out.shape == (3,) and want_carry[1].item() == 15


@pytest.mark.parametrize(("scan_layers", "scans"), [(True, 1), (False, 0)])
def test_scan_layers_false_runs_the_layers_one_after_another(setup, scan_layers, scans):
    """The decoder's program holds one scan over the blocks (the runs' scans inside it), or none:
    every layer's code in line."""
    params = setup[0]
    methods = programs.resolved_methods(CONFIG, "cpu")
    model_config = dataclasses.replace(MODEL, scan_layers=scan_layers)
    jaxpr = jax.make_jaxpr(
        lambda p: model.decoder(
            p, _batch(seed=1), model_config, capacity_factor=FACTOR, token_chunks=1,
            methods=methods, sums=None,
        )[0]
    )(params)  # fmt: skip
    assert [eqn.primitive.name for eqn in jaxpr.eqns].count("scan") == scans
