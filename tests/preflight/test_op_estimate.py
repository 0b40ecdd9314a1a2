"""The op estimate of a small scheduled program against its roofline worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from rl_trainer_bench.chips.accelerators import chip_by_name
from rl_trainer_bench.preflight.hlo.parse import parse_hlo
from rl_trainer_bench.preflight.hlo.report import Collective
from rl_trainer_bench.preflight.op_estimate import Rates, collective_seconds, estimate

# A matmul with an all-gather of 4 devices scheduled beside it, an elementwise fusion and a
# reduce of the gathered array, and a Pallas kernel that states its cost; then a float32 matmul
# at HIGHEST precision, a matmul that contracts 16 (padded to the unit's 128), splash attention's
# forward kernel (which states no cost) and a gather of bf16 rows from HBM.
SMALL_PROGRAM = r"""
HloModule small, is_scheduled=true, num_partitions=4

%gather_rows (gp0: bf16[4096,1024], gp1: s32[1024]) -> bf16[1024,1024] {
  %gp0 = bf16[4096,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %gp1 = s32[1024]{0} parameter(1)
  ROOT %gr = bf16[1024,1024]{1,0:T(8,128)(2,1)} gather(%gp0, %gp1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,1024}
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%exp (p: f32[1024,1024]) -> f32[1024,1024] {
  %p = f32[1024,1024] parameter(0)
  ROOT %e = f32[1024,1024] exponential(%p)
}

ENTRY %main (x: bf16[1024,512], w: bf16[512,2048], g: f32[256,1024], a: f32[256,256], b: f32[256,256], tl: bf16[4096,16], tr: bf16[16,256], q: bf16[1,2,1024,128], kv: bf16[1,1024,128], tbl: bf16[4096,1024], ids: s32[1024]) -> (f32[1024,2048], f32[1024], f32[128,128]) {
  %x = bf16[1024,512] parameter(0)
  %w = bf16[512,2048] parameter(1)
  %g = f32[256,1024] parameter(2)
  %a = f32[256,256] parameter(3)
  %b = f32[256,256] parameter(4)
  %tl = bf16[4096,16] parameter(5)
  %tr = bf16[16,256] parameter(6)
  %q = bf16[1,2,1024,128] parameter(7)
  %kv = bf16[1,1024,128] parameter(8)
  %tbl = bf16[4096,1024]{1,0:T(8,128)(2,1)} parameter(9)
  %ids = s32[1024]{0} parameter(10)
  %ag-start = (f32[256,1024], f32[1024,1024]) all-gather-start(%g), replica_groups={{0,1,2,3}}, dimensions={0}
  %mm = f32[1024,2048] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag-done = f32[1024,1024] all-gather-done(%ag-start)
  %ex = f32[1024,1024] fusion(%ag-done), kind=kLoop, calls=%exp
  %zero = f32[] constant(0)
  %r = f32[1024] reduce(%ex, %zero), dimensions={1}, to_apply=%add
  %k = f32[128,128] custom-call(%g), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"body":"x","cost_estimate":{"flops":"1000000000","transcendentals":"0","bytes_accessed":"500000000"}}}
  %hi = f32[256,256] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
  %thin = bf16[4096,256] dot(%tl, %tr), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %mask = s8[1,2,2] constant({...})
  %splash_mqa_fwd_segmented_residuals.1 = bf16[1,2,1024,128] custom-call(%mask, %q, %kv, %kv), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={"xprof_metadata":"{\"block_q\": 512, \"block_kv\": 512}"}}, backend_config={"custom_call_config":{"body":""}}
  %rows = bf16[1024,1024]{1,0:T(8,128)(2,1)} fusion(%tbl, %ids), kind=kCustom, calls=%gather_rows
  ROOT %t = (f32[1024,2048], f32[1024], f32[128,128]) tuple(%mm, %r, %k)
}
"""

RATES = Rates(
    peak_flops=1e12,
    hbm_bytes_per_second=1e11,
    ici_bytes_per_second=1e9,
    source="test",
    mxu_size=128,
)

# By hand, in seconds:
MATMUL = 2 * 1024 * 2048 * 512 / 1e12  # compute-bound: its 11.5 MB at 1e11 B/s take 0.115 ms
EXP = (4 * 1024 * 1024 + 4 * 1024 * 1024) / 1e11  # reads and writes 4 MiB of f32
REDUCE = (4 * 1024 * 1024 + 4 + 4 * 1024) / 1e11  # reads 4 MiB and the zero, writes 4 KiB
KERNEL = max(1e9 / 1e12, 5e8 / 1e11)  # its stated bytes bound it
GATHER = 3 / 4 * (4 * 1024 * 1024) / 1e9  # 3/4 of the 4 MiB result over ICI
GATHER_EXPOSED = GATHER - MATMUL  # the matmul runs between its start and its done
HIGHEST = 6 * 2 * 256**3 / 1e12  # float32 at HIGHEST: six bfloat16 passes
THIN = 2 * 4096 * 128 * 256 / 1e12  # its contracted 16 fills 16 of the unit's 128 rows
# Splash's forward over 2 heads of 1,024 tokens in blocks of 512: a causal mask leaves 1 + 2 of
# the 2 x 2 blocks, each two matmuls of 512 x 512 x 128
SPLASH = 2 * 2 * 2 * 512 * 512 * 128 * 3 / 1e12
# 1,024 bf16 rows gathered from HBM: each row's 32-bit words hold its neighbour too (4 MiB read),
# the 4 KiB of indices, the 2 MiB result written
GATHERED_ROWS = (2 * 1024 * 1024 * 2 + 4 * 1024 + 1024 * 1024 * 2) / 1e11


def test_small_program_matches_its_hand_roofline():
    found = estimate(parse_hlo(SMALL_PROGRAM), RATES)
    assert found.compute_seconds == pytest.approx(MATMUL + HIGHEST + THIN)
    assert found.memory_seconds == pytest.approx(EXP + REDUCE + GATHERED_ROWS)
    assert found.kernel_seconds == pytest.approx(KERNEL + SPLASH)
    assert found.collective_seconds == pytest.approx(GATHER)
    assert found.exposed_collective_seconds == pytest.approx(GATHER_EXPOSED)
    assert found.unstated_kernels == ()
    assert found.seconds == pytest.approx(
        MATMUL + EXP + REDUCE + KERNEL + GATHER_EXPOSED + HIGHEST + THIN + SPLASH + GATHERED_ROWS
    )
    assert found.seconds == pytest.approx(9.6096e-3, rel=1e-4)


def test_a_synchronous_collective_hides_behind_nothing():
    synchronous = SMALL_PROGRAM.replace(
        "%ag-start = (f32[256,1024], f32[1024,1024]) all-gather-start(%g)",
        "%ag-start = f32[1024,1024] all-gather(%g)",
    ).replace(
        "%ag-done = f32[1024,1024] all-gather-done(%ag-start)",
        "%ag-done = f32[1024,1024] copy(%ag-start)",
    )
    found = estimate(parse_hlo(synchronous), RATES)
    assert found.exposed_collective_seconds == pytest.approx(GATHER)


def test_a_chip_rates_come_from_the_chip_table():
    rates = Rates.of_chip(chip_by_name("tpu7x"))
    # a device is half a chip: 2307 TFLOP/s, 7.37 TB/s, 1.2 TB/s both ways over 6 links
    assert rates.peak_flops == pytest.approx(1153.5e12)
    assert rates.hbm_bytes_per_second == pytest.approx(3.685e12)
    assert rates.ici_bytes_per_second == pytest.approx(1.2e12 / 6)  # a chip, one axis, one way
    assert rates.devices_per_chip == 2
    assert Rates.of_chip(chip_by_name("v5e")).mxu_size == 128  # 128 x 128 MXUs


def _gather(group_size: int) -> Collective:
    return Collective(
        kind="all-gather", name="ag", computation="main", line=1, form="async pair",
        bytes=2**30, executions=1, group_size=group_size, mesh_axes=None,
        between_instructions=0, between_compute=0, between_flops=0.0, made_sync=False,
    )  # fmt: skip


def test_a_group_over_more_chips_uses_more_torus_axes():
    """On tpu7x:4x4x8 (2 devices a chip, 1.2 TB/s both ways a chip over 6 links): 128 devices
    are 64 chips, more than 8 x 4 hold, so the ring uses all three axes; 2 devices are one chip,
    nothing crosses ICI."""
    rates = Rates.of_chip(chip_by_name("tpu7x"), torus=(4, 4, 8))
    per_axis = 1.2e12 / 6
    assert collective_seconds(_gather(128), rates) == pytest.approx(
        63 / 64 * 2**30 * 2 / (3 * per_axis)
    )
    assert collective_seconds(_gather(16), rates) == pytest.approx(7 / 8 * 2**30 * 2 / per_axis)
    assert collective_seconds(_gather(2), rates) == 0.0


def test_a_tiled_array_moves_its_padded_tiles():
    """A TPU lays `f32[4096,1]` out as 4096 rows of 128 lanes: a copy moves 128x its elements."""
    text = """
