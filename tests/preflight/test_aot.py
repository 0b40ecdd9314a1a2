"""The AOT memory check: cpu-tiny on 8 CPU devices, cross-checked against XLA's memory analysis."""

from __future__ import annotations

import dataclasses
import json
import math
import types

import jax
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.chips import accelerators
from rl_trainer_bench.engine import residency
from rl_trainer_bench.engine.builtin import programs
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight import compiler_flags, op_estimate, step_estimate
from rl_trainer_bench.preflight.aot import check, depth, engine_module, targets
from rl_trainer_bench.preflight.aot import compile as aot_compile
from rl_trainer_bench.preflight.aot import report as aot_report
from rl_trainer_bench.preflight.hlo.parse import parse_hlo
from rl_trainer_bench.units import human_bytes

# Retry off leaves out the dropless replay program: one fewer compile keeps the suite fast; the
# replay's row is the same code path as fwd_bwd's.
FLAGS = "retry_when_tokens_dropped=false"


@pytest.fixture(scope="module")
def compiled_cell():
    """cpu-tiny's programs compiled once for the module: (cell, {name: compiled}, rows)."""
    cell = check.resolve_cell("cpu-tiny", "local", engine_flags=FLAGS)
    compiled, rows = {}, []
    for name, program, row in aot_compile.compile_programs(cell.config, cell.mesh):
        compiled[name] = program
        rows.append(row)
    return cell, compiled, rows


def test_rows_are_xla_memory_analysis(compiled_cell):
    _, compiled, rows = compiled_cell
    assert [row.name for row in rows] == ["fwd_bwd", "update"]
    for row in rows:
        analysis = compiled[row.name].memory_analysis()
        assert row.argument == analysis.argument_size_in_bytes
        assert row.output == analysis.output_size_in_bytes
        assert row.alias == analysis.alias_size_in_bytes
        assert row.temp == analysis.temp_size_in_bytes
        assert row.generated_code == analysis.generated_code_size_in_bytes
        assert row.live_peak == analysis.peak_memory_in_bytes > 0
        assert row.resident == (
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes
        )
        assert row.compiled
    assert rows[0].temp > 0  # fwd_bwd's activations


def test_state_bytes_match_what_the_programs_take(compiled_cell):
    """The state the report adds beside each program is what XLA sees in the arguments."""
    cell, _, rows = compiled_cell
    state = check.state_bytes(cell.config, cell.mesh, stage_before_update=True)
    by_name = {row.name: row for row in rows}
    stats_bytes = 5 * 4  # the step's five scalar statistics
    update_state = state["params"] + state["opt_state"] + state["grad_accum"]
    assert by_name["update"].argument == update_state + stats_bytes
    # fwd_bwd takes the parameters, the step's sums (donated: it adds into them in place) and one
    # micro-batch (the same bytes a staged one holds).
    assert by_name["fwd_bwd"].argument == (
        state["params"] + state["grad_accum"] + stats_bytes + state["staged_micro_batch"]
    )
    assert by_name["fwd_bwd"].alias == state["grad_accum"] + stats_bytes


def test_report_peak_headroom_and_verdict(compiled_cell):
    cell, _, rows = compiled_cell
    report = check.assemble(cell, rows, [2], stage_before_update=True, seconds=1.0)
    state = report.state
    update = next(p for p in report.programs if p.name == "update")
    assert update.beside == state["staged_micro_batch"] > 0
    fwd_bwd = next(p for p in report.programs if p.name == "fwd_bwd")
    assert fwd_bwd.beside == state["opt_state"]
    assert report.peak == max(p.resident + p.beside for p in report.programs)
    assert report.memory_bytes and report.headroom == report.memory_bytes - report.peak
    assert report.fits is True and not report.estimate
    document = json.loads(json.dumps(report.to_json()))
    assert document["peak_bytes"] == report.peak and document["fits"] is True
    text = aot_report.format_report(report)
    assert "FITS" in text and human_bytes(report.peak) in text
    assert f"(peak_memory_in_bytes): fwd_bwd {human_bytes(fwd_bwd.live_peak)}, update" in text
    assert "STAGE_BEFORE_UPDATE=on" in text
    # Adam's step counters are the only state leaves not split over the 8 devices.
    assert [path for path, _ in report.unsharded_state] == [
        "['opt_state'][1][0].count",
        "['opt_state'][1][2].count",
    ]
    assert "state not split over all 8 devices: ['opt_state'][1][0].count 4 B" in text


