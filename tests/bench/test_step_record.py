"""The step record: device-timeline arithmetic, the log line's round trip, results.jsonl, summary."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_trainer_bench.bench import results_file, step_record
from rl_trainer_bench.bench.clock import StepClock
from rl_trainer_bench.bench.step_record import StepRecord


def record(**changes) -> StepRecord:
    base = dict(
        step=3,
        warmup=False,
        step_s=1.25,
        fwd_bwd_dispatch_s=[0.01, 0.002],
        first_call_extra_s=0.3,
        update_s=0.004,
        drain_s=0.5,
        stage_s=0.001,
        device_wait_s=0.2,
        tokens=4096,
        tokens_per_s_per_device=409.6,
        tflops_per_device=12.5,
        mfu=None,
        loss=0.1234567891234,
        grad_norm=2.0,
        loss_denominator=3000.0,
        overflow_count=1,
        replay_count=1,
        micro_batches=["bench_3_0", "bench_3_1"],
        digests=["ab12", "cd34"],
        device_ready_s=[0.6, 1.1],
        update_ready_s=1.2,
        boundary_idle_s=0.05,
        staged="bench_4_0",
        stage_hidden=0.75,
        fwd_bwd_device_s=[0.8, 0.5],
    )
    base.update(changes)
    return StepRecord(**base)


def test_device_seconds_start_at_dispatch_or_previous_ready_whichever_is_later():
    # second program dispatched while the first still ran: it starts when the first is ready
    assert step_record.device_seconds([0.0, 0.1], [1.0, 1.5], None) == [1.0, 0.5]
    # dispatched after the previous step's update was ready: the gap is idle, not device time
    assert step_record.device_seconds([2.0], [2.5], 1.0) == [0.5]
    assert step_record.device_seconds([0.0], [2.5], 1.0) == [1.5]


def test_first_call_extra_is_over_the_median_regular_call():
    assert step_record.first_call_extra([1.5, 0.5, 0.4, 0.6]) == pytest.approx(1.0)
    assert step_record.first_call_extra([1.5]) is None


def test_first_call_extra_uses_the_median_not_the_mean_of_skewed_regular_calls():
    # One slow regular call (a host hiccup) pulls the mean to 0.7 s; the median stays at 0.4 s.
    assert step_record.first_call_extra([1.5, 0.4, 0.4, 1.3]) == pytest.approx(1.1)


def test_boundary_idle_is_from_previous_ready_to_first_dispatch():
    assert step_record.boundary_idle(None, 5.0) is None
    assert step_record.boundary_idle(4.0, 5.5) == 1.5
    assert (
        step_record.boundary_idle(6.0, 5.5) == 0.0
    )  # dispatched before the device drained: no gap


def test_overlap_fraction_counts_only_busy_time():
    busy = [(0.0, 1.0), (1.5, 2.0)]
    assert step_record.overlap_fraction((0.5, 1.5), busy) == pytest.approx(0.5)
    assert step_record.overlap_fraction((1.0, 1.5), busy) == 0.0
    assert step_record.overlap_fraction((0.2, 0.4), busy) == pytest.approx(1.0)
    assert step_record.overlap_fraction((1.0, 1.0), busy) is None


def test_line_round_trips_through_parse():
    original = record()
    line = step_record.format_line(original)
    assert line.startswith("[TrainerBench] step=3 warmup=0 step_s=1.250000")
    parsed = step_record.parse(f"noise\n{line}\nmore noise\n")
    assert parsed.malformed == []
    (back,) = parsed.records
    assert back.loss == original.loss  # exact: two pods' losses compare bit for bit
    assert back.micro_batches == original.micro_batches and back.digests == original.digests
    assert back.staged == "bench_4_0" and back.first_call_extra_s == pytest.approx(0.3)
    assert back.fwd_bwd_device_s == pytest.approx([0.8, 0.5])
    assert back.mfu is None


def test_line_round_trips_an_arm_and_missing_figures():
    original = record(arm="on", staged=None, stage_hidden=None, first_call_extra_s=None)
    (back,) = step_record.parse(step_record.format_line(original)).records
    assert back.arm == "on" and back.staged is None and back.first_call_extra_s is None


@given(
    loss=st.floats(allow_nan=False, allow_infinity=False, width=64),
    step=st.integers(0, 10**6),
    names=st.lists(
        st.from_regex(r"bench_[0-9]{1,3}_[0-9]", fullmatch=True), min_size=1, max_size=4
    ),
)
def test_exact_figures_survive_any_value(loss, step, names):
    original = record(loss=loss, step=step, micro_batches=names, digests=["d"] * len(names))
    (back,) = step_record.parse(step_record.format_line(original)).records
    assert back.loss == loss and back.step == step and back.micro_batches == names


def test_malformed_lines_are_reported_not_fatal():
    good = step_record.format_line(record())
    truncated = good.split(" mb=")[0]  # a pod log cut mid-line
    garbled = good.replace("step=3", "step=three")
    parsed = step_record.parse(
        "\n".join([good, truncated, "[TrainerBench] config PRESET=x", garbled])
    )
    assert len(parsed.records) == 1
    assert [number for number, _ in parsed.malformed] == [2, 4]
    assert "missing" in parsed.malformed[0][1]


def test_without_times_keeps_everything_but_the_clock():
    a = step_record.format_line(record())
    b = step_record.format_line(record(step_s=9.0, drain_s=3.0, device_ready_s=[7.0, 8.0], mfu=0.5))
    assert a != b and step_record.without_times(a) == step_record.without_times(b)
    c = step_record.format_line(record(loss=0.5))
    assert step_record.without_times(a) != step_record.without_times(c)


# One record's log line and results.jsonl line, byte for byte: pods' logs and files already written
# are read back by `ab --from-logs` and by people's own scripts, so neither form changes by accident.
PUBLISHED_LINE = (
    "[TrainerBench] step=3 arm=on warmup=0 step_s=1.250000 fwd_bwd_s=0.010000,0.002000"
    " device_s=0.800000,0.500000 first_extra_s=0.300000 update_s=0.004000 drain_s=0.500000"
    " stage_s=0.001000 device_wait_s=0.200000 idle_s=0.050000 tokens=4096 tok_s_dev=409.6"
    " tflops_dev=12.5 mfu=0.31 loss=0.1234567891234 grad_norm=inf loss_den=3000.0 overflow=1"
    " replays=1 recompiles=0 staged=bench_4_0 hidden=0.75 stage_exposed_s=- mb=bench_3_0,bench_3_1"
    " digests=ab12,cd34 ready_s=0.600000,1.100000 update_ready_s=1.200000"
)
# The same line as pods wrote it before `stage_exposed_s`: it reads back, the figure unknown.
OLDER_LINE = PUBLISHED_LINE.replace(" stage_exposed_s=-", "")
PUBLISHED_JSON = (
    '{"step": 3, "warmup": false, "step_s": 1.25, "fwd_bwd_dispatch_s": [0.01, 0.002],'
    ' "first_call_extra_s": 0.3, "update_s": 0.004, "drain_s": 0.5, "stage_s": 0.001,'
    ' "device_wait_s": 0.2, "tokens": 4096, "tokens_per_s_per_device": 409.6,'
    ' "tflops_per_device": 12.5, "mfu": 0.31, "loss": 0.1234567891234, "grad_norm": null,'
    ' "loss_denominator": 3000.0, "overflow_count": 1, "replay_count": 1, "micro_batches":'
    ' ["bench_3_0", "bench_3_1"], "digests": ["ab12", "cd34"], "device_ready_s": [0.6, 1.1],'
    ' "update_ready_s": 1.2, "boundary_idle_s": 0.05, "staged": "bench_4_0", "stage_hidden": 0.75,'
    ' "stage_exposed_s": null, "recompiles": 0, "arm": "on", "fwd_bwd_device_s": [0.8, 0.5],'
    ' "non_finite": ["grad_norm"]}\n'
)


def test_a_records_log_line_and_results_line_are_the_published_text(tmp_path):
    published = record(arm="on", grad_norm=math.inf, mfu=0.31)
    assert step_record.format_line(published) == PUBLISHED_LINE
    assert step_record.stage_line("STAGE_BEFORE_UPDATE", published) == (
        "STAGE_BEFORE_UPDATE step=3 staged=bench_4_0 stage_s=0.001000 device_wait_s=0.200000"
        " hidden=0.750 exposed_s=-"
    )
    older = step_record.parse_line(OLDER_LINE)
    assert older.stage_exposed_s is None and older.stage_hidden == 0.75
    assert step_record.format_line(older) == PUBLISHED_LINE
    path = tmp_path / "results.jsonl"
    with results_file.ResultsWriter(path) as writer:
        writer.write(published)
    assert path.read_bytes() == PUBLISHED_JSON.encode()


def test_results_writer_flushes_each_step(tmp_path):
    path = tmp_path / "out" / "results.jsonl"
    with results_file.ResultsWriter(path) as writer:
        writer.write(record(step=0))
        # readable before the writer is closed: a crash here keeps step 0
        assert json.loads(path.read_text().splitlines()[0])["step"] == 0
        writer.write(record(step=1))
    path.write_text(path.read_text() + '{"step": 2, "warm')  # a torn last line from a crash
    assert [r.step for r in results_file.read_results(path)] == [0, 1]


def test_the_plan_goes_beside_the_results_with_the_first_step_and_moves_aside_with_them(tmp_path):
    """The plan a pod executed is written with its first step; an earlier run's plan moves aside
    with that run's results, never left beside the new ones nor replaced before a step is written."""
    path = tmp_path / "results.jsonl"
    path.write_text('{"step": 0}\n')
    (tmp_path / "plan.json").write_text("the earlier run's plan")
    writer = results_file.ResultsWriter(path, lambda line: None, {"plan.json": "this run's plan"})
    assert (tmp_path / "plan.json").read_text() == "the earlier run's plan"  # nothing written yet
    with writer:
        writer.write(record(step=0))
    assert (tmp_path / "plan.json").read_text() == "this run's plan"
    (aside,) = tmp_path.glob("earlier-*")
    assert (aside / "plan.json").read_text() == "the earlier run's plan"
    assert (aside / "results.jsonl").read_text() == '{"step": 0}\n'