HloModule tiled, is_scheduled=true

ENTRY %main (p: f32[4096,1]) -> f32[4096,1] {
  %p = f32[4096,1]{1,0:T(8,128)} parameter(0)
  ROOT %c = f32[4096,1]{1,0:T(8,128)} copy(%p)
}
"""
    found = estimate(parse_hlo(text), RATES)
    assert found.memory_seconds == pytest.approx(2 * 4096 * 128 * 4 / 1e11)


def test_splash_kernels_add_their_scores_vector_work():
    """Splash's forward over 2 heads of 1,024 tokens in blocks of 512 computes 3 whole blocks a
    head, 2 x 3 x 512 x 512 scores, each taking 6 vector ops (compare, select, max, subtract,
    exp, sum); at 1e10 values a second that time adds to the kernel's matmul roofline."""
    rates = dataclasses.replace(RATES, vector_values_per_second=1e10)
    found = estimate(parse_hlo(SMALL_PROGRAM), rates)
    vector = 6 * 2 * 3 * 512 * 512 / 1e10
    assert found.kernel_vector_seconds == pytest.approx(vector)
    assert found.kernel_seconds == pytest.approx(KERNEL + SPLASH)
    assert found.seconds == pytest.approx(9.6096e-3 + vector, rel=1e-4)
    (splash,) = [op for op in found.ops if op.name.startswith("splash")]
    assert splash.seconds == pytest.approx(SPLASH + vector)


