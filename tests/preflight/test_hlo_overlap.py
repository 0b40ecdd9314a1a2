"""The collective-overlap summary on hand-written HLO with known answers, and on a real program."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.preflight.hlo import text as hlo_text
from rl_trainer_bench.preflight.hlo.counts import execution_counts
from rl_trainer_bench.preflight.hlo.overlap import analyze_file, analyze_text
from rl_trainer_bench.preflight.hlo.parse import HloParseError, parse_hlo, parse_shape
from rl_trainer_bench.preflight.hlo.replica_groups import mesh_partition, parse_mesh, replica_groups
from rl_trainer_bench.preflight.hlo.report import format_report

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
    output = tmp_path / "report.json"
    assert cli.main(["hlo-overlap", str(broken), "--output", str(output)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"{broken}:4:" in error
    assert not output.exists()  # no partial output
    assert cli.main(["hlo-overlap", str(fixture), "--output", str(output)]) == 0
    (written,) = json.loads(output.read_text())
    assert written["total"]["overlapped_fraction"] == pytest.approx(0.8)
    assert capsys.readouterr().out.startswith("program ")  # the text report on stdout still


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


# ----------------------------------------------------------------------------------------------
# Hostile and hand-written input
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def without_xla_parser(monkeypatch):
    monkeypatch.setattr(hlo_text, "_xla_parser", lambda: None)


def _file_reports(name_or_text, mesh=None, source="f.hlo"):
    path = TESTDATA / name_or_text if name_or_text.endswith(".hlo") else None
    data = path.read_bytes() if path else name_or_text.encode()
    return analyze_file(data, str(path or source), mesh, "p")


def _assert_handwritten_answer(report, mesh_axes=None, group=0):
    gather, reduce = sorted(report.collectives, key=lambda c: c.kind)
    assert (reduce.kind, reduce.form, reduce.overlapped) == ("all-reduce", "async pair", True)
    assert reduce.bytes == 64 * 128 * 4 and reduce.between_flops == 2 * 64 * 256 * 128
    assert (gather.kind, gather.form, gather.bytes) == ("all-gather", "sync", 64 * 512 * 4)
    for collective in (gather, reduce):
        assert collective.all_devices and collective.group_size == group
        assert collective.mesh_axes == mesh_axes


def test_hand_written_forms_are_read_line_by_line(without_xla_parser):
    (report,) = _file_reports("hlo_handwritten_forms.hlo")
    assert not report.canonical_lines and not report.partitions_recorded
    _assert_handwritten_answer(report)
    lines = (TESTDATA / "hlo_handwritten_forms.hlo").read_text().splitlines()
    reduce = next(c for c in report.collectives if c.kind == "all-reduce")
    assert lines[reduce.line - 1].strip() == "ar-start = f32[64,128]"  # where it starts
    assert "  all " in format_report(report)


def test_empty_replica_groups_span_the_mesh_when_one_is_given(without_xla_parser):
    (report,) = _file_reports("hlo_handwritten_forms.hlo", {"fsdp": 2, "expert": 4})
    _assert_handwritten_answer(report, ("fsdp", "expert"), 8)


HEADER_OVER_LINES = (
    (TESTDATA / "hlo_handwritten_forms.hlo")
    .read_text()
    .replace(
        "ENTRY main {",
        "ENTRY main (p0: f32[64,128],\n    p1: f32[128,256], ids: u32[1,2])\n"
        "    -> (f32[64,128], f32[64,512], u32[1,2]) {",
    )
)


def test_text_this_reader_refuses_goes_through_xlas_parser():
    if hlo_text._xla_parser() is None:
        pytest.skip("this jaxlib has no HLO text parser")
    (report,) = _file_reports(HEADER_OVER_LINES)
    assert report.canonical_lines
    _assert_handwritten_answer(report)
    assert "XLA's canonical printing" in format_report(report)


def test_without_xlas_parser_the_readers_error_stands(without_xla_parser):
    with pytest.raises(HloParseError, match=r"f\.hlo:12: expected a computation header"):
        _file_reports(HEADER_OVER_LINES)


def test_each_module_of_a_file_gets_its_own_report(tmp_path, capsys):
    first, second = _file_reports("hlo_two_modules.hlo")
    assert (first.program, second.program) == ("p:first_program", "p:second_program")
    assert [c.kind for c in first.collectives] == ["all-gather"]
    assert [(c.kind, c.line) for c in second.collectives] == [("reduce-scatter", 25)]
    fixture = TESTDATA / "hlo_two_modules.hlo"
    assert cli.main(["hlo-overlap", str(fixture), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    broken = tmp_path / "broken.hlo"
    broken.write_text(fixture.read_text().replace("reduce-scatter(%p)", "reduce-scatter(%p"))
    assert cli.main(["hlo-overlap", str(broken)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "broken.hlo:25:" in captured.err


def test_indented_modules_as_xlas_cpp_tests_write_them_each_get_a_report():
    """XLA's C++ tests hold modules in indented raw strings, several to a file split by
    `// -----`; pasted as they are, each indented header starts a module of its own."""
    text = """
  HloModule a, is_scheduled=true

  ENTRY e {
    p = f32[1] parameter(0)
    ROOT ag = f32[2] all-gather(p), dimensions={0}
  }

