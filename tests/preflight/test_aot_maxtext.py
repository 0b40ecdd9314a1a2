"""`aot` on MaxText's engine, through the stand-in (tests/maxtext_stand_in.py): its three programs
lowered from abstract inputs on the local devices, the state beside each, the trainer keys it
refuses left out and listed, depths that repeat the layer pattern, and the HLO for `hlo-overlap`."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import maxtext_stand_in
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.chips import accelerators
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.maxtext import aot as maxtext_aot
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight import step_estimate
from rl_trainer_bench.preflight.aot import check, depth, engine_module
from rl_trainer_bench.preflight.aot import compile as aot_compile
from rl_trainer_bench.preflight.aot import report as aot_report
from rl_trainer_bench.units import human_bytes

STAND_IN = "maxtext_stand_in:StandInMaxTextEngine"
CELL = "cpu-tiny-qwen3.5"
# One key maxtext 0.2.5 does not know, one it takes.
ARGV = 'MAXTEXT_EXTRA_FLAGS="use_gdn_kernel=true adam_b1=0.8" python -m tunix.main'


@pytest.fixture(scope="module")
def report():
    return check.run_check(CELL, "local", trainer_argv=ARGV, engine=STAND_IN)


def _param_bytes() -> int:
    """The stand-in's weights at the cell's shapes, float32, whole on every device (replicated):
    embedding and head, a router and experts per layer."""
    m = preset(CELL).engine.model
    floats = 2 * m.vocab_size * m.d_model + m.num_layers * (
        m.d_model * m.num_experts + m.num_experts * m.d_model * m.d_model
    )
    return 4 * floats


def test_maxtexts_three_programs_compile_and_the_report_names_the_engine(report):
    assert [p.name for p in report.programs] == ["fwd_bwd", "fwd_bwd_accum", "update"]
    assert all(p.compiled and p.temp > 0 for p in report.programs)
    assert report.engine == STAND_IN
    assert f"engine: {STAND_IN}" in aot_report.format_report(report)


def test_optimizer_state_sits_beside_both_forward_backward_programs_and_not_update(report):
    rows = {p.name: p for p in report.programs}
    assert report.state["params"] == _param_bytes()
    # Adam's two moments of every weight, and its step counters.
    assert 2 * _param_bytes() <= report.state["opt_state"] < 2 * _param_bytes() + 64
    assert rows["fwd_bwd"].beside == rows["fwd_bwd_accum"].beside == report.state["opt_state"]
    assert rows["update"].beside == 0  # it takes the whole state; nothing was staged
    # fwd_bwd_accum takes the gradient sum (as big as the weights) that fwd_bwd returns.
    assert rows["fwd_bwd_accum"].argument - rows["fwd_bwd"].argument >= _param_bytes()


def test_a_refused_trainer_key_is_listed_and_the_others_are_compiled(report):
    assert list(report.refused_keys) == ["use_gdn_kernel=true"]
    assert "use_gdn_kernel" in report.refused_keys["use_gdn_kernel=true"]
    text = aot_report.format_report(report)
    assert "NOT TAKEN: 1 of the trainer's keys the engine refuses" in text
    cell = check.resolve_cell(CELL, "local", ARGV, engine=STAND_IN)
    assert cell.config.trainer_maxtext_keys == (("adam_b1", "0.8"),)


def test_the_lowering_takes_the_target_platforms_keys_not_the_hosts(tmp_path):
    """On CPU devices MaxText's expert-parallel MoE needs its ring of experts; a TPU needs
    nothing: the words follow the platform `aot` compiles for."""
    config = check.resolve_cell(CELL, "local", engine=STAND_IN).config
    api = maxtext_stand_in.STAND_IN_API
    cpu = maxtext_aot.maxtext_args(api, config, str(tmp_path), "cpu").words
    tpu = maxtext_aot.maxtext_args(api, config, str(tmp_path), "tpu").words
    assert "use_ring_of_experts=true" in cpu
    assert not any(word.startswith("use_ring_of_experts") for word in tpu)


def test_depths_repeat_the_layer_pattern_and_maxtext_takes_them(tmp_path):
    assert depth.depths_to_compile(60, 4, 4) == [4, 8]
    with pytest.raises(UserError, match=r"blocks of 4 .*multiple of 4"):
        depth.depths_to_compile(60, 6, 4)
    with pytest.raises(UserError, match="multiple of 4"):
        check.run_check(CELL, "local", layers=2, engine=STAND_IN)
    config = depth.with_layers(check.resolve_cell(CELL, "local", engine=STAND_IN).config, 8)
    api = maxtext_stand_in.STAND_IN_API
    words = maxtext_aot.maxtext_args(api, config, str(tmp_path), "cpu").words
    built = api.build_config(words)
    assert (built.base_num_decoder_layers, built.inhomogeneous_layer_cycle_interval) == (8, 4)


def test_aot_leaves_the_working_folder_empty(tmp_path, monkeypatch, capsys):
    """MaxText's engine opens its metrics writer when it is built: into a folder of aot's own."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["aot", "--preset", CELL, "--engine", STAND_IN, "--min-headroom", "0"])
    assert code == 0, capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_hlo_overlap_reads_maxtexts_programs_on_their_own_mesh():
    texts = list(check.compiled_texts(CELL, "local", engine=STAND_IN))
    assert [name for name, *_ in texts] == ["fwd_bwd", "fwd_bwd_accum", "update"]
    for _, text, mesh, error in texts:
        assert mesh == dict(fsdp=2, context=2, expert=2)
        assert "HloModule" in text and error == ""
    assert math.prod(texts[0][2].values()) == 8


