"""linear_chunk_kernel=pallas: the gated delta rule's chunks in Pallas kernels, forward and backward,
run in Pallas's interpreter on the host against the per-token recurrence in float64 (outputs and
every input's gradient, over packed rows with segments starting anywhere and spanning several
chunks: `delta_rule_cases`, whose cases the chip's test runs compiled), the Gated DeltaNet layer
through them against the float32 reference layer, and both kernels compiled for a v5e at
tpu-v5e-1's shapes from this host, where libtpu is installed."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from delta_rule_cases import CASES, GRADIENTS, SEGMENTS, kernels_and_reference
from gdn_reference import layer

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.delta_rule_kernel import (
    chunked_delta_rule,
    kept_dtype_for,
    program_heads,
)
from rl_trainer_bench.engine.builtin.gated_deltanet import gated_deltanet
from rl_trainer_bench.engine.builtin.model import KEPT_BY_NAME, REMAT_POLICIES
from rl_trainer_bench.engine.builtin.programs import check_config
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import ContractError


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_kernels_give_the_float64_recurrences_outputs_and_gradients(case):
    """Outputs and the gradients of q, k, v, log decay and beta against autodiff of the per-token
    recurrence in float64 over packed rows whose segments span several chunks (`delta_rule_cases`):
    q and k as the rule takes them, or as the layer's convolution gives them, normalised and
    shared by their value heads inside the kernels. With the states and inverses the backward
    reads rounded to bfloat16 (8 bits of mantissa) the gradients hold to 1% of the reference."""
    (out, grads), (want, want_grads) = kernels_and_reference(case, 16, 8, interpret=True)
    np.testing.assert_array_equal(out[SEGMENTS == 0], 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-5)
    for name, got, wanted in zip(GRADIENTS, grads, want_grads, strict=True):
        np.testing.assert_allclose(
            got, wanted, rtol=case.tolerance, atol=case.tolerance / 5, err_msg=name
        )


def test_the_states_and_inverses_are_kept_in_bfloat16_only_where_the_matmuls_read_them_so():
    """A TPU's default precision passes the compiled kernels' float32 operands once through
    bfloat16; a finer one takes float32, and so do the interpreter's host matmuls."""
    assert kept_dtype_for(jax.lax.Precision.DEFAULT, interpret=False) == jnp.bfloat16
    assert kept_dtype_for(jax.lax.Precision.HIGHEST, interpret=False) == jnp.float32
    assert kept_dtype_for(jax.lax.Precision.DEFAULT, interpret=True) == jnp.float32


def gated_deltanet_shapes(model):
    """A Gated DeltaNet layer's weights' shapes, by name."""
    hk, hv, dk, dv, d, taps = (
        model.linear_num_key_heads, model.linear_num_value_heads, model.linear_key_head_dim,
        model.linear_value_head_dim, model.d_model, model.linear_conv_kernel_dim,
    )  # fmt: skip
    return {
        "gdn_wq": (d, hk, dk), "gdn_wk": (d, hk, dk), "gdn_wv": (d, hv, dv), "gdn_wz": (d, hv, dv),
        "gdn_wb": (d, hv), "gdn_wa": (d, hv), "gdn_conv_q": (taps, hk, dk),
        "gdn_conv_k": (taps, hk, dk), "gdn_conv_v": (taps, hv, dv), "gdn_a_log": (hv,),
        "gdn_dt_bias": (hv,), "gdn_norm": (dv,), "gdn_wo": (hv, dv, d),
    }  # fmt: skip


def test_a_program_takes_whole_groups_of_heads_or_part_of_one():
    assert program_heads(16, 2, 2) == 2  # tpu-v5e-1: 16 value heads, 2 a key head
    assert program_heads(16, 2, 4) == 4
    assert program_heads(16, 4, 2) == 2  # half a group
    assert program_heads(6, 2, 4) == 2  # 4 does not divide 6, 3 splits a group
    assert program_heads(3, 3, 2) == 1


def test_the_layer_through_the_kernels_gives_the_reference_layers_output():
    """The Gated DeltaNet layer of cpu-tiny-qwen3.5 (2 key heads shared by 4 value heads) with q
    and k as its convolution gives them, normalised inside the kernels, on one device's mesh,
    against the plain reference layer in float64 (the gradients through the kernels are the
    recurrence test's)."""
    model = dataclasses.replace(PRESETS["cpu-tiny-qwen3.5"].engine.model, linear_chunk_size=16)
    d = model.d_model
    rng = np.random.default_rng(2)
    weights = {
        name: rng.normal(size=shape) * 0.3 for name, shape in gated_deltanet_shapes(model).items()
    }
    segments = jnp.asarray(np.array([[1] * 20 + [2] * 25 + [0] * 3, [4] * 48]))
    h = rng.normal(size=(2, 48, d))
    with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
        got = jax.jit(
            lambda h, w: gated_deltanet(h, w, segments, model, kernel="pallas", interpret=True)
        )(
            jnp.asarray(h, jnp.float32),
            jax.tree.map(functools.partial(jnp.asarray, dtype=jnp.float32), weights),
        )
    with jax.enable_x64(True):
        want = jax.jit(lambda h, w: layer(h, w, segments, model))(h, weights)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def pallas_calls(jaxpr):
    """The parameters of every pallas_call in `jaxpr` and the jaxprs inside its equations whose
    results something reads (an unread one is dead code, which the compiler drops)."""
    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name == "pallas_call" and _read(eqn.outvars, jaxpr, index):
            yield eqn.params
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a closed jaxpr's own
                if hasattr(inner, "eqns"):
                    yield from pallas_calls(inner)


