"""STAGE_BEFORE_UPDATE and the timed loop against stand-ins for the engine and the worker.

The stand-in engine records every call the driver makes, in order, and trains by hashing the
micro-batches it consumed into its "parameters", so the tests see exactly which micro-batches were
trained, in which order, through which kind of input, and when the optimizer ran.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np
import pytest
from stand_in_engine import StandInEngine, stand_in_pool

from rl_trainer_bench.bench import results_file, step_record
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError

OFF = StageConfig()
BEFORE = StageConfig(before_update=True, issue="after_last")
BEFORE_EARLY = StageConfig(before_update=True, issue="before_last")
AFTER = StageConfig(after_update=True)


def bench_config(**changes) -> BenchConfig:
    base = BenchConfig(preset=PRESETS["cpu-tiny"], steps=3, micro_steps=3, distinct_micro_batches=5)
    return dataclasses.replace(base, **changes)


def run_arm(
    stage: StageConfig, engine=None, *, worker="separate", steps=3, micro_steps=3, log=None
):
    engine = engine or StandInEngine()
    lines = [] if log is None else log
    config = bench_config(stage=stage, worker=worker, steps=steps, micro_steps=micro_steps)
    bench = Bench(config, lines.append, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    bench.setup()
    try:
        result = bench.run(steps=steps, stage=stage)
    finally:
        bench.close()
    return engine, result, lines


def loop_calls(engine: StandInEngine) -> list[tuple]:
    """The calls of the timed loop (after the compile)."""
    return engine.calls[engine.calls.index(("compile",)) + 1 :]


def plain_loop_calls(steps: int, micro_steps: int, pool_size: int) -> list[tuple]:
    """What the trainer's plain loop calls: M fwd_bwd on the pool in order, update, metrics."""
    calls = []
    for step in range(steps):
        for i in range(micro_steps):
            calls.append(("fwd_bwd", f"bench_{step}_{i}", "payload"))
        calls += [("update",), ("metrics",)]
    return calls


def test_off_reproduces_the_plain_loop_call_for_call():
    engine, result, _ = run_arm(OFF)
    assert loop_calls(engine) == plain_loop_calls(4, 3, 5)
    assert result.stages == 0 and result.updates == 4


@pytest.mark.parametrize(
    "stage", [BEFORE, BEFORE_EARLY, AFTER], ids=["after_last", "before_last", "after_update"]
)
def test_staging_trains_the_same_micro_batches_in_the_same_order(stage):
    plain, plain_result, _ = run_arm(OFF)
    staged, staged_result, _ = run_arm(stage)
    assert staged.trained == plain.trained
    assert staged_result.param_digest == plain_result.param_digest
    assert [r.loss_denominator for r in staged_result.records] == [
        r.loss_denominator for r in plain_result.records
    ]
    assert [r.digests for r in staged_result.records] == [r.digests for r in plain_result.records]


@pytest.mark.parametrize("stage", [BEFORE, BEFORE_EARLY], ids=["after_last", "before_last"])
def test_stage_before_update_prepares_and_waits_once_per_boundary_before_the_update(stage):
    engine, result, _ = run_arm(stage)
    calls = loop_calls(engine)
    assert result.updates == 4 and result.stages == 4  # 4 steps, each closed by a boundary
    steps = _split_steps(calls)
    for step, step_calls in enumerate(steps):
        kinds = [c[0] for c in step_calls]
        assert kinds.count("update") == 1 and kinds.count("fwd_bwd") == 3
        assert kinds.count("prepare") == 1 and kinds.count("wait") == 1
        assert step_calls[kinds.index("prepare")] == ("prepare", f"bench_{step + 1}_0")
        assert kinds.index("prepare") < kinds.index("wait") < kinds.index("update")
        last_fwd_bwd = len(kinds) - 1 - kinds[::-1].index("fwd_bwd")
        if stage.issue == "after_last":
            assert kinds.index("prepare") > last_fwd_bwd
        else:
            assert kinds.index("prepare") == last_fwd_bwd - 1


def test_stage_after_update_prepares_right_after_the_update():
    engine, _, _ = run_arm(AFTER)
    for step_calls in _split_steps(loop_calls(engine)):
        kinds = [c[0] for c in step_calls]
        assert kinds[kinds.index("update") + 1] == "prepare"


@pytest.mark.parametrize(
    "stage", [BEFORE, BEFORE_EARLY, AFTER], ids=["after_last", "before_last", "after_update"]
)
def test_stage_is_consumed_by_next_first_fwd_bwd(stage):
    engine, _, _ = run_arm(stage)
    fwd_bwds = [c for c in loop_calls(engine) if c[0] == "fwd_bwd"]
    prepared = [c[1] for c in fwd_bwds if c[2] == "prepared"]
    assert prepared == ["bench_1_0", "bench_2_0", "bench_3_0"]
    staged = [c[1] for c in loop_calls(engine) if c[0] == "prepare"]
    assert staged == [*prepared, "bench_4_0"]  # the last step stages the step after the arm


