"""The FLOPs of a convolution as TPU compilers write a batched matmul: each batch dim a spatial dim
that every output element meets once (base-dilated, or a window over padding), counted by the taps
that land on the input, against counts written here and against XLA's own cost analysis."""

from __future__ import annotations

import pytest

from rl_trainer_bench.preflight.hlo.counts import FlopCounter
from rl_trainer_bench.preflight.hlo.parse import parse_hlo


def flops_of(lhs: str, rhs: str, out: str, attributes: str) -> float:
    """The FLOPs of one convolution of an `lhs` and an `rhs` parameter into `out`."""
    text = f"""HloModule m

ENTRY %main (p0: {lhs}, p1: {rhs}) -> {out} {{
  %p0 = {lhs} parameter(0)
  %p1 = {rhs} parameter(1)
  ROOT %conv = {out} convolution(%p0, %p1), {attributes}
}}
"""
    module = parse_hlo(text)
    (entry,) = module.computations.values()
    return FlopCounter(module).of_instruction(entry.instructions[-1], entry.by_name())


def test_a_base_dilated_batched_matmul_counts_its_contraction_once_per_batch():
    # A Gated DeltaNet chunk's matmul as libtpu wrote it for v5e: batch (64, 4, 16) as spatial
    # dims, [64 x 256] x [256 x 64] per batch element
    flops = flops_of(
        "f32[64,4,16,64,256]",
        "bf16[64,4,16,64,256]",
        "bf16[64,4,16,64,64]",
        "window={size=64x4x16 stride=63x3x15 lhs_dilate=64x4x16}, dim_labels=012bf_012oi->012bf",
    )
    assert flops == 2 * (64 * 4 * 16) * 64 * 64 * 256


def test_a_window_over_padding_counts_the_one_tap_on_the_input():
    # A projection [4 x 4096, 2048] x [2048, 16 x 128] as libtpu wrote it: the 16 heads a window
    # of 16 over an input of 1 padded by 15 on each side
    flops = flops_of(
        "bf16[4,4096,2048,1]",
        "bf16[2048,16,128,1]",
        "bf16[4,4096,16,128]",
        "window={size=1x16 pad=0_0x15_15 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f",
    )
    assert flops == 2 * (4 * 4096) * 2048 * (16 * 128)


def test_a_padded_convolution_counts_only_the_taps_inside_the_input():
    # length 10, window 3, "same" padding: 8 outputs see 3 taps, the 2 edge outputs see 2
    flops = flops_of(
        "f32[1,10,4]",
        "f32[3,4,5]",
        "f32[1,10,5]",
        "window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f",
    )
    assert flops == 2 * 5 * 4 * (8 * 3 + 2 * 2)


def test_a_strided_and_window_dilated_convolution():
    # length 9, window 2 dilated by 3 (taps 0 and 3), stride 2, no padding: outputs at 0, 2, 4
    flops = flops_of(
        "f32[1,9,1]",
        "f32[2,1,1]",
        "f32[1,3,1]",
        "window={size=2 stride=2 rhs_dilate=3}, dim_labels=b0f_0io->b0f",
    )
    assert flops == 2 * 3 * 2


@pytest.mark.tpu_aot
def test_the_count_of_a_batched_einsum_compiled_for_a_tpu_is_xlas_own():
    """Needs the [tpu] extra: libtpu compiles the einsum for v5e:1x1 from this host."""
    pytest.importorskip("libtpu")
    import jax
    import jax.numpy as jnp

    from rl_trainer_bench.preflight import program_cost
    from rl_trainer_bench.preflight.aot.targets import resolve_target

    device = resolve_target("v5e:1x1").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    q = jax.ShapeDtypeStruct((64, 4, 16, 64, 128), jnp.bfloat16, sharding=sharding)
    k = jax.ShapeDtypeStruct((64, 4, 16, 64, 128), jnp.bfloat16, sharding=sharding)
    compiled = jax.jit(lambda q, k: jnp.einsum("abhid,abhjd->abhij", q, k)).lower(q, k).compile()
    counted = program_cost.loop_counts(parse_hlo(compiled.as_text())).flops_once
    assert counted == 2 * (64 * 4 * 16) * 64 * 64 * 128
    assert counted == pytest.approx(compiled.cost_analysis()["flops"], rel=0.01)


def test_a_tpu_kernel_counts_the_flops_it_states():
    """A Pallas kernel's custom call as libtpu writes it (backend config abridged): its FLOPs are
    the cost estimate it carries, which libtpu's cost analysis also counts; a custom call that
    states none counts what it calls, here nothing."""
    config = (
        '{"custom_call_config":{"body":"TUzvUgE=","cost_estimate":{"flops":"4294967296",'
        '"transcendentals":"0","bytes_accessed":"28311552"},"needs_layout_passes":true}}'
    )
    text = f"""HloModule m

ENTRY %main (p0: bf16[4096,512], p1: bf16[8,512,1024]) -> bf16[4096,1024] {{
  %p0 = bf16[4096,512] parameter(0)
  %p1 = bf16[8,512,1024] parameter(1)
  %plain = bf16[4096,1024] custom-call(%p0, %p1), custom_call_target="Sharding"
  ROOT %gmm = bf16[4096,1024] custom-call(%p0, %p1), custom_call_target="tpu_custom_call", backend_config={config}
}}
"""
    module = parse_hlo(text)
    (entry,) = module.computations.values()
    counter = FlopCounter(module)
    plain, kernel = entry.instructions[-2:]
    assert counter.of_instruction(kernel, entry.by_name()) == 2 * 4096 * 512 * 1024
    assert counter.of_instruction(plain, entry.by_name()) == 0


@pytest.mark.tpu_aot
def test_a_tpu_kernel_in_a_loop_counts_once_per_trip():
    """Needs the [tpu] extra: the grouped-matmul kernel in a scan of 3, compiled for v5e:1x1;
    once-counted it is libtpu's own figure, and the loop counts it three times."""
    pytest.importorskip("libtpu")
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    from rl_trainer_bench.preflight import program_cost
    from rl_trainer_bench.preflight.aot.targets import resolve_target

    sharding = jax.sharding.SingleDeviceSharding(resolve_target("v5e:1x1").devices[0])
    m, k, groups = 4096, 512, 8

    def scanned(x, weights, sizes):
        def step(h, w):
            return gmm(h, w, sizes, jnp.bfloat16, (512, 512, 512)), None

        return jax.lax.scan(step, x, weights)[0]

    shapes = (
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=sharding),
        jax.ShapeDtypeStruct((3, groups, k, k), jnp.bfloat16, sharding=sharding),
        jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=sharding),
    )
    compiled = jax.jit(scanned).lower(*shapes).compile()
    counts = program_cost.loop_counts(parse_hlo(compiled.as_text()))
    assert counts.flops_once == 2 * m * k * k
    assert counts.flops_run == 3 * 2 * m * k * k
    assert counts.flops_once == pytest.approx(compiled.cost_analysis()["flops"], rel=0.01)
    # the kernel's statement is in the estimate, not in the bound (XLA's own ops: a few FLOPs)
    assert (counts.kernel_once, counts.kernel_run) == (2 * m * k * k, 3 * 2 * m * k * k)
    cost = program_cost.cost_of(compiled)
    assert cost.flops == pytest.approx(3 * 2 * m * k * k, rel=0.01)
    assert cost.bound_flops < 1e-3 * cost.flops