def test_an_offloaded_optimizer_state_is_reported_in_host_memory_not_beside(compiled_cell):
    _, _, rows = compiled_cell
    cell = check.resolve_cell(
        "cpu-tiny", "local", engine_flags=f"{FLAGS} optimizer_memory_host_offload=true"
    )
    report = check.assemble(cell, rows, [2], stage_before_update=False, seconds=1.0)
    assert report.state["opt_state"] == 0 and report.state["host_memory"] > 0
    assert all(p.beside == 0 for p in report.programs if p.name != "update")
    text = aot_report.format_report(report)
    assert f"in host memory (not on the device) {human_bytes(report.state['host_memory'])}" in text
    assert "host_memory" not in text


def test_a_peak_inside_the_memory_but_within_the_margin_is_below_the_margin(compiled_cell):
    """3% of the device free: it fits, the 5% margin is not met, and the report says by how much
    and what host offload of the optimizer state would leave (labelled an estimate)."""
    cell, _, rows = compiled_cell
    report = check.assemble(cell, rows, [2], stage_before_update=False, seconds=1.0)
    peak = max(r.resident + (report.state["opt_state"] if r.name == "fwd_bwd" else 0) for r in rows)
    memory = peak * 100 // 97
    report.memory_bytes = memory
    assert report.fits is True and report.margin_met is False
    short = math.ceil(0.05 * memory) - (memory - peak)
    fwd_bwd, update = (next(r for r in rows if r.name == n) for n in ("fwd_bwd", "update"))
    offload = max(fwd_bwd.resident, update.resident)  # nothing of the optimizer beside either
    text = aot_report.format_report(report)
    assert f"margin: BELOW the 5% margin ({human_bytes(math.ceil(0.05 * memory))}) by" in text
    assert f"by {human_bytes(short)}: the peak would have to be" in text
    assert (
        f"optimizer_memory_host_offload=true the optimizer state's {human_bytes(report.state['opt_state'])}"
        in text
    )
    assert f"peak {human_bytes(offload)} (" in text and "ESTIMATE" in text
    document = report.to_json()
    assert document["margin_met"] is False and document["offload_peak_bytes_estimate"] == offload
    report.min_headroom = 0.02
    assert report.margin_met is True
    assert "margin: the 2% margin" in aot_report.format_report(report)
    report.memory_bytes = peak - 1
    assert report.fits is False and report.margin_met is False
    assert "margin" not in aot_report.format_report(report)


def test_an_offloaded_optimizer_state_has_no_offload_estimate(compiled_cell):
    _, _, rows = compiled_cell
    cell = check.resolve_cell(
        "cpu-tiny", "local", engine_flags=f"{FLAGS} optimizer_memory_host_offload=true"
    )
    report = check.assemble(cell, rows, [2], stage_before_update=False, seconds=1.0)
    report.memory_bytes = report.peak + 1
    assert report.margin_met is False and report.offload_peak is None
    assert "optimizer_memory_host_offload=true" not in aot_report.format_report(report)


@pytest.mark.parametrize("value", ["-1", "51", "five", "nan", ""])
def test_a_bad_margin_is_refused_before_any_compile(capsys, value):
    assert cli.main(["aot", "--min-headroom", value]) == 2
    assert "--min-headroom" in capsys.readouterr().err


def test_beside_each_program_is_the_state_it_does_not_take():
    state = {"params": 100, "opt_state": 200, "grad_accum": 100, "staged_micro_batch": 7}
    assert residency.beside("fwd_bwd", state) == 200
    assert residency.beside("fwd_bwd_dropless", state) == 200 + 7
    assert residency.beside("update", state) == 7
    with pytest.raises(KeyError, match=r"residency\.BESIDE"):
        residency.beside("new_program", state)