def test_summary_covers_scored_steps_only():
    records = [record(step=0, warmup=True, step_s=100.0)] + [
        record(step=i, step_s=s) for i, s in enumerate([1.0, 2.0, 3.0], start=1)
    ]
    text = step_record.summary(records)
    assert "over 3 scored steps" in text
    step_row = next(line for line in text.splitlines() if line.startswith("step_s"))
    assert step_row.split()[1:] == ["2", "1", "3", "100.0%"]
    assert not any(line.startswith("MFU") for line in text.splitlines())


def test_summary_gives_the_scored_steps_rates_over_their_summed_time():
    """A 1 s step at MFU 0.30 and a 3 s step at 0.40 (their tokens differ) achieved 0.375 together:
    what the run did as a whole, where the median step says 0.35."""
    records = [
        record(step=1, step_s=1.0, tokens_per_s_per_device=100.0, tflops_per_device=60.0, mfu=0.3),
        record(step=2, step_s=3.0, tokens_per_s_per_device=300.0, tflops_per_device=80.0, mfu=0.4),
    ]
    text = step_record.summary(records)
    assert next(line for line in text.splitlines() if line.startswith("MFU")).split()[1] == "0.35"
    together = text.splitlines()[-1]
    assert together.startswith("all scored steps together")
    assert "tokens/s/device 250, TFLOP/s/device 75, MFU 0.375 " in together


