"""A profiler trace's op times charged to the package functions the ops came from: a device's op
line written out here (programs told apart by the line above it, a loop's op holding its body's),
and a real trace of a compiled engine function on the host CPU."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import jax
import pytest

from rl_trainer_bench.engine.builtin import moe
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo import trace_ops


def _span(tid, name, ts, dur, **args):
    return {"ph": "X", "pid": 7, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


def _write(folder, events):
    folder.mkdir(parents=True)
    with gzip.open(folder / "vm.trace.json.gz", "wt") as trace:
        json.dump({"traceEvents": events}, trace)


def test_a_devices_ops_are_charged_by_program_with_a_loops_body_counted_once(tmp_path):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "XLA Modules"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 2, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}},
    ]
    events = [
        *meta,
        _span(1, "jit_fwd_bwd(17)", 0, 100),
        _span(1, "jit_update(18)", 100, 30),
        _span(2, "fusion.1", 0, 40),
        _span(2, "while.2", 40, 60),
        _span(2, "convolution.3", 45, 40),  # the loop's body, inside while.2
        _span(2, "fusion.1", 100, 30),  # the same op name in another program
        # the host's runtime events are not the device's ops
        {"ph": "X", "pid": 9, "tid": 3, "name": "x", "ts": 0, "dur": 500, "args": {"hlo_op": "x"}},
    ]
    _write(tmp_path / "profile", events)
    sources = {
        "jit_fwd_bwd": {
            "fusion.1": "moe.py:a",
            "while.2": "model.py:s",
            "convolution.3": "moe.py:b",
        },
        "jit_update": {"fusion.1": "optimizer.py:c"},
    }
    ops = trace_ops.op_events(trace_ops.read_trace(tmp_path))
    rows = trace_ops.time_by_source(ops, sources)
    seconds = {row["source"]: round(row["seconds"] * 1e6, 6) for row in rows}
    assert seconds == {"moe.py:a": 40, "moe.py:b": 40, "optimizer.py:c": 30, "model.py:s": 20}
    # one function's ops: fusion.1 of jit_fwd_bwd, not jit_update's op of the same name
    (row,) = trace_ops.time_by_op(ops, sources, "moe.py:a")
    assert (row["module"], row["op"], round(row["seconds"] * 1e6, 6), row["events"]) == (
        "jit_fwd_bwd", "fusion.1", 40, 1
    )  # fmt: skip


def test_a_functions_many_small_ops_of_one_kind_sum_to_one_row_by_kind():
    """Three scalar compares of 4 us each outweigh one 10 us fusion by kind, though none of them
    does by op; the same kind in another program, and an op the dump lacks, are rows of their own."""
    rows = [
        {"module": "jit_fwd_bwd", "op": "fusion.1", "seconds": 10e-6, "events": 1},
        *(
            {"module": "jit_fwd_bwd", "op": f"compare.{i}", "seconds": 4e-6, "events": 2}
            for i in range(3)
        ),
        {"module": "jit_update", "op": "compare.9", "seconds": 1e-6, "events": 1},
        {"module": "jit_fwd_bwd", "op": "gone.7", "seconds": 2e-6, "events": 1},
    ]
    descriptions = {
        "jit_fwd_bwd": {
            "fusion.1": "fusion bf16[40960,2048]",
            **{f"compare.{i}": "compare pred[]" for i in range(3)},
        },
        "jit_update": {"compare.9": "compare pred[]"},
    }
    kinds = trace_ops.time_by_kind(rows, descriptions)
    assert [(k["module"], k["kind"], k["ops"], k["events"]) for k in kinds] == [
        ("jit_fwd_bwd", "compare pred[]", 3, 6),
        ("jit_fwd_bwd", "fusion bf16[40960,2048]", 1, 1),
        ("jit_fwd_bwd", "?", 1, 1),
        ("jit_update", "compare pred[]", 1, 1),
    ]
    assert kinds[0]["seconds"] == pytest.approx(12e-6)
    table = trace_ops.kinds_table(kinds, 2, 2).splitlines()
    assert table[2] == "| jit_fwd_bwd | `compare pred[]` | 3 | 0.01 | 3 |"
    assert len(table) == 4  # the top 2 kinds under the header


def test_on_the_host_cpu_the_first_devices_runtime_events_are_its_ops(tmp_path):
    """Host devices run side by side, each op once per device: one device's events are the
    step's ops; events that name no op (the Python thread's) are not ops."""
    meta = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}}]
    events = [
        *meta,
        _span(1, "fusion.1", 0, 50, hlo_op="fusion.1", hlo_module="jit_f", device_ordinal="0"),
        _span(2, "fusion.1", 0, 55, hlo_op="fusion.1", hlo_module="jit_f", device_ordinal="1"),
        _span(1, "dot.2", 50, 20, hlo_op="dot.2", hlo_module="jit_f", device_ordinal="0"),
        _span(3, "PjitFunction(f)", 0, 90),
    ]
    _write(tmp_path / "profile", events)
    ops = trace_ops.op_events(trace_ops.read_trace(tmp_path))
    assert [(op.op, round(op.seconds * 1e6, 6)) for op in ops] == [("fusion.1", 50), ("dot.2", 20)]


def test_an_op_no_text_holds_is_charged_as_such_not_dropped():
    ops = [trace_ops.OpEvent("jit_other", "fusion.9", 0.5)]
    (row,) = trace_ops.time_by_source(ops, {"jit_fwd_bwd": {"fusion.9": "moe.py:a"}})
    assert (row["source"], row["seconds"], row["events"]) == (trace_ops.NOT_IN_HLO, 0.5, 1)


def test_a_missing_trace_is_named():
    with pytest.raises(FileNotFoundError, match=r"no \*\.trace\.json\.gz under"):
        trace_ops.read_trace(Path("/nonexistent-profile"))


def test_a_real_host_trace_of_an_engine_function_is_charged_to_it(tmp_path):
    keys = jax.random.split(jax.random.key(0), 4)
    buffer = jax.random.normal(keys[0], (8, 64, 128))
    gate, up = (jax.random.normal(k, (8, 128, 256)) for k in keys[1:3])
    down = jax.random.normal(keys[3], (8, 256, 128))

    def experts(buffer, gate, up, down):
        return moe.experts_ffn(buffer, moe.ExpertWeights((gate, up), down), "einsum")

    compiled = jax.jit(experts).lower(buffer, gate, up, down).compile()
    text = compiled.as_text()
    (tmp_path / "hlo").mkdir()
    (tmp_path / "hlo" / "module_0001.jit_experts.cpu_after_optimizations.txt").write_text(text)
    jax.block_until_ready(compiled(buffer, gate, up, down))
    jax.profiler.start_trace(str(tmp_path / "profile"))
    started = time.perf_counter()
    for _ in range(3):
        jax.block_until_ready(compiled(buffer, gate, up, down))
    wall = time.perf_counter() - started
    jax.profiler.stop_trace()
    ops = trace_ops.op_events(trace_ops.read_trace(tmp_path / "profile"))
    rows = trace_ops.time_by_source(
        [op for op in ops if op.module == "jit_experts"],
        trace_ops.dumped_ops(tmp_path / "hlo")[0],
    )
    by_source = {row["source"]: row for row in rows}
    assert trace_ops.NOT_IN_HLO not in by_source
    assert by_source["moe.py:expert_matmul"]["seconds"] > 0
    assert by_source["moe.py:expert_matmul"]["events"] % 3 == 0  # every op once per call
    assert 0 < sum(row["seconds"] for row in rows) <= wall
    # the function's ops add up to its row, each named with its opcode and result shape
    sources, descriptions = trace_ops.dumped_ops(tmp_path / "hlo")
    matmul = [op for op in ops if op.module == "jit_experts"]
    by_op = trace_ops.time_by_op(matmul, sources, "moe.py:expert_matmul")
    assert sum(row["seconds"] for row in by_op) == pytest.approx(
        by_source["moe.py:expert_matmul"]["seconds"]
    )
    table = trace_ops.ops_table(by_op, 3, 10, descriptions)
    assert "f32[8,64,256]" in table and "| ? |" not in table, table  # gate's and up's products
    kinds = trace_ops.time_by_kind(by_op, descriptions)
    assert sum(kind["ops"] for kind in kinds) == len(by_op)
    assert sum(kind["seconds"] for kind in kinds) == pytest.approx(
        by_source["moe.py:expert_matmul"]["seconds"]
    )


# mtime=0: gzip's header otherwise carries the clock, and parameters that differ between the
# test processes' collections make xdist refuse the whole run
@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff\x13binary",
        gzip.compress(b'{"traceEvents": [{"ph": "X"', mtime=0)[:-4],
        gzip.compress(b"[1, 2, 3]", mtime=0),
        gzip.compress(b'{"traceEvents": "none"}', mtime=0),
    ],
    ids=["empty", "not gzip", "cut short", "JSON of another shape", "events not a list"],
)
def test_a_trace_that_is_not_one_is_refused_in_words(tmp_path, content):
    (tmp_path / "vm.trace.json.gz").write_bytes(content)
    with pytest.raises(ValueError, match=r"vm\.trace\.json\.gz: not a"):
        trace_ops.read_trace(tmp_path)


def test_malformed_events_are_left_out_and_no_ops_is_an_empty_list(tmp_path):
    events = [1, "x", {"ph": "X", "pid": 1, "ts": "0", "dur": 5}, {"ph": "M", "pid": 1}]
    _write(tmp_path / "profile", events)
    kept = trace_ops.read_trace(tmp_path)
    assert kept == []
    assert trace_ops.op_events(kept) == []


@pytest.mark.parametrize(
    "text", ["", "\x00\x01 not hlo", "HloModule m\n\nENTRY %main () -> f32[] {\n"]
)
def test_a_dump_that_is_no_modules_text_is_refused_in_words(tmp_path, text):
    (tmp_path / "module_1.jit_f.cpu_after_optimizations.txt").write_text(text)
    with pytest.raises(UserError, match=r"module_1\.jit_f\.cpu_after_optimizations\.txt"):
        trace_ops.dumped_ops(tmp_path)
