"""linear_conv_kernel=pallas: the Gated DeltaNet's short causal convolution and its SiLU in Pallas
kernels, forward and backward, run in Pallas's interpreter on the host against the reference
convolution in float64 (the output and the gradients of the input and the taps, over packed rows
whose segments open inside a block, on a block's first token and after padding, over several
blocks of tokens and of channels), the layer through them against the reference layer, the key's
refusals, and both kernels compiled for a v5e at tpu-v5e-1's shapes from this host, where libtpu
is installed."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gdn_reference import conv, layer
from test_delta_rule_kernel import (
    assert_refused_in_one_line,
    gated_deltanet_shapes,
    mosaic_calls_compiled_for_a_v5e,
    pallas_calls,
)

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.conv_kernel import causal_conv
from rl_trainer_bench.engine.builtin.gated_deltanet import gated_deltanet
from rl_trainer_bench.engine.builtin.programs import check_config
from rl_trainer_bench.engine.config import MeshConfig

# Row 0: segments opening inside a block (37), on a block's first token at blocks of 8, 16 and 32
# (64), a segment ending in padding (94 on); row 1: segments of 3 tokens and of one, then a long
# one across every block
SEGMENTS = np.array([[1] * 37 + [2] * 27 + [3] * 30 + [0] * 6, [5] * 3 + [6] * 1 + [7] * 96])


@pytest.mark.parametrize(
    ("taps", "width", "block"),
    [(4, 256, 16), (2, 384, 32), (8, 128, 8)],
    ids=[
        "4 taps (Qwen3.5's), one block of channels, 16 tokens a block",
        "2 taps, three blocks of 128 channels, 32 tokens a block",
        "8 taps (the most), 8 tokens a block",
    ],
)
def test_the_kernels_give_the_float64_convolutions_output_and_gradients(taps, width, block):
    """100 tokens a row, padded inside to whole blocks: the output and the gradients of x and of
    the taps through a weighted sum, against autodiff of the reference in float64."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(*SEGMENTS.shape, width))
    kernel = rng.normal(size=(taps, width)) * 0.5
    weights = rng.normal(size=x.shape)
    segments = jnp.asarray(SEGMENTS)

    def kernel_loss(x, kernel):
        out = causal_conv(x, kernel, segments, tokens_per_block=block, interpret=True)
        return jnp.sum(out * weights.astype(np.float32)), out

    def reference_loss(x, kernel):
        out = conv(x, kernel, segments)
        return jnp.sum(out * weights), out

    got = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1), has_aux=True))
    (_, out), grads = got(jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32))
    with jax.enable_x64(True):
        want = jax.jit(jax.value_and_grad(reference_loss, argnums=(0, 1), has_aux=True))
        (_, want_out), want_grads = jax.tree.map(np.asarray, want(x, kernel))
    np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("x", "taps"), grads, want_grads, strict=True):
        scale = np.abs(b).max()
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5 * scale, err_msg=name)


def test_the_layer_through_the_kernels_gives_the_reference_layers_output():
    """cpu-tiny-qwen3.5's Gated DeltaNet layer (q, k and v 128 channels together) with its
    convolutions in the kernels, the rule in XLA, on one device's mesh, against the reference
    layer in float64; the layer's gradient runs the backward kernel."""
    model = dataclasses.replace(PRESETS["cpu-tiny-qwen3.5"].engine.model, linear_chunk_size=16)
    rng = np.random.default_rng(2)
    weights = {
        name: rng.normal(size=shape) * 0.3 for name, shape in gated_deltanet_shapes(model).items()
    }
    segments = jnp.asarray(np.array([[1] * 20 + [2] * 25 + [0] * 3, [4] * 48]))
    h = rng.normal(size=(2, 48, model.d_model))

    def through_kernels(h, w):
        return gated_deltanet(h, w, segments, model, conv="pallas", interpret=True)

    as_float32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    h32, weights32 = as_float32(h), jax.tree.map(as_float32, weights)
    with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
        got = jax.jit(through_kernels)(h32, weights32)
        gradient = jax.make_jaxpr(jax.grad(lambda h: jnp.sum(through_kernels(h, weights32))))(h32)
    with jax.enable_x64(True):
        want = jax.jit(lambda h, w: layer(h, w, segments, model))(h, weights)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    names = {call["name"] for call in pallas_calls(gradient.jaxpr)}
    assert names == {"short_conv_forward", "short_conv_backward"}


@pytest.mark.parametrize(
    ("changes", "mesh", "named"),
    [
        ({}, MeshConfig(fsdp=2, context=2, expert=2), "mesh context = 2"),
        ({"linear_conv_kernel_dim": 9}, MeshConfig(fsdp=2, expert=2), "linear_conv_kernel_dim = 9"),
        ({"linear_value_head_dim": 24}, MeshConfig(fsdp=2, expert=2), "160 channels wide"),
    ],
    ids=["context shards", "too many taps", "a width that is not whole lanes"],
)
def test_the_kernel_is_refused_where_it_cannot_run_naming_the_key(changes, mesh, named):
    """One line each, before anything compiles; cpu-tiny-qwen3.5's own shapes (4 taps, 128
    channels) on whole rows pass."""
    tiny = PRESETS["cpu-tiny-qwen3.5"].engine
    model = dataclasses.replace(tiny.model, linear_conv_kernel="pallas")
    check_config(dataclasses.replace(tiny, model=model, mesh=MeshConfig(fsdp=2, expert=2)))
    bad = dataclasses.replace(tiny, model=dataclasses.replace(model, **changes), mesh=mesh)
    assert_refused_in_one_line(bad, "linear_conv_kernel", named)


@pytest.mark.tpu_aot
def test_both_kernels_compile_for_a_v5e_at_the_presets_shapes():
    """tpu-v5e-1's convolution a micro-batch: its rows of 4,096 tokens, q, k and v 4,096 channels
    in bfloat16, 4 taps. The output and its gradients in one program hold two Mosaic custom calls
    (the forward, shared by the output and the gradient, and the backward), inside the kernels'
    scoped VMEM."""
    engine = PRESETS["tpu-v5e-1"].engine
    m = engine.model
    rows, tokens, width = engine.micro_batch_rows, engine.seq_len, m.linear_qkv_width
    specs = (
        ((rows, tokens, width), jnp.bfloat16),
        ((m.linear_conv_kernel_dim, width), jnp.bfloat16),
        ((rows, tokens), jnp.int32),
    )

    def conv_and_gradient(x, kernel, segments):
        def loss(x, kernel):
            return jnp.sum(causal_conv(x, kernel, segments).astype(jnp.float32))

        return causal_conv(x, kernel, segments), jax.grad(loss, argnums=(0, 1))(x, kernel)

    assert mosaic_calls_compiled_for_a_v5e(conv_and_gradient, specs) == 2