def test_an_engine_with_programs_of_its_own_names_brings_its_state_table(compiled_cell):
    """Refused before any compile (which takes minutes at full size) when the table is missing."""
    cell, _, rows = compiled_cell

    class NeverCompiled:
        def compile(self, **_):
            raise AssertionError("compiled before the table was checked")

    other = types.ModuleType("other_engine")
    other.lower_programs = lambda config, mesh: {"fwd_bwd": NeverCompiled(), "accumulate": None}
    with pytest.raises(
        UserError, match=r"other_engine: no BESIDE entry for program\(s\) accumulate"
    ):
        next(aot_compile.compile_programs(cell.config, cell.mesh, other))
    other.BESIDE = {"fwd_bwd": ("opt_state", "grad_accum"), "update": (), "accumulate": ()}
    other.abstract_state, other.payload_spec = programs.abstract_state, programs.payload_spec
    report = check.assemble(cell, [dataclasses.replace(r) for r in rows], [2], False, 1.0, other)
    fwd_bwd = next(p for p in report.programs if p.name == "fwd_bwd")
    assert fwd_bwd.beside == report.state["opt_state"] + report.state["grad_accum"]
    assert engine_module.beside_table(None) is residency.BESIDE


def test_memory_failures_become_rows_with_amounts():
    tpu = RuntimeError(
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
        "hbm. Used 120.50G of 95.74G hbm. Exceeded hbm capacity by 24.76G.\n\nTotal hbm usage..."
    )
    row = aot_compile.failed("fwd_bwd", tpu, 3.0)
    assert row.out_of_memory and not row.compiled
    assert row.needed == int(120.50 * 1024**3) and row.available == int(95.74 * 1024**3)
    assert row.error.startswith("RESOURCE_EXHAUSTED") or "Used 120.50G" in row.error
    # The form libtpu 0.0.42 printed for the qwen3.5-397b-cell fwd_bwd on tpu7x:4x4x8.
    temporaries = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (111.71G) exceeds available HBM (94.75G)."
    )
    row = aot_compile.failed("fwd_bwd", temporaries, 200.0)
    assert row.out_of_memory
    assert (row.needed, row.available) == (int(111.71 * 1024**3), int(94.75 * 1024**3))
    gpu = RuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes."
    )
    gpu_row = aot_compile.failed("update", gpu, 1.0)
    assert gpu_row.out_of_memory and gpu_row.needed == 2**31 and gpu_row.available is None
    other = aot_compile.failed("update", ValueError("INVALID_ARGUMENT: bad sharding"), 1.0)
    assert not other.out_of_memory and other.error == "INVALID_ARGUMENT: bad sharding"
    # What libtpu 0.0.42.1 printed for MaxText's fwd_bwd at the tpu7x recipe's splash block
    # sizes: a kernel's tiles over the core's on-chip memory, not the program over the device's.
    vmem = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for"
        " %splash_mha_dkv_segmented_no_residuals.1 = (bf16[3,32,16384,256]) custom-call(%c)"
    )
    kernel = aot_compile.failed("fwd_bwd", vmem, 2621.4)
    assert not kernel.out_of_memory and not kernel.compiled and "vmem" in kernel.error
    assert "--engine-flags" not in kernel.error  # no engine key sizes MaxText's splash kernels
    # The Gated DeltaNet's kernels at linear_chunk_kernel_heads=16 on a v5e: the key is the fix
    heads = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for"
        " %gated_delta_rule_backward.10 = (f32[5,4096,2048]) custom-call(%g)"
    )
    sized = aot_compile.failed("fwd_bwd", heads, 56.9)
    assert not sized.out_of_memory and sized.error.startswith(
        "the Pallas kernel gated_delta_rule_backward needs more of a TPU core's VMEM a program"
        " than the core has at this linear_chunk_kernel_heads: set fewer value heads a program"
        " (linear_chunk_kernel_heads in --engine-flags); RESOURCE_EXHAUSTED: Ran out of memory"
    )


def test_out_of_memory_program_makes_the_verdict_no(compiled_cell):
    cell, _, rows = compiled_cell
    oom = aot_compile.failed(
        "update", RuntimeError("RESOURCE_EXHAUSTED: Used 20.00G of 16.00G hbm."), 2.0
    )
    report = check.assemble(cell, [rows[0], oom], [2], stage_before_update=False, seconds=1.0)
    assert report.fits is False
    text = aot_report.format_report(report)
    assert "update             OUT OF MEMORY: needs 20.00 GiB of 16.00 GiB" in text
    assert "DOES NOT FIT" in text
    failed_row = report.to_json()["programs"][1]
    assert failed_row["peak"] is None and failed_row["needed"] == 20 * 1024**3