def _read(outvars, jaxpr, index):
    """Whether an equation after `index` in `jaxpr`, or its outputs, read any of `outvars`."""
    readers = [v for eqn in jaxpr.eqns[index + 1 :] for v in eqn.invars] + list(jaxpr.outvars)
    return any(v is out for v in readers for out in outvars)


def dot_generals(jaxpr):
    """Every dot_general equation in `jaxpr` and the jaxprs inside its equations."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from dot_generals(inner)


def gradient_kernel_calls(heads, keep=False, policy=None):
    """The pallas_calls of the gradient of cpu-tiny-qwen3.5's layer (4 value heads, 2 a key head)
    through the kernels, chunks of 16, `heads` a program (`linear_chunk_kernel_heads`), the
    layer rematerialized by `policy` where one is given, `keep`: `keep_delta_rule_outputs`."""
    model = dataclasses.replace(
        PRESETS["cpu-tiny-qwen3.5"].engine.model, linear_chunk_size=16,
        linear_chunk_kernel_heads=heads, keep_delta_rule_outputs=keep,
    )  # fmt: skip
    d = model.d_model
    weights = {
        name: jnp.zeros(shape, jnp.float32) for name, shape in gated_deltanet_shapes(model).items()
    }
    segments = jnp.ones((2, 48), jnp.int32)

    def layer(h, w):
        return gated_deltanet(h, w, segments, model, kernel="pallas", interpret=True)

    def loss(h, w):
        return jnp.sum(
            layer(h, w) if policy is None else jax.checkpoint(layer, policy=policy)(h, w)
        )

    with jax.set_mesh(sharding.make_mesh(MeshConfig(), jax.devices()[:1])):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(jnp.ones((2, 48, d)), weights)
    return list(pallas_calls(jaxpr.jaxpr))


def test_the_backward_kernel_reads_each_chunks_inverse_rather_than_rebuilding_it():
    """At chunks of 16 the forward kernel's 14 matmuls are k k^T, q k^T, U, W, the doubling's 6
    (4 levels of 2 but the first), W H, the output's 2 and the state's 1; the backward kernel's
    21 are the terms' 4 (k k^T, q k^T, U, W) and the gradients' 17, with no doubling: it reads
    the inverse the forward kept (27 if it rebuilt it)."""
    matmuls = {
        call["name"]: len(list(dot_generals(call["jaxpr"]))) for call in gradient_kernel_calls(4)
    }
    assert matmuls == {"gated_delta_rule_forward": 14, "gated_delta_rule_backward": 21}


@pytest.mark.parametrize(("remat_policy", "keep", "forward_calls"), [
    ("minimal", False, 2), ("minimal", True, 1), ("full", True, 1),
])  # fmt: skip
def test_keep_delta_rule_outputs_spares_the_backward_pass_the_forward_kernel(
    remat_policy, keep, forward_calls
):
    """Under either remat policy with the engine's names, as the decoder's layers run, the
    layer's gradient runs the forward kernel again for the backward pass, unless its results are
    kept (`keep_delta_rule_outputs`); the backward kernel runs once either way."""
    policy = jax.checkpoint_policies.save_from_both_policies(
        REMAT_POLICIES[remat_policy], KEPT_BY_NAME
    )
    names = [call["name"] for call in gradient_kernel_calls(4, keep, policy)]
    assert names.count("gated_delta_rule_forward") == forward_calls
    assert names.count("gated_delta_rule_backward") == 1


@pytest.mark.parametrize(("asked", "groups"), [(1, 4), (2, 2), (3, 2), (4, 1)])
def test_each_kernel_program_takes_the_heads_the_engine_key_asks(asked, groups):
    """cpu-tiny-qwen3.5's layer (4 value heads, 2 a key head) at `linear_chunk_kernel_heads`:
    the gradient's two kernels (the forward that keeps the states, the backward) each have a grid
    of (rows, head groups, chunks) with 4 / heads a program groups (3 is cut to 2: a program holds
    whole key-head groups)."""
    calls = gradient_kernel_calls(asked)
    assert len(calls) == 2 and {call["grid_mapping"].grid[1] for call in calls} == {groups}
    # each matmul takes all of a program's heads at once (an operand with their axis): the
    # compiler overlaps their chains only so, one head's after another's it runs them in turn
    for call in calls:
        products = list(dot_generals(call["jaxpr"]))
        assert products and all(
            any(x.aval.ndim == 3 and 4 // groups in x.aval.shape[:2] for x in eqn.invars)
            for eqn in products
        ), call["name"]
    # the names a compile's VMEM overflow is traced back to its engine key by
    assert {call["name"] for call in calls} == {
        "gated_delta_rule_forward", "gated_delta_rule_backward"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "mesh", "named"),
    [
        ({}, MeshConfig(fsdp=2, context=2, expert=2), "mesh context = 2"),
        ({"linear_key_head_dim": 64}, MeshConfig(fsdp=2, expert=2), "linear_key_head_dim=64"),
        ({"linear_value_head_dim": 96}, MeshConfig(fsdp=2, expert=2), "linear_value_head_dim=96"),
        ({"linear_chunk_size": 100}, MeshConfig(fsdp=2, expert=2), "linear_chunk_size=100"),
    ],
    ids=["context shards", "narrow keys", "narrow values", "ragged chunks"],
)
def test_the_kernel_is_refused_where_it_cannot_run_naming_the_key(changes, mesh, named):
    """Context shards, and head widths or chunks its TPU blocks cannot hold: one line each, before
    anything compiles; the same shapes at 128 and chunks of 128 on whole rows pass."""
    tiny = PRESETS["cpu-tiny-qwen3.5"].engine
    model = dataclasses.replace(
        tiny.model, linear_chunk_kernel="pallas", linear_key_head_dim=128,
        linear_value_head_dim=128, linear_chunk_size=128,
    )  # fmt: skip
    check_config(dataclasses.replace(tiny, model=model, mesh=MeshConfig(fsdp=2, expert=2)))
    bad = dataclasses.replace(tiny, model=dataclasses.replace(model, **changes), mesh=mesh)
    assert_refused_in_one_line(bad, "linear_chunk_kernel", named)


def assert_refused_in_one_line(config, key, named):
    """`check_config` refuses `config` in one line that names `key`'s value pallas and `named`."""
    with pytest.raises(
        ContractError, match=rf"^engine config {key}='pallas': must be xla with .*"
    ) as refused:
        check_config(config)
    assert named in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.tpu_aot
