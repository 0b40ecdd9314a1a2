"""XLA's cost analysis with loop bodies counted per trip, checked against the same program unrolled."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from rl_trainer_bench.preflight import program_cost
from rl_trainer_bench.preflight.hlo.parse import parse_hlo

LAYERS = 6
X = jax.ShapeDtypeStruct((128, 256), jnp.float32)
WEIGHTS = jax.ShapeDtypeStruct((LAYERS, 256, 256), jnp.float32)
DOT_FLOPS = 2 * 128 * 256 * 256


def _scanned(x, weights):
    def layer(h, w):
        return jnp.tanh(h @ w), None

    return jax.lax.scan(layer, x, weights)[0].sum()


def _unrolled(x, weights):
    for i in range(weights.shape[0]):
        x = jnp.tanh(x @ weights[i])
    return x.sum()


def _nested(x, weights):
    def outer(h, w):
        def inner(g, _):
            return jnp.tanh(g @ w), None

        return jax.lax.scan(inner, h, None, length=4)[0], None

    return jax.lax.scan(outer, x, weights)[0].sum()


def _compiled(function, *shapes):
    return jax.jit(function).lower(*shapes).compile()


def _xla(compiled) -> dict:
    analysis = compiled.cost_analysis()
    return analysis[0] if isinstance(analysis, list) else analysis


@pytest.fixture(scope="module")
def scanned_and_unrolled():
    return _compiled(_scanned, X, WEIGHTS), _compiled(_unrolled, X, WEIGHTS)


def test_xla_counts_a_loop_body_once_and_the_correction_counts_every_trip(scanned_and_unrolled):
    scanned, unrolled = scanned_and_unrolled
    # What the correction is for: XLA's raw count of the scanned program is about one layer.
    assert _xla(scanned)["flops"] < 2 * DOT_FLOPS
    cost = program_cost.cost_of(scanned)
    assert cost.xla_flops == _xla(scanned)["flops"]
    assert cost.flops == pytest.approx(_xla(unrolled)["flops"], rel=0.01)
    assert cost.flops == pytest.approx(LAYERS * DOT_FLOPS, rel=0.01)
    # Without a loop there is nothing to correct.
    flat = program_cost.cost_of(unrolled)
    assert (flat.flops, flat.bytes_accessed) == (flat.xla_flops, flat.xla_bytes_accessed)


def test_the_walk_counts_bytes_as_xla_does(scanned_and_unrolled):
    """Once per computation, the HLO walk's bytes are XLA's: slices read only what they take."""
    for compiled in scanned_and_unrolled:
        counts = program_cost.loop_counts(parse_hlo(compiled.as_text()))
        assert counts.bytes_once == pytest.approx(_xla(compiled)["bytes accessed"], rel=0.01)


def test_nested_loops_multiply_their_trip_counts():
    counts = program_cost.loop_counts(parse_hlo(_compiled(_nested, X, WEIGHTS).as_text()))
    assert counts.flops_once == DOT_FLOPS
    assert counts.flops_run == LAYERS * 4 * DOT_FLOPS


def test_cost_keeps_xla_time_only_where_xla_gives_one():
    counts = program_cost.LoopCounts(flops_once=10, flops_run=30, bytes_once=4, bytes_run=6)
    looped = program_cost.cost_from(
        {"flops": 100.0, "bytes accessed": 40.0, "optimal_seconds": -0.9995}, counts
    )
    assert looped.xla_optimal_seconds is None
    assert (looped.flops, looped.bytes_accessed) == (300.0, 60.0)
    plain = program_cost.cost_from(
        {"flops": 1.0, "bytes accessed": 2.0, "optimal_seconds": 2.5e-5},
        program_cost.LoopCounts(0, 0, 0, 0),
    )
    assert plain.xla_optimal_seconds == 2.5e-5 and (plain.flops, plain.bytes_accessed) == (1, 2)


def test_the_bound_leaves_out_what_kernels_state_and_scales_the_rest_by_its_own_loops():
    # 100 FLOPs by XLA's count, 40 of them a kernel's statement (once); the walk: 60 once of its
    # own ops run 4x (240), the kernel's 40 run 2x (80)
    counts = program_cost.LoopCounts(
        flops_once=100, flops_run=320, bytes_once=1, bytes_run=1, kernel_once=40, kernel_run=80
    )
    cost = program_cost.cost_from({"flops": 110.0, "bytes accessed": 1.0}, counts)
    assert cost.flops == 110.0 * 3.2
    assert cost.bound_flops == (110.0 - 40) * 4  # XLA's own 70 (elementwise 10 included) x 4
    no_kernel = dataclasses.replace(counts, kernel_once=0, kernel_run=0)
    plain = program_cost.cost_from({"flops": 110.0, "bytes accessed": 1.0}, no_kernel)
    assert plain.bound_flops == plain.flops == 110.0 * 3.2


def test_roofline_is_the_slower_of_compute_and_memory():
    assert program_cost.roofline_seconds(2e12, 1e9, 1e12, 1e12) == 2.0  # compute-bound
    assert program_cost.roofline_seconds(1e9, 3e12, 1e12, 1e12) == 3.0  # memory-bound


def test_a_loop_step_counts_its_slice_and_its_update_not_the_stacks():
    """TPU forms (`tests/testdata/hlo_loop_in_place.hlo`): a slice read through a layout-only
    fusion nested in the consumer, an in-place update in a multi-output fusion behind a bitcast and
    an aliasing copy, an asynchronous copy. Per trip: one [1024, 256] float32 slice read, the step's
    two outputs written (the update and the tuple's second element), the async copy once."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "testdata" / "hlo_loop_in_place.hlo").read_text()
    counts = program_cost.loop_counts(parse_hlo(text))
    step = 1024 * 256 * 4  # one [1024, 256] float32 array
    per_trip = step + 2 * step + 2 * step  # slice read; update and y written; async copy in and out
    entry = 8 * step  # the broadcast of the zero output stack
    scalars = 64 * 1024  # the loop counter's add and compare, 9 times each
    assert 8 * per_trip + entry <= counts.bytes_run < 8 * per_trip + entry + scalars


def test_only_main_memory_bytes_count_and_an_async_slice_reads_its_slice():
    """TPU forms (`tests/testdata/hlo_memory_spaces.hlo`): buffers in the core's VMEM (`S(1)`)
    move no HBM bytes. One [1024, 256] float32 array each: the slice read from the HBM stack,
    the prefetch's source read, the fusion's HBM result written, the eviction's HBM destination
    written; the VMEM ends of each, and the fusion's two VMEM operands, count nothing."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "testdata" / "hlo_memory_spaces.hlo").read_text()
    module = parse_hlo(text)
    by_op = {cost.instruction.name: cost.bytes for cost in program_cost.instruction_costs(module)}
    step = 1024 * 256 * 4
    assert by_op == {
        "stack": 0, "x": 0, "v": 0, "slicing": step, "sliced": 0, "step": 0,
        "prefetching": step, "prefetched": 0, "sum": step, "evicting": step, "evicted": 0,
        "out": 0,
    }  # fmt: skip


KERNEL_CALLS = """HloModule kernels

ENTRY %main (x: f32[128,128]) -> (f32[128,128], f32[128,128], f32[128,128], f32[128,128]) {
  %x = f32[128,128]{1,0} parameter(0)
  %splash_fwd.3 = f32[128,128]{1,0} custom-call(%x), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "AAAA"}}
  %gmm.1 = f32[128,128]{1,0} custom-call(%x), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "AAAA", "cost_estimate":{"flops":"4194304","transcendentals":"0","bytes_accessed":"196608"}}}
  %splash_fwd.4 = f32[128,128]{1,0} custom-call(%x), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "AAAA"}}
  %sharding = f32[128,128]{1,0} custom-call(%x), custom_call_target="Sharding"
  ROOT %out = (f32[128,128]{1,0}, f32[128,128]{1,0}, f32[128,128]{1,0}, f32[128,128]{1,0}) tuple(%splash_fwd.3, %gmm.1, %splash_fwd.4, %sharding)
}
"""


def test_kernels_that_state_no_flops_are_named_once():
    """A TPU kernel's call without a cost statement is named (once, less XLA's `.N`); one that
    states its FLOPs, and a custom call that is no TPU kernel, are not."""
    counts = program_cost.loop_counts(parse_hlo(KERNEL_CALLS))
    assert counts.unstated_kernels == ("splash_fwd",)
    assert counts.kernel_once == 4194304


def test_without_tpu_tiling_every_memory_space_is_device_memory():
    """The same forms without a tiling in their layouts (a GPU's, whose memory space 1 holds
    collective buffers in its HBM): every array counts, the slices still as slices."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "testdata" / "hlo_memory_spaces.hlo").read_text()
    module = parse_hlo(text.replace("T(8,128)", ""))
    by_op = {cost.instruction.name: cost.bytes for cost in program_cost.instruction_costs(module)}
    step = 1024 * 256 * 4
    assert (by_op["slicing"], by_op["prefetching"]) == (2 * step, 2 * step)
    assert (by_op["sum"], by_op["evicting"]) == (3 * step, 2 * step)


def test_an_async_slice_without_its_slice_in_the_result_is_counted_as_any_start():
    """Text no compiler writes (a `slice-start` whose result is its operand alone) is counted as
    other asynchronous starts are, not read past its result's end."""
    text = """HloModule odd

ENTRY %main (x: f32[1024,256]) -> f32[1024,256] {
  %x = f32[1024,256]{1,0:T(8,128)} parameter(0)
  %s = (f32[1024,256]{1,0:T(8,128)}) slice-start(%x), slice={[0:1024], [0:256]}
  ROOT %d = f32[1024,256]{1,0:T(8,128)} slice-done(%s)
}
"""
    by_op = {c.instruction.name: c.bytes for c in program_cost.instruction_costs(parse_hlo(text))}
    assert by_op["s"] == 2 * 1024 * 256 * 4