def test_extrapolation_is_linear_in_layers():
    shallow = aot_compile.ProgramMemory(
        "fwd_bwd", argument=100, output=10, temp=1000, flops=5.0, bytes_accessed=7.0
    )
    deep = aot_compile.ProgramMemory(
        "fwd_bwd", argument=180, output=10, temp=1500, flops=9.0, bytes_accessed=8.0
    )
    deep.unstated_kernels = ("splash_mqa_fwd",)
    (row,) = depth.extrapolate([[shallow], [deep]], [2, 4], 60)
    assert (row.argument, row.output, row.temp) == (100 + 40 * 58, 10, 1000 + 250 * 58)
    assert row.unstated_kernels == ("splash_mqa_fwd",)
    assert row.flops == pytest.approx(5.0 + 2.0 * 58)
    assert row.bytes_accessed == pytest.approx(7.0 + 0.5 * 58)
    assert row.xla_optimal_seconds is None  # XLA gave no time at either depth
    assert row.live_peak is None  # nor a live peak
    timed = [dataclasses.replace(r, xla_optimal_seconds=t) for r, t in ((shallow, 1), (deep, 2))]
    (row,) = depth.extrapolate([[timed[0]], [timed[1]]], [2, 4], 60)
    assert row.xla_optimal_seconds == pytest.approx(1 + 0.5 * 58)
    peaks = [dataclasses.replace(r, live_peak=p) for r, p in ((shallow, 100), (deep, 150))]
    (row,) = depth.extrapolate([[peaks[0]], [peaks[1]]], [2, 4], 60)
    assert row.live_peak == 100 + 25 * 58


def test_the_estimate_names_the_kernels_whose_work_it_does_not_count(compiled_cell):
    """A TPU kernel that states no FLOPs (splash attention) is named under the bound; a program
    without one adds no line."""
    cell, _, rows = compiled_cell
    on_v5e = dataclasses.replace(
        cell, target=dataclasses.replace(cell.target, chip=accelerators.chip_by_name("v5e"))
    )
    facts = step_estimate.MicroBatchFacts(0.0, 3e8, "none: test")
    line = "TPU kernels that state no FLOPs (splash_mqa_fwd, splash_mqa_dq): their work is in"
    for kernels in ((), ("splash_mqa_fwd", "splash_mqa_dq")):
        named = [
            dataclasses.replace(r, unstated_kernels=kernels if r.name == "fwd_bwd" else ())
            for r in rows
        ]
        report = check.assemble(on_v5e, named, [2], False, 1.0)
        report.step = check.predict_step(report, 2, facts)
        assert (line in aot_report.format_report(report)) == bool(kernels)
        programs = json.loads(json.dumps(report.to_json()))["programs"]
        assert programs[0]["unstated_kernels"] == list(kernels)


def test_time_estimate_in_text_and_json_is_labelled_an_estimate(compiled_cell):
    """cpu-tiny's programs (compiled for CPU) timed against a v5e's rates."""
    cell, compiled, rows = compiled_cell
    v5e = accelerators.chip_by_name("v5e")
    on_v5e = dataclasses.replace(cell, target=dataclasses.replace(cell.target, chip=v5e))
    rates = op_estimate.Rates.of_chip(v5e)
    timed = [
        dataclasses.replace(
            r, op_terms=op_estimate.estimate(parse_hlo(compiled[r.name].as_text()), rates).terms()
        )
        for r in rows
    ]
    report = check.assemble(on_v5e, timed, [2], False, 1.0)
    assert report.roofline == (v5e.peak_bf16_flops, v5e.hbm_bytes_per_second)
    for program in report.programs:
        assert program.roofline_seconds == max(
            program.flops / v5e.peak_bf16_flops,
            program.bytes_accessed / v5e.hbm_bytes_per_second,
        )
    facts = step_estimate.MicroBatchFacts(0.0, 3e8, "none: test")
    report.step = check.predict_step(report, 2, facts)
    seconds = {p.name: p.op_terms["seconds"] for p in report.programs}
    assert report.step.step_seconds == pytest.approx(2 * seconds["fwd_bwd"] + seconds["update"])
    text = aot_report.format_report(report)
    assert "op est.: ESTIMATE (not a measurement, not a bound) by this tool" in text
    assert "on the chip's own cells" in text
    assert "predicted step, ESTIMATE (not a measurement, not a bound)" in text
    assert "predicted MFU, ESTIMATE (not a measurement, not a bound)" in text
    assert "roofline: ESTIMATE (not a measurement, not a bound) by this tool" in text
    assert "lower bound (no exposed collectives)" not in text
    # the only bound: every program at peak FLOP/s, no replay
    floor = 2 * rows_named(report, "fwd_bwd").flops + rows_named(report, "update").flops
    assert report.step.step_floor_seconds == pytest.approx(floor / v5e.peak_bf16_flops)
    assert "step, LOWER BOUND (compute at the chip's peak, no replay" in text
    assert f"so MFU at most {100 * report.step.mfu_ceiling:.1f}%\n" in text
    # model FLOPs past what the floor counts: the ceiling passes 100% and says it rules nothing out
    report.step = dataclasses.replace(
        report.step, model_flops_per_micro_batch=2 * floor * report.step.devices
    )
    assert report.step.mfu_ceiling > 1
    assert "% (over 100%: it rules nothing out, the floor leaving out work)" in (
        aot_report.format_report(report)
    )
    document = json.loads(json.dumps(report.to_json()))
    bounds = document["time_estimate"]["bounds"]
    assert bounds["step_floor_seconds"] == pytest.approx(report.step.step_floor_seconds)
    assert document["time_estimate"]["kind"] == "estimate"
    assert document["time_estimate"]["measured"] is False
    assert document["time_estimate"]["step_seconds"] == pytest.approx(report.step.step_seconds)
    assert all(p["roofline_seconds_kind"] == "estimate" for p in document["programs"])