def test_summary_leaves_out_a_rate_some_scored_step_lacks():
    records = [record(step=1, mfu=0.3), record(step=2, mfu=None)]
    together = step_record.summary(records).splitlines()[-1]
    assert together.startswith("all scored steps together") and "MFU" not in together


def clocked_step() -> StepClock:
    """A step whose spans are known: two fwd_bwd, a stage and a device wait, the update, a drain."""
    clock = StepClock()
    clock.start, clock.end = 10.0, 10.6
    clock.spans = {
        "fwd_bwd": [(10.0, 10.1), (10.1, 10.2)],
        "stage": [(10.2, 10.25)],
        "device_wait": [(10.25, 10.5)],
        "update": [(10.5, 10.51)],
    }
    return clock


STEP_INPUTS = step_record.StepInputs(
    step=4,
    warmup=False,
    arm="on",
    micro_batches=["bench_4_0", "bench_4_1"],
    digests=["ab", "cd"],
    tokens=120,
    model_flops=1.2e12,
    staged="bench_5_0",
    devices=2,
    peak_flops=2e12,
)
METRICS = {"loss": 0.5, "grad_norm": 1.5, "loss_denominator": 90.0}


def test_step_record_reads_host_figures_from_the_clock_spans():
    built = step_record.from_measurements(STEP_INPUTS, clocked_step(), None, METRICS, recompiles=0)
    assert built.step_s == pytest.approx(0.6)
    assert built.fwd_bwd_dispatch_s == pytest.approx([0.1, 0.1])
    assert built.update_s == pytest.approx(0.01)
    assert built.drain_s == pytest.approx(0.09)  # from the update's return to the metrics read
    assert built.stage_s == pytest.approx(0.05) and built.device_wait_s == pytest.approx(0.25)
    assert built.tokens_per_s_per_device == pytest.approx(120 / 0.6 / 2)
    assert built.tflops_per_device == pytest.approx(1.0) and built.mfu == pytest.approx(0.5)
    assert built.fwd_bwd_device_s == [] and built.first_call_extra_s is None
    assert built.stage_hidden is None and built.update_ready_s is None


def test_step_record_reads_device_figures_from_the_stamps():
    stamps = step_record.DeviceStamps(
        fwd_bwd_ready=[10.3, 10.45], update_ready=10.55, previous_ready=9.9, copy_ready=10.5
    )
    built = step_record.from_measurements(
        STEP_INPUTS, clocked_step(), stamps, METRICS, recompiles=1
    )
    # call 1 runs 10.0-10.3; call 2 waits for it, 10.3-10.45
    assert built.fwd_bwd_device_s == pytest.approx([0.3, 0.15])
    assert built.first_call_extra_s == pytest.approx(0.15)
    assert built.boundary_idle_s == pytest.approx(0.1)
    assert built.device_ready_s == pytest.approx([0.3, 0.45])
    assert built.update_ready_s == pytest.approx(0.55)
    # the copy (10.2-10.5) overlaps 10.2-10.3 and 10.3-10.45 of device work: 0.25 of 0.3
    assert built.stage_hidden == pytest.approx(0.25 / 0.3)
    assert (built.recompiles, built.staged, built.arm) == (1, "bench_5_0", "on")
    replayed = step_record.from_measurements(
        STEP_INPUTS, clocked_step(), stamps, {**METRICS, "replay_count": 1}, recompiles=0
    )
    assert replayed.first_call_extra_s is None  # a replay rides on the next call: not comparable