def test_staged_boundary_logs_one_line_after_the_step_line():
    _, result, lines = run_arm(BEFORE)
    step_lines = [
        i for i, line in enumerate(lines) if line.startswith(f"{step_record.LOG_PREFIX} step=")
    ]
    stage_lines = [i for i, line in enumerate(lines) if line.startswith("STAGE_BEFORE_UPDATE ")]
    assert [i + 1 for i in step_lines] == stage_lines
    first = lines[stage_lines[0]]
    assert first.startswith("STAGE_BEFORE_UPDATE step=0 staged=bench_1_0 stage_s=")
    assert "device_wait_s=" in first and "hidden=" in first
    assert [r.staged for r in result.records] == [
        "bench_1_0",
        "bench_2_0",
        "bench_3_0",
        "bench_4_0",
    ]


@pytest.mark.parametrize("staging", ["before", "after"])
def test_engine_without_staging_methods_is_refused_before_compile(staging):
    engine = StandInEngine(staging=False)
    stage = BEFORE if staging == "before" else AFTER
    with pytest.raises(ConfigError, match="prepare_fwd_bwd_input and wait_for_device") as error:
        run_arm(stage, engine)
    assert ("compile",) not in engine.calls
    assert "lacks prepare_fwd_bwd_input and wait_for_device" in str(error.value)


def test_engine_missing_one_staging_method_is_refused_naming_it():
    engine = StandInEngine()
    engine.wait_for_device = None
    with pytest.raises(ConfigError, match="lacks wait_for_device: set STAGE_BEFORE_UPDATE=off"):
        run_arm(BEFORE, engine)
    assert ("compile",) not in engine.calls


FUSED_REFUSAL = r"STAGE_BEFORE_UPDATE=on .*WORKER=fused.*: set WORKER=separate"


def test_fused_worker_with_stage_before_update_is_refused_before_the_pool_and_compile():
    engine = StandInEngine()
    made = []
    config = bench_config(stage=BEFORE, worker="fused")
    bench = Bench(config, lambda _: None, engine_factory=lambda _: made.append(1) or engine)
    with pytest.raises(ConfigError, match=FUSED_REFUSAL):
        bench.setup()
    assert made == [] and engine.calls == []  # no engine built, nothing compiled


def test_fused_bench_refuses_a_stage_before_update_arm_before_its_first_step():
    engine = StandInEngine()
    config = bench_config(worker="fused")
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    with pytest.raises(ConfigError, match=FUSED_REFUSAL):
        bench.setup(stages=[OFF, BEFORE])  # an A/B's arms: refused before the compile
    assert ("compile",) not in engine.calls
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    bench.setup()
    with pytest.raises(ConfigError, match=FUSED_REFUSAL):
        bench.run(steps=2, stage=BEFORE)
    bench.close()
    assert loop_calls(engine) == []


def test_fused_worker_runs_the_plain_loop_with_staging_off():
    engine, result, _ = run_arm(OFF, worker="fused")
    plain, plain_result, _ = run_arm(OFF)
    assert result.updates == 4 and engine.trained == plain.trained
    assert result.param_digest == plain_result.param_digest


def test_each_arm_starts_at_pool_index_zero_and_counts_its_own_updates():
    engine = StandInEngine()
    bench = Bench(
        bench_config(), engine_factory=lambda _: engine, pool=stand_in_pool(5), log=lambda _: None
    )
    bench.setup()
    first = bench.run(steps=2, stage=OFF, arm="a")
    second = bench.run(steps=2, stage=BEFORE, arm="b")
    bench.close()
    assert [r.digests for r in first.records] == [r.digests for r in second.records]
    assert first.updates == second.updates == 3
    assert {r.arm for r in second.records} == {"b"}


def test_warmup_steps_are_flagged_and_step_lines_read_back():
    _, result, lines = run_arm(BEFORE)
    assert [r.warmup for r in result.records] == [True, False, False, False]
    parsed = step_record.parse("\n".join(lines))
    assert parsed.malformed == []
    assert [r.micro_batches for r in parsed.records] == [r.micro_batches for r in result.records]
    assert [r.loss for r in parsed.records] == [r.loss for r in result.records]