// -----

  HloModule b, is_scheduled=true

  ENTRY e {
    p = f32[1] parameter(0)
    ROOT ag = f32[4] all-gather(p), dimensions={0}
  }
"""
    first, second = _file_reports(text)
    assert (first.program, second.program) == ("p:a", "p:b")
    assert [(c.bytes, c.line) for c in first.collectives] == [(8, 6)]
    assert [(c.bytes, c.line) for c in second.collectives] == [(16, 15)]


def test_an_in_place_permute_moves_its_slices_not_its_buffers():
    """In-place collective-permute: operands input, output buffer and two start indices; what
    crosses the link is a slice of each input array (`slice_sizes`), not the buffers."""
    text = """HloModule inplace, num_partitions=2

ENTRY %main {
  %src = bf16[64,16] parameter(0)
  %dst = bf16[64,64] parameter(1)
  %zero = s32[] constant(0)
  %at = (s32[], s32[]) tuple(%zero, %zero)
  %cp = bf16[64,64] collective-permute(%src, %dst, %at, %at), source_target_pairs={{0,1}}, slice_sizes={{32,16}}
  %a = (f32[8,4], s8[8,4]) parameter(2)
  %b = (f32[8,8], s8[8,8]) parameter(3)
  %i = ((s32[], s32[]), (s32[], s32[])) parameter(4)
  %s = ((f32[8,4], s8[8,4]), (f32[8,8], s8[8,8]), u32[], u32[]) collective-permute-start(%a, %b, %i, %i),
      source_target_pairs={{0,1}}, slice_sizes={{8,4}, {2,4}}
  %d = (f32[8,8], s8[8,8]) collective-permute-done(%s)
  ROOT %out = (bf16[64,64], (f32[8,8], s8[8,8])) tuple(%cp, %d)
}
"""
    (report,) = _file_reports(text)
    by_line = {c.line: c for c in report.collectives}
    assert by_line[8].bytes == 32 * 16 * 2  # 1 KiB of the 8 KiB buffer
    assert by_line[12].bytes == 8 * 4 * 4 + 2 * 4  # a slice of each array of the tuple


def test_point_to_point_and_broadcast_are_listed_as_their_kinds():
    """send/recv open async pairs their -done closes (no `-start` in the name); a
    collective-broadcast is a collective of its own, synchronous or in an async wrapper."""
    text = """HloModule p2p, is_scheduled=true, num_partitions=2

%bcast (x: s32[6]) -> s32[6] {
  %x = s32[6] parameter(0)
  ROOT %b = s32[6] collective-broadcast(%x), replica_groups={{1,0}}
}

ENTRY %main {
  %data = bf16[4,128] parameter(0)
  %token = token[] after-all()
  %send = (bf16[4,128], u32[], token[]) send(%data, %token), channel_id=3
  %recv = (bf16[4,128], u32[], token[]) recv(%token), channel_id=3
  %work = bf16[4,128] negate(%data)
  %send-done = token[] send-done(%send), channel_id=3
  %recv-done = (bf16[4,128], token[]) recv-done(%recv), channel_id=3
  %got = bf16[4,128] get-tuple-element(%recv-done), index=0
  %v = s32[6] parameter(1)
  %sync = s32[6] collective-broadcast(%v), replica_groups={{0,1}}
  %start = ((s32[6]), s32[6]) async-start(%sync), calls=%bcast
  ROOT %done = s32[6] async-done(%start)
}
"""
    (report,) = _file_reports(text)
    rows = [(c.kind, c.form, c.bytes, c.between_compute) for c in report.collectives]
    assert rows == [
        ("send", "async pair", 4 * 128 * 2, 1),  # the negate runs beside it
        ("recv", "async pair", 4 * 128 * 2, 1),
        ("collective-broadcast", "sync", 24, 0),
        ("collective-broadcast", "async wrapper", 24, 0),
    ]


def test_a_start_no_done_closes_runs_as_one_synchronous_op():
    """A collective fusion's computation may hold a `-start` with no `-done`: the fusion's one
    kernel runs it, so it is synchronous (and exposed), not an async pair."""
    text = """HloModule fused_start

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

