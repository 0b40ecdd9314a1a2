"""The collective-overlap summary on hand-written HLO with known answers, and on a real program."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.preflight.hlo_overlap import (
    analyze_text,
    mesh_partition,
    parse_mesh,
    replica_groups,
)
from rl_trainer_bench.preflight.hlo_parse import HloParseError, parse_hlo, parse_shape

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
MESH = {"fsdp": 2, "context": 2, "expert": 2}


def report_of(name: str, mesh=MESH):
    path = TESTDATA / name
    return analyze_text(path.read_text(), str(path), mesh)


def by_kind(report):
    return {c.kind: c for c in report.collectives}


def test_sync_collectives_are_exposed_with_bytes_and_mesh_axes():
    report = report_of("collectives_sync.hlo")
    found = by_kind(report)
    assert [c.kind for c in report.collectives] == [
        "all-gather",
        "all-reduce",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
    ]
    assert all(c.form == "sync" and not c.overlapped for c in report.collectives)
    # all-gather: f32[32,256] -> f32[128,256]; the larger buffer counts.
    assert found["all-gather"].bytes == 128 * 256 * 4
    assert found["all-reduce"].bytes == 64 * 256 * 4
    assert found["reduce-scatter"].bytes == 64 * 256 * 4
    assert found["all-to-all"].bytes == 32 * 256 * 4  # operand written with its shape
    # iota [2,4]<=[2,2,2]T(2,0,1), explicit groups, mesh form, iota T(0,2,1), permute pairs.
    assert found["all-gather"].mesh_axes == ("fsdp", "context")
    assert found["all-reduce"].mesh_axes == ("expert",)
    assert found["reduce-scatter"].mesh_axes == ("fsdp",)
    assert found["all-to-all"].mesh_axes == ("context",)
    assert found["collective-permute"].mesh_axes == ("context",)
    assert report.total.bytes == (128 + 64 + 64 + 32 + 32) * 256 * 4
    assert report.total.exposed_bytes == report.total.bytes
    assert report.total.overlapped_bytes == 0


def test_async_pair_counts_what_is_scheduled_between_start_and_done():
    report = report_of("collectives_async_pair.hlo")
    found = by_kind(report)
    gather = found["all-gather"]
    assert gather.form == "async pair"
    assert (gather.between_instructions, gather.between_compute) == (2, 1)  # fusion + bitcast
    assert gather.between_flops == 2 * 64 * 256 * 128  # the matmul fusion beside it
    assert gather.bytes == 128 * 256 * 4 and gather.overlapped
    assert gather.mesh_axes == ("fsdp", "context")
    reduce = found["all-reduce"]
    assert reduce.form == "async pair" and reduce.between_instructions == 0
    assert not reduce.overlapped  # async, but nothing to hide behind
    permute = found["collective-permute"]
    assert permute.executions == 4  # in a loop body with known_trip_count 4
    assert permute.mesh_axes == ("expert",) and permute.overlapped
    kinds = {s.kind: s for s in report.kinds}
    assert kinds["collective-permute"].bytes == 4 * 32 * 256 * 4
    assert kinds["all-reduce"].exposed_bytes == 64 * 256 * 4
    assert report.total.overlapped_bytes == (128 + 4 * 32) * 256 * 4
    assert report.total.hiding_flops == 2 * 64 * 256 * 128


def test_async_wrappers_resolve_the_wrapped_collective():
    report = report_of("collectives_async_wrapper.hlo")
    found = by_kind(report)
    assert len(report.collectives) == 3  # wrapped computations are not counted a second time
    scatter = found["reduce-scatter"]
    assert scatter.form == "async wrapper" and scatter.bytes == 64 * 256 * 4
    assert scatter.between_flops == 2 * 64 * 256 * 128 and scatter.overlapped
    assert scatter.mesh_axes == ("fsdp", "context")
    to_all = found["all-to-all"]
    assert (to_all.between_instructions, to_all.between_compute) == (2, 1)  # update + negate
    assert to_all.mesh_axes == ("expert",) and to_all.overlapped
    ragged = found["ragged-all-to-all"]
    assert ragged.bytes == 16 * 256 * 4  # the input only: not the output buffer nor the offsets
    assert ragged.group_size == 8 and ragged.mesh_axes == ("fsdp", "context", "expert")
    assert not ragged.overlapped


def test_tpu_loop_without_recorded_trip_count_reads_it_from_the_condition():
    text = """HloModule loop, is_scheduled=true, num_partitions=2

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[]{:T(128)}, f32[8]{0:T(256)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %x = f32[8]{0:T(256)} get-tuple-element(%p), index=1
  %ar = f32[8]{0:T(256)S(1)} all-reduce(%x), channel_id=1, replica_groups={{0,1}}, to_apply=%body
  ROOT %t = (s32[]{:T(128)}, f32[8]{0:T(256)}) tuple(%i, %ar)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %limit = s32[]{:T(128)} constant(60)
  %c = (s32[]{:T(128)}, /*index=1*/f32[8]{0:T(256)}) parameter(0)
  %j = s32[]{:T(128)} get-tuple-element(%c), index=0
  ROOT %lt = pred[]{:T(512)} compare(%j, %limit), direction=LT
}

