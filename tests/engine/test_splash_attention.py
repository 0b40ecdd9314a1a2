"""attention=splash, Pallas' splash kernel run in its interpreter on host devices, against the
query-chunked XLA attention it replaces: outputs and gradients over packed rows with padding, on a
mesh that splits the rows; and the refusals where the kernel cannot run."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import model, sharding
from rl_trainer_bench.engine.builtin.programs import check_config
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError

ROWS, TOKENS, HEADS, KV_HEADS, WIDTH = 8, 256, 4, 2, 128


def inputs():
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (ROWS, TOKENS, HEADS, WIDTH))
    k = jax.random.normal(keys[1], (ROWS, TOKENS, KV_HEADS, WIDTH))
    v = jax.random.normal(keys[2], (ROWS, TOKENS, KV_HEADS, WIDTH))
    segments = np.ones((ROWS, TOKENS), np.int32)
    segments[0, 100:] = 2  # a second sequence starts inside a kernel block
    segments[1, 128:] = 3  # ... and at a block's first token
    segments[2, 200:] = 0  # padding at the end
    segments[3, :] = np.repeat(np.arange(1, 9), TOKENS // 8)  # eight short sequences
    segments[4:] = segments[:4]  # a row pattern on each of the mesh's 8 row groups
    weights = jax.random.normal(keys[3], (ROWS, TOKENS, HEADS, WIDTH))
    return (q, k, v, jnp.asarray(segments)), weights


def value_and_grads(attend, arguments, weights):
    def loss(q, k, v, segments):
        out = attend(q, k, v, segments) * (segments != 0)[:, :, None, None]
        return jnp.sum(out * weights), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*arguments)


def test_the_kernel_gives_the_xla_paths_outputs_and_gradients_on_split_rows():
    arguments, weights = inputs()
    mesh = sharding.make_mesh(MeshConfig(fsdp=4, context=1, expert=2))
    placed = [
        jax.device_put(a, NamedSharding(mesh, PartitionSpec(("fsdp", "expert")))) for a in arguments
    ]
    with jax.set_mesh(mesh):
        (_, want), want_grads = jax.jit(
            lambda *a: value_and_grads(
                lambda q, k, v, s: model.context_attention(q, k, v, s, chunk=64), a, weights
            )
        )(*placed)
        (_, got), got_grads = jax.jit(
            lambda *a: value_and_grads(
                lambda q, k, v, s: model.splash_attention(q, k, v, s, interpret=True), a, weights
            )
        )(*placed)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-4)
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-4, rtol=1e-4, err_msg=name)


def test_splash_is_refused_with_a_split_context():
    cell = PRESETS["cpu-tiny"].engine
    splash = dataclasses.replace(cell, model=dataclasses.replace(cell.model, attention="splash"))
    with pytest.raises(
        ContractError,
        match=r"attention='splash': must be xla or auto with mesh context = 2 \(splash needs",
    ):
        check_config(splash)  # cpu-tiny's mesh splits the context in 2
    one_context = dataclasses.replace(splash, mesh=MeshConfig(fsdp=2, context=1, expert=2))
    check_config(one_context)