%collective_body (p: f32[512]) -> f32[512] {
  %p = f32[512] parameter(0)
  ROOT %ar = f32[512] all-reduce-start(%p), replica_groups={{0,1}}, to_apply=%sum
}

ENTRY %main (x: f32[512]) -> f32[512] {
  %x = f32[512] parameter(0)
  ROOT %f = f32[512] fusion(%x), kind=kCustom, calls=%collective_body
}
"""
    (only,) = _file_reports(text)[0].collectives
    assert (only.form, only.fusion, only.bytes) == ("sync", "f", 512 * 4)
    assert not only.is_async and not only.overlapped


def test_a_multi_line_backend_config_closing_its_objects_on_their_own_lines():
    """A backend_config written over several lines closes its nested objects on lines that start
    with `}`: they continue the instruction, not close the computation."""
    text = """HloModule m, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

ENTRY %main (x: f32[256]) -> f32[256] {
  %x = f32[256] parameter(0)
  %s = f32[256] all-reduce-start(%x), replica_groups={{0,1}}, to_apply=%sum,
      backend_config={
        "collective_backend_config":{
          "is_sync":false
        },
        "force_earliest_schedule":false}
  %n = f32[256] negate(%x)
  ROOT %d = f32[256] all-reduce-done(%s)
}
"""
    (reduce,) = _file_reports(text, source="m.hlo")[0].collectives
    assert (reduce.form, reduce.line, reduce.bytes, reduce.between_compute) == (
        "async pair",
        11,
        256 * 4,
        1,
    )
    with pytest.raises(HloParseError, match=r"m\.hlo:11: not an HLO instruction"):
        _file_reports(text.replace("(%x), replica", "(%x, replica"), source="m.hlo")


def test_a_second_module_or_computation_of_one_name_is_refused():
    text = (TESTDATA / "hlo_two_modules.hlo").read_text()
    with pytest.raises(HloParseError, match=r"t\.hlo:15: a second HloModule"):
        parse_hlo(text, "t.hlo")
    one_module = text[text.index("HloModule second") :]
    doubled = one_module.replace(
        "ENTRY %main",
        "%helper (x: f32[]) -> f32[] {\n  ROOT %x = f32[] parameter(0)\n}\n\nENTRY %main",
    )
    with pytest.raises(HloParseError, match="a second computation named helper"):
        parse_hlo(doubled, "t.hlo")


def test_a_gpu_pair_marked_is_sync_is_made_synchronous_and_exposed():
    (report,) = _file_reports("hlo_gpu_sync_pair.hlo")
    made, kept = report.collectives
    assert made.made_sync and not made.is_async and not made.overlapped
    assert not kept.made_sync and kept.overlapped
    assert report.total.exposed_bytes == report.total.overlapped_bytes == 256 * 4
    assert "async pair (made)" in format_report(report)


def test_a_mesh_of_another_device_count_is_refused(capsys):
    fixture = str(TESTDATA / "collectives_sync.hlo")
    assert cli.main(["hlo-overlap", fixture, "--mesh", "fsdp=2,context=2"]) == 2
    assert "has 4 devices, but module sync_collectives was compiled for 8" in (
        capsys.readouterr().err
    )


def test_gzipped_binary_and_piped_input(tmp_path, capsys):
    fixture = TESTDATA / "collectives_async_pair.hlo"
    packed = tmp_path / "dump.hlo.gz"
    packed.write_bytes(gzip.compress(fixture.read_bytes()))
    assert cli.main(["hlo-overlap", str(packed), "--json"]) == 0
    assert cli.main(["hlo-overlap", str(fixture), "--json"]) == 0
    from_gzip, from_text = (json.loads(t + "]") for t in capsys.readouterr().out.split("\n]\n")[:2])
    assert from_gzip[0].pop("program") == "dump"
    assert from_text[0].pop("program") == "collectives_async_pair"
    assert from_gzip == from_text
    proto = tmp_path / "module.pb"
    proto.write_bytes(b"\x08\x96\x01\x12\x07\xff\xfe main")
    truncated = tmp_path / "cut.hlo.gz"
    truncated.write_bytes(packed.read_bytes()[:40])
    for bad in (proto, truncated):
        assert cli.main(["hlo-overlap", str(bad)]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_output_cut_short_by_the_reader_is_no_error(tmp_path):
    """`hlo-overlap FILE | head -1`: the reader leaves early; no traceback, exit 0."""
    body = "\n".join(
        f"  %ar.{i} = f32[8]{{0}} all-reduce(%p), replica_groups={{}}, to_apply=%add"
        for i in range(3000)
    )
    text = (
        "HloModule many, num_partitions=2\n\n%add (a: f32[], b: f32[]) -> f32[] {\n"
        "  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %c = f32[] add(%a, %b)\n}\n\n"
        f"ENTRY %main (p: f32[8]) -> f32[8] {{\n  %p = f32[8]{{0}} parameter(0)\n{body}\n"
        "  ROOT %out = f32[8]{0} copy(%p)\n}\n"
    )
    path = tmp_path / "many.hlo"
    path.write_text(text)
    command = f"{sys.executable} -m rl_trainer_bench.cli hlo-overlap {path} | head -1"
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.startswith("program many:") and result.stderr == ""
    assert result.returncode == 0


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("lhs_contracting_dims={1}", "lhs_contracting_dims={0{1}", "does not name dimensions"),
        ("lhs_contracting_dims={1}", "lhs_contracting_dims={7}", "does not name dimensions"),
        ("%p1 = f32[128,256]{1,0}", "%p1 = f3x[128,256]{1,0}", "not an HLO instruction"),
    ],
)
def test_damaged_attributes_and_types_are_refused_with_a_line(capsys, tmp_path, old, new, message):
    text = (TESTDATA / "collectives_async_pair.hlo").read_text()
    assert old in text
    path = tmp_path / "damaged.hlo"
    path.write_text(text.replace(old, new, 1))
    assert cli.main(["hlo-overlap", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_damaged_replica_groups_are_not_understood_rather_than_a_crash():
    assert replica_groups("replica_groups=[2,,4]<=[8]", 8) is None
    assert replica_groups("replica_groups=[3,4]<=[8]", 8) is None
    assert replica_groups("replica_groups=mesh['a'=3,'b'=2], device_ids=([8]) {'a'}", 8) is None


def test_a_loop_whose_body_calls_back_into_itself_is_refused(capsys, tmp_path):
    text = (TESTDATA / "collectives_async_pair.hlo").read_text()
    assert "body=%body" in text
    path = tmp_path / "recursive.hlo"
    path.write_text(text.replace("body=%body", "body=%main", 1))
    assert cli.main(["hlo-overlap", str(path)]) == 2
    err = capsys.readouterr().err
    assert "computation main calls itself (main -> main)" in err and err.count("\n") == 1


# Per collective of collectives_async_groups.hlo: (kind, bytes, runs, group size, overlapped).
ASYNC_GROUPS = {
    "g-start/ag": ("all-gather", 64 * 256 * 4, 1, 4, True),
    "g-start/ar": ("all-reduce", 64 * 256 * 4, 1, 2, True),
    "g-start/rs": ("reduce-scatter", 64 * 256 * 4, 1, 4, True),
    "c-start": ("all-to-all", 16 * 256 * 4, 1, 2, True),
    "ring-start/fw-start": ("collective-permute", 8 * 256 * 4, 1, 2, False),
    "ring-start/bw-start": ("collective-permute", 8 * 256 * 4, 1, 2, False),
    "lg-start/ag.2": ("all-gather", 64 * 256 * 4, 3, 4, True),
    "lg-start/rs.2": ("reduce-scatter", 64 * 256 * 4, 3, 2, True),  # through a call
    "lg-start/ar.2": ("all-reduce", 64 * 256 * 4, 6, 4, True),  # in a loop of 2, in a loop of 3
}


def _async_group_rows(report):
    return {
        c.name: (c.kind, c.bytes, c.executions, c.group_size, c.overlapped)
        for c in report.collectives
    }


def test_every_collective_an_async_wrapper_runs_counts_once_per_run():
    report = report_of("collectives_async_groups.hlo")
    assert _async_group_rows(report) == ASYNC_GROUPS
    rows = {c.name: c for c in report.collectives}
    matmul = 2 * 64 * 256 * 128
    for name in ("g-start/ag", "g-start/ar", "g-start/rs"):  # one window: the matmul beside it
        assert (rows[name].between_compute, rows[name].between_flops) == (1, matmul)
        assert rows[name].form == "async wrapper" and rows[name].computation == "main"
    assert (rows["lg-start/ar.2"].between_instructions, rows["lg-start/ar.2"].between_compute) == (
        2,
        1,
    )  # the update step, then the matmul
    assert rows["ring-start/fw-start"].between_instructions == 0
    kinds = {s.kind: s for s in report.kinds}
    assert kinds["all-reduce"].bytes == (1 + 6) * 64 * 256 * 4
    assert report.total.bytes == (3 * 1 + 3 + 6 + 3) * 64 * 256 * 4 + 16 * 256 * 4 + 2 * 8 * 256 * 4
    assert report.total.exposed_bytes == 2 * 8 * 256 * 4


def test_xlas_canonical_printing_of_async_groups_gives_the_same_report():
    parser = hlo_text._xla_parser()
    if parser is None:
        pytest.skip("this jaxlib has no HLO text parser")
    canonical = parser((TESTDATA / "collectives_async_groups.hlo").read_text()).to_string()
    assert _async_group_rows(analyze_text(canonical, "canonical", MESH)) == ASYNC_GROUPS


def test_wrapped_computations_named_by_called_computations_are_read_too():
    text = (TESTDATA / "collectives_async_groups.hlo").read_text()
    assert "async-start(%p.s), calls=%ring" in text
    spelled = text.replace(
        "async-start(%p.s), calls=%ring", "async-start(%p.s), called_computations={%ring}"
    )
    assert _async_group_rows(analyze_text(spelled, "spelled", MESH)) == ASYNC_GROUPS


def test_an_async_group_run_synchronously_is_exposed():
    text = (TESTDATA / "collectives_async_groups.hlo").read_text()
    marked = text.replace(
        'frontend_attributes={_collectives_group=""}',
        'frontend_attributes={_collectives_group=""}, '
        'backend_config={"collective_backend_config":{"is_sync":true}}',
    )
    rows = {c.name: c for c in analyze_text(marked, "sync", MESH).collectives}
    assert all(rows[f"g-start/{n}"].made_sync for n in ("ag", "ar", "rs"))
    assert not any(rows[f"g-start/{n}"].overlapped for n in ("ag", "ar", "rs"))
    assert rows["c-start"].overlapped


def test_a_wrapped_computation_that_runs_itself_is_refused(capsys, tmp_path):
    text = (TESTDATA / "collectives_async_groups.hlo").read_text()
    assert "to_apply=%inner_rs" in text
    path = tmp_path / "recursive.hlo"
    path.write_text(text.replace("to_apply=%inner_rs", "to_apply=%loop_group", 1))
    assert cli.main(["hlo-overlap", str(path)]) == 2
    err = capsys.readouterr().err
    assert "computation loop_group calls itself (loop_group -> loop_group)" in err
    assert err.count("\n") == 1


# Per collective of collectives_in_fusions.hlo: (kind, form, bytes, runs, group, axes, overlapped,
# fusion). The loop runs 5 times (0 to 5 by its condition); the permute's computation runs twice.
IN_FUSIONS = {
    "ar.1": ("all-reduce", "sync", 1 * 8 * 128 * 2, 5, 2, ("expert",), False, "fusion.ar-1"),
    "ar.2": (
        "all-reduce",
        "sync",
        1 * 8 * 128 * 2,
        5,
        4,
        ("context", "expert"),
        False,
        "fusion.ar-2",
    ),
    "rs": ("reduce-scatter", "sync", 4 * 8 * 128 * 2, 5, 2, ("expert",), False, ""),
    "ag": ("all-gather", "sync", 64 * 256 * 4, 1, 4, ("context", "expert"), False, "gather_fusion"),
    "a2a": ("all-to-all", "sync", 16 * 256 * 4, 1, 2, ("context",), False, "inner_fusion"),
    "ag-start": (
        "all-gather",
        "async pair",
        64 * 256 * 4,
        1,
        4,
        ("context", "expert"),
        False,  # a fusion's computation has no schedule: no window
        "async_fusion",
    ),
    "cp": ("collective-permute", "sync", 8 * 256 * 4, 2, 2, ("fsdp",), False, "twice.1,twice.2"),
}


def _fusion_rows(report):
    return {
        c.name: (
            c.kind,
            c.form,
            c.bytes,
            c.executions,
            c.group_size,
            c.mesh_axes,
            c.overlapped,
            c.fusion,
        )
        for c in report.collectives
    }


def test_collectives_inside_fusions_are_counted_and_classified():
    report = report_of("collectives_in_fusions.hlo")
    assert _fusion_rows(report) == IN_FUSIONS
    gather = {c.name: c for c in report.collectives}["ag-start"]
    assert (gather.between_instructions, gather.between_flops) == (0, 0)  # not the matmul
    kinds = {s.kind: s for s in report.kinds}
    assert (kinds["all-reduce"].count, kinds["all-reduce"].executions) == (2, 10)
    assert kinds["all-reduce"].bytes == 10 * 8 * 128 * 2
    assert kinds["all-gather"].async_bytes == 64 * 256 * 4
    assert report.total.bytes == (5 * 2 * 2048 + 5 * 8192) + 2 * 65536 + 16384 + 2 * 8192
    assert report.total.exposed_bytes == report.total.bytes
    assert "sync (fused)" in format_report(report) and "(fused): in the computation" in (
        format_report(report)
    )


def test_xlas_canonical_printing_of_fused_collectives_gives_the_same_report():
    parser = hlo_text._xla_parser()
    if parser is None:
        pytest.skip("this jaxlib has no HLO text parser")
    canonical = parser((TESTDATA / "collectives_in_fusions.hlo").read_text()).to_string()
    assert _fusion_rows(analyze_text(canonical, "canonical", MESH)) == IN_FUSIONS


def test_fused_computations_are_left_to_the_fusion_in_the_loop_counted_cost():
    module = parse_hlo((TESTDATA / "collectives_in_fusions.hlo").read_text())
    assert "fused-ar.1" not in execution_counts(module)  # its FLOPs count at the fusion
    assert execution_counts(module)["while_body"] == 5


def test_a_list_of_called_computations_without_braces_is_read_whole():
    (instruction,) = parse_hlo(
        "HloModule m\nENTRY %e (p: f32[2]) -> f32[2] {\n  %p = f32[2]{0} parameter(0)\n"
        '  ROOT %c = f32[2]{0} custom-call(%p), custom_call_target="t", '
        'calls=%fused.a-1, %region_0.2, metadata={op_name="x"}\n}\n'
    ).entry.instructions[1:]
    assert instruction.called_computations() == ["fused.a-1", "region_0.2"]
    assert instruction.attribute("metadata") == '{op_name="x"}'


FUSION_IN_A_WRAPPER = """HloModule wrapped_fusion, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused_reduce (v: f32[64,256]) -> f32[64,256] {
  %v = f32[64,256]{1,0} parameter(0)
  ROOT %ar = f32[64,256]{1,0} all-reduce(%v), channel_id=1, replica_groups=[4,2]<=[8], to_apply=%add
}