ENTRY %main (a: f32[8]) -> (s32[], f32[8]) {
  %a = f32[8]{0:T(256)} parameter(0)
  %zero = s32[]{:T(128)} constant(1)
  %start = s32[]{:T(128)} copy(%zero)
  %init = (s32[]{:T(128)}, f32[8]{0:T(256)}) tuple(%start, %a)
  ROOT %w = (s32[]{:T(128)}, f32[8]{0:T(256)}) while(%init), condition=%cond, body=%body
}
"""
    (collective,) = analyze_text(text, "loop.hlo").collectives
    assert collective.executions == 59  # counter starts at 1 (through a copy), stops at 60
    assert collective.bytes == 32


def test_replica_group_spellings_agree():
    explicit = replica_groups("replica_groups={{0,4},{1,5},{2,6},{3,7}}", 8)
    iota = replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)", 8)
    mesh = replica_groups("replica_groups=mesh['x'=2,'y'=4] {'x'}", 8)
    assert sorted(map(sorted, explicit)) == sorted(map(sorted, iota)) == sorted(map(sorted, mesh))
    assert replica_groups("replica_groups={}", 4) == [[0, 1, 2, 3]]
    # device_ids reorder mesh positions; a sub-axis selects part of an axis.
    reordered = replica_groups(
        "replica_groups=mesh['a'=2,'b'=2], device_ids=([2,2]T(1,0)) {'a'}", 4
    )
    assert sorted(map(sorted, reordered)) == [[0, 1], [2, 3]]
    sub = replica_groups("replica_groups=mesh['a'=4] {'a':(1)2}", 4)
    assert sorted(map(sorted, sub)) == [[0, 2], [1, 3]]
    assert mesh_partition(MESH, ("expert",)) == frozenset(
        frozenset(g) for g in ([0, 1], [2, 3], [4, 5], [6, 7])
    )


def test_shapes_with_tpu_layouts_and_tuples():
    arrays, is_tuple = parse_shape(
        "(bf16[4,1024]{1,0:T(8,128)(2,1)S(1)}, /*index=1*/s32[]{:T(128)})"
    )
    assert is_tuple and [a.dims for a in arrays] == [(4, 1024), ()]
    assert [a.bytes for a in arrays] == [8192, 4]
    (array,), _ = parse_shape("f32[<=16,8]{1,0}")
    assert array.bytes == 16 * 8 * 4
    (packed,), _ = parse_shape("s4[3]")
    assert packed.bytes == 2


def test_unparsable_instruction_names_its_line():
    text = (TESTDATA / "collectives_sync.hlo").read_text().splitlines()
    text[21] = "  %broken = f32[2] this is not hlo"
    with pytest.raises(HloParseError, match=r"bad\.hlo:22: not an HLO instruction"):
        parse_hlo("\n".join(text), "bad.hlo")


def test_truncated_file_and_foreign_text_are_refused_with_a_line():
    text = (TESTDATA / "collectives_sync.hlo").read_text()
    with pytest.raises(HloParseError, match=r"t\.hlo:\d+: computation main is never closed"):
        parse_hlo(text[: text.rindex("}")], "t.hlo")
    with pytest.raises(HloParseError, match=r"x\.hlo:1: expected a computation header"):
        parse_hlo("print('not hlo')\n", "x.hlo")


def test_mesh_argument_is_validated():
    assert parse_mesh("fsdp=32,context=4,expert=2") == {"fsdp": 32, "context": 4, "expert": 2}
    with pytest.raises(ValueError, match="--mesh: 'fsdp' is not NAME=SIZE"):
        parse_mesh("fsdp")


def test_cli_prints_json_and_refuses_a_broken_file(tmp_path, capsys):
    fixture = TESTDATA / "collectives_async_pair.hlo"
    assert (
        cli.main(["hlo-overlap", str(fixture), "--mesh", "fsdp=2,context=2,expert=2", "--json"])
        == 0
    )
    (document,) = json.loads(capsys.readouterr().out)
    assert document["total"]["overlapped_fraction"] == pytest.approx(0.8)
    broken = tmp_path / "broken.hlo"
    broken.write_text("HloModule m\n\nENTRY %main () -> f32[] {\n  %x = garbage\n}\n")
    assert cli.main(["hlo-overlap", str(broken)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"{broken}:4:" in error


def test_real_program_on_eight_cpu_devices():
    """A sharded matmul whose collectives XLA chooses; the summary must see them and their axes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("fsdp", "context", "expert"))

    def step(x, w):
        return jnp.tanh(x @ w).sum(axis=0)

    x = jax.ShapeDtypeStruct(
        (64, 32), jnp.float32, sharding=NamedSharding(mesh, P(("fsdp", "context")))
    )
    w = jax.ShapeDtypeStruct(
        (32, 16), jnp.float32, sharding=NamedSharding(mesh, P("expert", "fsdp"))
    )
    compiled = jax.jit(step, out_shardings=NamedSharding(mesh, P("context"))).lower(x, w).compile()
    report = analyze_text(
        compiled.as_text(), "step", dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    )
    kinds = {c.kind for c in report.collectives}
    assert {"all-gather", "all-reduce"} <= kinds
    # Contracting over the expert-sharded dim needs a sum over expert; the batch sum over rows one
    # over (fsdp, context). The CPU backend runs collectives synchronously.
    axes = {c.mesh_axes for c in report.collectives if c.kind == "all-reduce"}
    assert ("expert",) in axes and ("fsdp", "context") in axes
    assert all(not c.is_async for c in report.collectives)
    assert report.total.bytes == sum(c.bytes * c.executions for c in report.collectives) > 0