@pytest.fixture
def accumulating_program_refused(monkeypatch):
    """XLA refuses to compile `fwd_bwd_accum` (an option it does not know), as libtpu refuses the
    397B cell's when it does not fit; the programs before and after it compile."""
    given = aot_compile.program_options

    def options(config, mesh, engine):
        table = given(config, mesh, engine)
        return {**table, "fwd_bwd_accum": {"xla_no_such_option": True}}

    monkeypatch.setattr(aot_compile, "program_options", options)


@pytest.mark.parametrize("form", [[], ["--json"]])
def test_hlo_overlap_reports_the_programs_that_compile_and_names_the_one_that_did_not(
    accumulating_program_refused, form, capsys, tmp_path
):
    output = tmp_path / "overlap.json"
    command = ["hlo-overlap", "--preset", CELL, "--engine", STAND_IN, "--summary-only", *form]
    assert cli.main([*command, "--output", str(output)]) == 1
    out, err = capsys.readouterr()
    failure = "program fwd_bwd_accum did not compile for local: INVALID_ARGUMENT: No such compile"
    # MaxText's own notices go to stderr while its engine is built, the first time a process
    # builds it (`test_aot_json_on_stdout_is_the_report_alone`); the bench's is one line
    (line,) = [line for line in err.splitlines() if not line.startswith("[NO-OP]")]
    assert line.startswith(f"rl-trainer-bench hlo-overlap: {failure}")
    flags = {"XLA_FLAGS": os.environ["XLA_FLAGS"]}  # what this process's devices were made with
    written = json.loads(output.read_text())
    assert [r["program"] for r in written] == ["fwd_bwd", "update"]
    if form:
        reports = json.loads(out)
        assert [r["program"] for r in reports] == ["fwd_bwd", "update"]
        assert all(r["compiler_flags"] == flags for r in reports)
    else:
        blocks = [block.splitlines() for block in out.strip().split("\n\n")]
        assert [lines[0].split(":")[0] for lines in blocks] == [
            "program fwd_bwd",
            "program fwd_bwd_accum did not compile for local",
            "program update",
        ]
        assert blocks[0][1] == blocks[2][1] == f"  compiler flags: XLA_FLAGS={flags['XLA_FLAGS']}"


def test_a_micro_batch_maxtexts_mesh_cannot_split_is_refused_before_the_compile(monkeypatch):
    """As the recipe's `custom_mesh_and_rule=cp-as-ep` does: rows over every axis, 4 rows on 8."""
    every_axis = (("fsdp", "context", "expert"), None)
    api = dataclasses.replace(maxtext_stand_in.STAND_IN_API, input_spec=lambda *_: every_axis)
    monkeypatch.setattr(maxtext_stand_in, "STAND_IN_API", api)
    monkeypatch.setattr(maxtext_stand_in._AOT, "_last", None)
    with pytest.raises(
        ContractError, match=r"micro_batch_rows=4: .* make micro_batch_rows a multiple of 8"
    ):
        check.run_check(CELL, "local", engine=STAND_IN)