def test_both_kernels_compile_for_a_v5e_at_the_presets_shapes():
    """tpu-v5e-1's Gated DeltaNet a micro-batch (its rows of 4,096 tokens in chunks of 128, 8 key
    heads shared by 16 value heads of 128, its heads a kernel program), q and k in bfloat16 as the
    convolution gives them, normalised inside. The forward and its gradient in one program hold
    three Mosaic custom calls (the forward kernel, the one that keeps the states, and the backward
    kernel), not an XLA fallback, each inside the kernels' scoped VMEM."""
    engine = PRESETS["tpu-v5e-1"].engine
    model = engine.model
    rows, tokens = engine.micro_batch_rows, engine.seq_len
    hk, hv, width = (
        model.linear_num_key_heads,
        model.linear_num_value_heads,
        model.linear_key_head_dim,
    )
    specs = (
        ((rows, tokens, hk, width), jnp.bfloat16),
        ((rows, tokens, hk, width), jnp.bfloat16),
        ((rows, tokens, hv, width), jnp.bfloat16),
        ((rows, tokens, hv), jnp.float32),
        ((rows, tokens, hv), jnp.float32),
        ((rows, tokens), jnp.int32),
    )

    def rule(*x):
        return chunked_delta_rule(
            *x, chunk_size=model.linear_chunk_size,
            heads_per_program=model.linear_chunk_kernel_heads,
            query_scale=width**-0.5,
        )  # fmt: skip

    def rule_and_gradient(*x):
        loss = lambda *x: jnp.sum(rule(*x).astype(jnp.float32))  # noqa: E731
        return rule(*x), jax.grad(loss, argnums=range(5))(*x)

    assert mosaic_calls_compiled_for_a_v5e(rule_and_gradient, specs) == 3


def mosaic_calls_compiled_for_a_v5e(fn, specs) -> int:
    """The Mosaic custom calls in `fn` compiled for one v5e chip from this host, on abstract
    arrays of `specs` ((shape, dtype) each); skipped where libtpu is not installed."""
    pytest.importorskip("libtpu")
    from rl_trainer_bench.preflight.aot.targets import resolve_target

    placed = jax.sharding.SingleDeviceSharding(resolve_target("v5e:1x1").devices[0])
    arrays = [jax.ShapeDtypeStruct(shape, dtype, sharding=placed) for shape, dtype in specs]
    return jax.jit(fn).lower(*arrays).compile().as_text().count("tpu_custom_call")