def test_results_jsonl_has_one_line_per_step(tmp_path):
    engine = StandInEngine()
    bench = Bench(
        bench_config(), engine_factory=lambda _: engine, pool=stand_in_pool(5), log=lambda _: None
    )
    bench.setup()
    bench.run(steps=3, stage=BEFORE, results_path=tmp_path / "results.jsonl")
    bench.close()
    records = results_file.read_results(tmp_path / "results.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3]
    assert records[1].staged == "bench_2_0"


def _split_steps(calls: list[tuple]) -> list[list[tuple]]:
    steps, current = [], []
    for call in calls:
        current.append(call)
        if call[0] == "metrics":
            steps.append(current)
            current = []
    return steps


class RecompilingEngine(StandInEngine):
    """Dispatches a real jitted program whose input shape changes at step 2: a recompile."""

    def __init__(self):
        super().__init__()
        import jax

        self._program = jax.jit(lambda x: x * 2.0, static_argnums=())
        self._program.__name__ = "stand_in_fwd_bwd"

    def fwd_bwd(self, batch):
        super().fwd_bwd(batch)
        size = 8 if self.train_step < 2 else 16
        self._last = self._program(np.ones(size, np.float32))

    def completion_marker(self):
        return self._last


def test_recompile_in_a_scored_step_is_detected_and_named():
    lines = []
    _, result, _ = run_arm(OFF, RecompilingEngine(), log=lines)
    assert len(result.recompiles) == 1 and "lambda" in result.recompiles[0]
    assert [r.recompiles for r in result.records] == [0, 0, 1, 0]
    assert any(line.startswith("[TrainerBench] RECOMPILE step=2 programs=") for line in lines)


def test_compiles_in_warmup_are_not_scored():
    _, result, _ = run_arm(OFF, RecompilingEngine(), steps=1)  # step 0 compiles, step 1 reuses
    assert result.recompiles == []


def test_profile_window_writes_a_trace(tmp_path):
    engine = StandInEngine()
    config = bench_config(profile_steps=(1, 2), results_dir=tmp_path)
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    bench.setup()
    bench.run(steps=3, stage=BEFORE)
    bench.close()
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1
    trace = traces[0].read_bytes()
    for annotation in (b"fwd_bwd bench_1_0", b"fwd_bwd bench_2_2", b"stage bench_2_0", b"update"):
        assert annotation in trace
    assert b"fwd_bwd bench_0_0" not in trace and b"fwd_bwd bench_3_0" not in trace


def test_results_jsonl_of_an_earlier_run_is_moved_aside_not_replaced_or_appended_to(tmp_path):
    path = tmp_path / "results.jsonl"
    earlier = '{"step": 0, "from": "an earlier run"}\n'
    path.write_text(earlier)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    stamp = datetime.datetime.fromtimestamp(1_700_000_000).strftime("%Y%m%d-%H%M%S")
    lines = []
    bench = Bench(
        bench_config(),
        lines.append,
        engine_factory=lambda _: StandInEngine(),
        pool=stand_in_pool(5),
    )
    bench.setup()
    bench.run(steps=1, stage=OFF, results_path=path)
    bench.close()
    assert [r.step for r in results_file.read_results(path)] == [0, 1]
    assert (tmp_path / f"earlier-{stamp}" / "results.jsonl").read_text() == earlier
    assert (
        f"[TrainerBench] moved the earlier results.jsonl aside to {tmp_path}/earlier-{stamp}"
        in lines
    )


class FailingEngine(StandInEngine):
    def fwd_bwd(self, batch):
        raise RuntimeError("device lost")


def test_a_run_that_fails_before_its_first_step_keeps_earlier_results(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("an earlier run\n")
    bench = Bench(
        bench_config(),
        lambda _: None,
        engine_factory=lambda _: FailingEngine(),
        pool=stand_in_pool(5),
    )
    bench.setup()
    with pytest.raises(RuntimeError, match="device lost"):
        bench.run(steps=1, stage=OFF, results_path=path)
    bench.close()
    assert path.read_text() == "an earlier run\n"


def test_a_line_says_the_compile_has_started_before_it_does():
    """The compile is the run's longest silence: its line comes before the compile's figures."""
    _, _, lines = run_arm(OFF, steps=1)
    started = next(i for i, line in enumerate(lines) if "compiling the engine's programs" in line)
    compiled = next(i for i, line in enumerate(lines) if "compile program=" in line)
    assert started < compiled
    assert lines[started].startswith(
        f"{step_record.LOG_PREFIX} compiling the engine's programs for cpu-tiny"
    )


class PoolCountingEngine(StandInEngine):
    """Records the micro-batches the driver says the run will feed (`will_run`)."""

    def will_run(self, payloads):
        self.calls.append(("will_run", tuple(p.name for p in payloads)))


def test_the_whole_pool_reaches_will_run_before_the_compile():
    engine = PoolCountingEngine()
    pool = stand_in_pool(5)
    bench = Bench(bench_config(), lambda _: None, engine_factory=lambda _: engine, pool=pool)
    bench.setup()
    bench.close()
    assert engine.calls == [("will_run", tuple(p.name for p in pool)), ("compile",)]