def test_the_text_names_the_largest_unsplit_leaves_and_counts_the_rest(report):
    """The stand-in keeps every leaf whole on every device: the line names the 8 largest (the
    experts' weights, their moments and gradient first) and counts the others."""
    text = aot_report.format_report(report)
    line = next(x for x in text.splitlines() if x.startswith("state not split"))
    assert len(report.unsharded_state) > 8
    assert f", and {len(report.unsharded_state) - 8} more (" in line
    first = line.split(": ", 1)[1].split(", ")[0]
    assert "['experts']" in first


def test_the_predicted_step_of_an_engine_without_a_replay_counts_no_replay(report):
    """MaxText's engine never replays: a micro-batch that would overflow adds nothing."""
    cell = check.resolve_cell(CELL, "local", ARGV, engine=STAND_IN)
    v5e = accelerators.chip_by_name("v5e")
    on_v5e = dataclasses.replace(cell, target=dataclasses.replace(cell.target, chip=v5e))
    module = engine_module.aot_engine_module(STAND_IN)
    # each program's op estimate as written here (this CPU compile has no TPU ops to estimate)
    estimated = {"fwd_bwd": 2.0, "fwd_bwd_accum": 1.0, "update": 0.5}
    rows = [
        dataclasses.replace(p, op_terms={"seconds": estimated[p.name]}) for p in report.programs
    ]
    timed = check.assemble(on_v5e, rows, [4], False, 1.0, module)
    timed.step = check.predict_step(timed, 4, step_estimate.MicroBatchFacts(0.5, 1e9, "test"))
    assert timed.step.step_seconds == pytest.approx(2.0 + 3 * 1.0 + 0.5)  # no replay's share
    assert "no replay: the engine has no dropless replay program" in aot_report.format_report(timed)


def test_aot_json_on_stdout_is_the_report_alone(monkeypatch, capsys):
    """What MaxText prints while aot builds its engine goes to stderr. The engine is built afresh:
    a lowering an earlier test of this process left in the cache would print nothing."""
    monkeypatch.setattr(maxtext_stand_in._AOT, "_last", None)
    code = cli.main(
        ["aot", "--preset", CELL, "--engine", STAND_IN, "--json", "--min-headroom", "0"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["engine"] == STAND_IN
    assert "[NO-OP]" in captured.err


def test_each_programs_bytes_are_in_its_progress_line_as_soon_as_it_compiles():
    """A full-size compile takes many minutes per program: a run stopped early keeps its lines."""
    lines: list[str] = []
    done = check.run_check(CELL, "local", engine=STAND_IN, progress=lines.append)
    for row in done.programs:
        line = next(x for x in lines if x.startswith(f"aot: {row.name} at 4 layers compiled in"))
        assert f"temp {human_bytes(row.temp)}, resident {human_bytes(row.resident)}" in line
        assert f"argument {human_bytes(row.argument)}" in line


def test_a_failure_inside_maxtexts_lowering_is_said_as_maxtexts(monkeypatch, capsys):
    """As maxtext 0.2.5 sized its batch by this host's one device: a ZeroDivisionError in its
    decoder is MaxText's, one line, exit 2, not a bug of the bench (exit 70)."""

    def broken(self, dummy_data):
        raise ZeroDivisionError("integer modulo by zero")

    monkeypatch.setattr(maxtext_stand_in.AbstractMaxTextEngine, "_lower_kernels", broken)
    monkeypatch.setattr(maxtext_stand_in._AOT, "_last", None)
    assert cli.main(["aot", "--preset", CELL, "--engine", STAND_IN]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not lower its programs for this cell (ZeroDivisionError: integer modulo" in err


def test_hlo_overlap_refuses_an_output_it_cannot_write_before_compiling(tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "overlap.json"
    command = ["hlo-overlap", "--preset", CELL, "--engine", STAND_IN, "--output", str(missing)]
    assert cli.main(command) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--output=" in err and "does not exist; create it first" in err
