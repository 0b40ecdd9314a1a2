"""linear_chunk_inverse=pallas: the Pallas kernel that inverts each chunk's unit lower triangular
system, run in Pallas's interpreter on the host, against NumPy's inverse in float64 and against
the XLA path it replaces (the inverse, its gradient, and the whole gated delta rule over packed
rows); and the kernel compiled for a v5e from this host, where libtpu is installed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_trainer_bench.engine.builtin.linear_attention import gated_delta_rule
from rl_trainer_bench.engine.builtin.unit_lower_inverse import (
    KERNEL_BLOCK,
    pallas_inverse,
    unit_lower_inverse,
    xla_inverse,
)


def systems(count, size, seed=0, scale=1.0):
    """`count` strictly lower triangular [size, size] matrices with entries of the rule's scale
    (|A_ti| = beta decay |k_t . k_i| <= 1), uniform in (-scale, scale)."""
    rng = np.random.default_rng(seed)
    return np.tril(rng.uniform(-scale, scale, (count, size, size)), -1).astype(np.float32)


@pytest.mark.parametrize(
    ("count", "size", "scale"),
    [(3, 1, 1), (6, 6, 1), (KERNEL_BLOCK, 16, 1), (11, 64, 1), (5, 128, 0.25)],
)
def test_the_kernel_inverts_like_numpy(count, size, scale):
    """Counts below, at and past a block (padded with zero matrices), sizes of a power of two and
    not; the inverse in float64 is the reference. At 128 the entries are a quarter of the rule's
    bound: a dense random triangle of entries up to 1 has an inverse of entries near 1e8 there, past
    what float32 holds to 1e-4 (the rule's own entries are dot products of unit keys, about
    1/sqrt(Dk) each)."""
    strict = systems(count, size, scale=scale)
    got = np.asarray(pallas_inverse(jnp.asarray(strict), interpret=True))
    want = np.linalg.inv(np.eye(size) + strict.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("size", "matmuls"), [(1, 0), (2, 0), (16, 6), (128, 12)])
def test_the_doubling_takes_no_matmul_at_its_first_level(size, matmuls):
    """log2(C) levels of two dependent matmuls but the first, whose X is the identity (I - N_1):
    at chunks of 128 a chain of 12 matmuls, not 14; the inverse stays NumPy's."""
    strict = systems(2, size, scale=0.25)
    jaxpr = jax.make_jaxpr(xla_inverse)(jnp.asarray(strict))
    assert [eqn.primitive.name for eqn in jaxpr.eqns].count("dot_general") == matmuls
    want = np.linalg.inv(np.eye(size) + strict.astype(np.float64))
    np.testing.assert_allclose(np.asarray(xla_inverse(jnp.asarray(strict))), want, atol=1e-4)


def test_both_methods_give_one_inverse_and_one_gradient_over_leading_dims():
    strict = jnp.asarray(systems(2 * 3 * 4, 32, seed=1).reshape(2, 3, 4, 32, 32))
    weights = jax.random.normal(jax.random.key(2), strict.shape)

    def loss(method, interpret):
        return lambda a: jnp.sum(jnp.sin(unit_lower_inverse(a, method, interpret)) * weights)

    want, want_grad = jax.value_and_grad(loss("xla", False))(strict)
    got, got_grad = jax.value_and_grad(loss("pallas", True))(strict)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-5)


def test_the_rule_through_the_kernel_gives_the_xla_paths_outputs_and_gradients():
    """Packed rows with a segment inside a chunk, one at a chunk's first token and padding, over
    chunks of 8 and two context spans folded in one program."""
    rows, tokens, heads, dk, dv = 2, 32, 2, 8, 4
    keys = jax.random.split(jax.random.key(3), 6)
    q, k = (jax.random.normal(key, (rows, tokens, heads, dk)) * 0.3 for key in keys[:2])
    v = jax.random.normal(keys[2], (rows, tokens, heads, dv))
    log_decay = -jax.nn.softplus(jax.random.normal(keys[3], (rows, tokens, heads)))
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (rows, tokens, heads)))
    segments = np.ones((rows, tokens), np.int32)
    segments[0, 13:] = 2
    segments[1, 16:] = 3
    segments[1, 28:] = 0
    weights = jax.random.normal(keys[5], (rows, tokens, heads, dv))

    def loss(inverse, interpret):
        def of(q, k, v, log_decay, beta):
            out = gated_delta_rule(
                q, k, v, log_decay, beta, jnp.asarray(segments), chunk_size=8,
                context_shards=2, inverse=inverse, interpret=interpret,
            )  # fmt: skip
            return jnp.sum(out * weights)

        return jax.jit(jax.value_and_grad(of, argnums=(0, 1, 2, 3, 4)))

    want, want_grads = loss("xla", False)(q, k, v, log_decay, beta)
    got, got_grads = loss("pallas", True)(q, k, v, log_decay, beta)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("count", "size"), [(4096, 32), (4096, 64), (2048, 128)])
def test_the_kernel_compiles_for_a_v5e_at_the_presets_shapes(count, size):
    """tpu-v5e-1's 2,048 systems of 128 a micro-batch (its chunks of 64 before, the host presets'
    of 32), as Mosaic compiles them: a custom call in the compiled program, not the XLA path."""
    pytest.importorskip("libtpu")
    from rl_trainer_bench.preflight.aot.targets import resolve_target

    device = resolve_target("v5e:1x1").devices[0]
    spec = jax.ShapeDtypeStruct(
        (count, size, size), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device)
    )
    compiled = jax.jit(pallas_inverse).lower(spec).compile()
    assert "tpu_custom_call" in compiled.as_text()