@pytest.mark.parametrize(
    ("phase", "metadata", "per_score"),
    [
        ("dq", r"{\"block_q_dq\": 512, \"block_kv_dq\": 512}", 7),
        ("dkv", r"{\"block_q_dkv\": 512, \"block_kv_dkv\": 512}", 8),
        (
            "dkv",
            r"{\"block_q_dkv\": 512, \"block_kv_dkv\": 512, \"use_fused_bwd_kernel\": true}",
            9,
        ),
    ],
)
def test_splash_backward_kernels_count_their_own_vector_ops(phase, metadata, per_score):
    """dq: compare, select, subtract, exp, subtract di, times p, cast ds: 7 a score; dkv adds
    p's cast (8), and the fused dq ds's cast again (9)."""
    text = SMALL_PROGRAM.replace(
        r"%splash_mqa_fwd_segmented_residuals.1 = bf16[1,2,1024,128] custom-call(%mask, %q, %kv,"
        r' %kv), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata='
        r'{"xprof_metadata":"{\"block_q\": 512, \"block_kv\": 512}"}}',
        rf"%splash_mqa_{phase}_segmented.1 = bf16[1,2,1024,128] custom-call(%mask, %q, %kv,"
        r' %kv), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata='
        rf'{{"xprof_metadata":"{metadata}"}}}}',
    )
    assert f"splash_mqa_{phase}_segmented.1" in text
    found = estimate(parse_hlo(text), dataclasses.replace(RATES, vector_values_per_second=1e10))
    assert found.kernel_vector_seconds == pytest.approx(per_score * 2 * 3 * 512 * 512 / 1e10)


def test_the_v5e_vector_unit_works_a_register_a_cycle_at_the_matrix_units_clock():
    """197 TFLOP/s over 4 MXUs of 128 x 128 multiply-adds (2 FLOPs each) is a 1.503 GHz clock;
    8 x 128 values a cycle."""
    rates = Rates.of_chip(chip_by_name("v5e"))
    assert rates.vector_values_per_second == pytest.approx(197e12 / (4 * 128 * 128 * 2) * 1024)
    assert rates.vector_values_per_second == pytest.approx(1.5390625e12)