def rows_named(report, name):
    return next(p for p in report.programs if p.name == name)


def test_no_chip_in_the_table_means_no_time_estimate(compiled_cell):
    cell, _, rows = compiled_cell
    report = check.assemble(cell, [dataclasses.replace(r) for r in rows], [2], False, 1.0)
    assert report.roofline is None and report.step is None
    assert all(p.roofline_seconds is None for p in report.programs)
    assert report.to_json()["time_estimate"] is None


def test_bad_estimate_inputs_are_refused_before_any_compile(capsys, tmp_path):
    assert cli.main(["aot", "--micro-steps", "-1"]) == 2
    assert "--micro-steps=-1 is too small: use an integer >= 1" in capsys.readouterr().err
    assert cli.main(["aot", "--seed", "-3"]) == 2
    assert "--seed=-3 is too small: use an integer >= 0" in capsys.readouterr().err
    missing = tmp_path / "none.json"
    output = tmp_path / "report.json"
    assert cli.main(["aot", "--routing-profile", str(missing), "--output", str(output)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and str(missing) in error
    assert not output.exists()


def test_unknown_slice_is_refused_with_the_known_forms(capsys):
    assert cli.main(["aot", "--target", "v9z:2x2"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error
    assert "unknown TPU slice 'v9z:2x2'" in error and "tpu7x:4x4x8" in error


def test_bad_stage_knob_is_refused_before_any_compile(capsys):
    assert cli.main(["aot", "--stage-before-update", "yes"]) == 2
    assert "--stage-before-update='yes' is not allowed: use on or off" in capsys.readouterr().err


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_cpu_tiny_compiles_for_a_tpu_topology_from_this_host():
    """Needs the [tpu] extra: libtpu compiles for a v6e:2x4 slice (8 chips, like cpu-tiny).

    The same compiled programs feed the overlap summary: it must read TPU HLO text too.
    """
    pytest.importorskip("libtpu")
    from rl_trainer_bench.preflight.hlo.overlap import analyze_text

    cell = check.resolve_cell("cpu-tiny", "v6e:2x4", engine_flags=FLAGS)
    compiled = list(aot_compile.compile_programs(cell.config, cell.mesh))
    report = check.assemble(cell, [row for *_, row in compiled], [2], False, 1.0)
    assert report.device_kind.startswith("TPU v6")
    assert report.devices == 8 and report.memory_bytes == 32 * 1024**3
    assert [p.name for p in report.programs] == ["fwd_bwd", "update"]
    assert all(p.compiled and p.generated_code > 0 for p in report.programs)
    assert report.fits is True
    assert math.isclose(report.headroom, report.memory_bytes - report.peak)
    assert jax.devices()[0].platform == "cpu"  # nothing ran on (or needed) a TPU
    name, program, _ = compiled[0]
    overlap = analyze_text(program.as_text(), name, cell.mesh_sizes)
    assert overlap.total.bytes > 0
    assert all(c.group_size > 0 for c in overlap.collectives)


@pytest.mark.parametrize(
    ("name", "bounds"),
    [
        ("v5e:1x1", {"chips_per_host_bounds": (1, 1, 1)}),
        ("v6e:2x1", {"chips_per_host_bounds": (2, 1, 1)}),
        ("v5e:2x2", {}),
        ("v6e:2x4", {}),
        ("v5p:2x2x1", {}),
        ("tpu7x:4x4x8", {}),
    ],
)
def test_a_slice_smaller_than_a_host_is_its_own_host(name, bounds):
    """libtpu refused v5e:1x1 at its default 2x2x1 host; a one-chip slice is its one host."""
    assert targets.host_bounds(accelerators.parse_slice(name)) == bounds


@pytest.mark.tpu_aot
def test_a_one_chip_slice_builds_its_topology_from_this_host():
    pytest.importorskip("libtpu")
    for name, kind in (("v5e:1x1", "TPU v5 lite"), ("v6e:1x1", "TPU v6 lite")):
        target = targets.resolve_target(name)
        assert (len(target.devices), target.device_kind) == (1, kind)


def test_tpu_target_without_libtpu_says_how_to_install(capsys):
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("libtpu is installed here")
    assert cli.main(["aot", "--target", "v6e:2x4"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "pip install 'rl-trainer-bench[tpu]'" in error


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_loop_counted_cost_is_linear_in_depth_where_xla_counts_the_loop_once():
    """cpu-tiny's fwd_bwd for v5e:2x2 at 1, 2 and 3 layers of Gated DeltaNet: XLA counts the
    layer loop (and the chunk loops inside a layer) once, so its FLOPs barely move with depth,
    while the loop-counted FLOPs grow by one layer's worth per layer. The smallest program with a
    loop in a loop: one mixer (a block of one layer), fwd_bwd alone (`update` has no loop), as
    each TPU compile costs seconds."""
    pytest.importorskip("libtpu")
    cell = check.resolve_cell("cpu-tiny", "v5e:2x2", engine_flags=FLAGS)
    model = dataclasses.replace(cell.config.model, layer_types=("linear_attention",))
    rows = []
    for layers in (1, 2, 3):
        config = depth.with_layers(dataclasses.replace(cell.config, model=model), layers)
        lowered, options = aot_compile.planned_program(config, cell.mesh, "fwd_bwd")
        rows.append(aot_compile.compile_one("fwd_bwd", lowered, options, "tpu")[1])
    one, two, three = rows
    assert three.xla_flops == pytest.approx(one.xla_flops, rel=0.01)  # the loop counted once
    assert one.flops > one.xla_flops  # a layer's own chunk loops, counted per trip
    per_layer = two.flops - one.flops
    assert per_layer > 0.3 * one.flops
    assert three.flops - two.flops == pytest.approx(per_layer, rel=0.02)


def test_the_report_carries_the_flags_its_compiler_read(monkeypatch, compiled_cell):
    """libtpu's LIBTPU_INIT_ARGS for a slice (its on-chip memory limit decides whether splash
    attention's blocks fit), XLA_FLAGS for the local devices: said in the text and the JSON. The
    check runs whole on the module's compiled programs, which stand in for its compile."""
    _, compiled, rows = compiled_cell
    monkeypatch.setattr(
        check,
        "compile_programs",
        lambda config, mesh, module: ((row.name, compiled[row.name], row) for row in rows),
    )
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=65536")
    flags = compiler_flags.compiler_flags(tpu_slice=True)
    assert flags == {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=65536"}
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    assert compiler_flags.compiler_flags(tpu_slice=True) == {"LIBTPU_INIT_ARGS": None}

    report = check.run_check("cpu-tiny", "local", engine_flags=FLAGS, min_headroom=0)
    assert "--xla_force_host_platform_device_count=8" in report.compiler_flags["XLA_FLAGS"]
    heading = aot_report.format_report(report).splitlines()[2]
    assert heading == f"compiler flags: XLA_FLAGS={report.compiler_flags['XLA_FLAGS']}"
    assert json.loads(json.dumps(report.to_json()))["compiler_flags"] == report.compiler_flags
    report.compiler_flags = {"LIBTPU_INIT_ARGS": None}
    assert "compiler flags: LIBTPU_INIT_ARGS unset (the compiler's defaults)" in (
        aot_report.format_report(report)
    )