%wrapped (w: f32[64,256]) -> f32[64,256] {
  %w = f32[64,256]{1,0} parameter(0)
  ROOT %f = f32[64,256]{1,0} fusion(%w), kind=kCustom, calls=%fused_reduce
}

ENTRY %main (a: f32[64,256]) -> f32[64,256] {
  %a = f32[64,256]{1,0} parameter(0)
  %start = ((f32[64,256]{1,0}), f32[64,256]{1,0}) async-start(%a), calls=%wrapped
  %n = f32[64,256]{1,0} negate(%a)
  ROOT %done = f32[64,256]{1,0} async-done(%start)
}
"""


def test_a_fusion_an_async_wrapper_runs_counts_once_in_the_wrappers_window():
    (collective,) = analyze_text(FUSION_IN_A_WRAPPER, "wrapped.hlo", MESH).collectives
    assert (collective.kind, collective.form, collective.executions) == (
        "all-reduce",
        "async wrapper",
        1,
    )
    assert collective.overlapped and collective.fusion == "f"
    assert collective.bytes == 64 * 256 * 4


def test_fused_collectives_read_the_same_without_percent_signs():
    """XLA's hand-written test modules name instructions and computations without `%`."""
    text = (TESTDATA / "collectives_in_fusions.hlo").read_text()
    bare = text.replace("%", "")
    assert "calls=fused-ar.1" in bare
    assert _fusion_rows(analyze_text(bare, "bare.hlo", MESH)) == IN_FUSIONS
