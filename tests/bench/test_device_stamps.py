"""The ruler's device figures through the real step loop, on an engine whose programs finish at
known times.

`EmulatedDeviceEngine` runs each dispatched program on a pretend device that does one program at a
time: a program starts when it is dispatched or when the one before it is done, whichever is later,
and takes a set number of seconds. Its completion markers block until then, and reading the metrics
waits for the device to drain, as a real engine's do. The loop stamps those markers as it stamps a
real device's, so the record's device seconds, first-call extra and boundary idle must come out as
the set durations.
"""

from __future__ import annotations

import time

import pytest
from stand_in_engine import StandInEngine, StandInPrepared, stand_in_pool

from rl_trainer_bench.ab import boundary
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS

FIRST_CALL_S = 0.25  # the first fwd_bwd after a boundary
REGULAR_CALL_S = 0.10  # every other fwd_bwd
UPDATE_S = 0.35
STAGE_S = 0.25  # host seconds preparing the next step's input, before this step's first dispatch
# The watcher thread stamps a marker within its wake-up latency of the program's end: a few
# milliseconds on an idle machine, but one stamp 25 ms late was seen with the suite on two xdist
# workers of a 2-core machine (a call 65 ms for 40, the next 16). So the figures are checked to
# 50 ms, and the durations are long enough that a wrong rule still misses by more (a call timed
# from its dispatch, not its predecessor's end, is off by a whole first call).
SLACK_S = 0.05
# Two scored steps after the warm-up: a step after the warm-up and one after a scored step, every
# call and update of each checked on its own; each further step would repeat the same durations.
STEPS = 2


class _Done:
    """A completion marker that is ready at a set perf_counter time."""

    def __init__(self, at: float):
        self.at = at

    def block_until_ready(self):
        time.sleep(max(0.0, self.at - time.perf_counter()))
        return self


class EmulatedDeviceEngine(StandInEngine):
    def __init__(self, stage_s: float = 0.0):
        super().__init__()
        self.stage_s = stage_s
        self._free_at = 0.0  # when the pretend device finishes the last program queued on it
        self._after_update = True

    def _run(self, seconds: float) -> None:
        self._free_at = max(time.perf_counter(), self._free_at) + seconds

    def fwd_bwd(self, batch):
        self._run(FIRST_CALL_S if self._after_update else REGULAR_CALL_S)
        self._after_update = False
        super().fwd_bwd(batch)

    def update(self):
        self._run(UPDATE_S)
        self._after_update = True
        return super().update()

    def completion_marker(self):
        return _Done(self._free_at)

    def get_metrics(self, clear_cache=True):
        _Done(self._free_at).block_until_ready()  # reading results drains the device
        return super().get_metrics(clear_cache)

    def prepare_fwd_bwd_input(self, payload):
        time.sleep(self.stage_s)
        return super().prepare_fwd_bwd_input(payload)


def _records(micro_steps: int, stage_s: float = 0.0):
    engine = EmulatedDeviceEngine(stage_s)
    stage = StageConfig(before_update=True, issue="before_last") if stage_s else StageConfig()
    config = BenchConfig(
        preset=PRESETS["cpu-tiny"], steps=STEPS, micro_steps=micro_steps, stage=stage
    )
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    bench.setup()
    try:
        return bench.run(steps=STEPS, stage=stage).records
    finally:
        bench.close()


def test_each_calls_device_seconds_and_the_first_calls_extra_are_the_programs_own():
    records = _records(micro_steps=3)
    assert [r.warmup for r in records] == [True, False, False]
    for record in records:
        # calls 2 and 3 were dispatched while call 1 ran: their device time starts at its end
        assert record.fwd_bwd_device_s == pytest.approx(
            [FIRST_CALL_S, REGULAR_CALL_S, REGULAR_CALL_S], abs=SLACK_S
        )
        assert record.first_call_extra_s == pytest.approx(
            FIRST_CALL_S - REGULAR_CALL_S, abs=SLACK_S
        )
        assert record.update_ready_s - record.device_ready_s[-1] == pytest.approx(
            UPDATE_S, abs=SLACK_S
        )


def test_boundary_idle_runs_from_the_previous_update_to_the_first_dispatch():
    """With one micro-batch and the stage issued before the last `fwd_bwd`, the host stages the
    next input between the step's start and its first dispatch: the device idles for that long
    after the previous step's update, and the first call's device time does not include it. The
    arm's last step stages too (for a step the arm does not train), so it idles as the others."""
    records = _records(micro_steps=1, stage_s=STAGE_S)
    assert records[0].boundary_idle_s is None  # an arm's first step has no boundary
    assert records[0].stage_s == pytest.approx(STAGE_S, abs=SLACK_S)
    for record in records[1:]:
        assert record.stage_s == pytest.approx(STAGE_S, abs=SLACK_S)
        assert STAGE_S - SLACK_S <= record.boundary_idle_s <= STAGE_S + 2 * SLACK_S
    for record in records:
        assert record.fwd_bwd_device_s == pytest.approx([FIRST_CALL_S], abs=SLACK_S)


class StagingDeviceEngine(EmulatedDeviceEngine):
    """As EmulatedDeviceEngine, but a first call whose input was staged runs as a regular one:
    staging spares it the copy (FIRST_CALL_S - REGULAR_CALL_S), and costs `stage_s` of host time."""

    def fwd_bwd(self, batch):
        if isinstance(batch, StandInPrepared):
            self._after_update = False
        super().fwd_bwd(batch)


@pytest.mark.parametrize("stage_s", [0.0, 0.5], ids=["cheap", "slower-than-its-copy"])
def test_the_report_says_when_staging_costs_more_than_the_copy_it_hides(stage_s):
    """Two micro-steps (0.1 s each on the device once the first is staged) and a stage of 0.5 s
    of host time after the last dispatch: the device idles 0.3 s of it, more than the 0.15 s copy
    an unstaged first call waits for, so the report names the staging path as what a verdict on
    the switch measures. With a stage that costs nothing, it says nothing of the kind."""
    engine = StagingDeviceEngine(stage_s)
    config = BenchConfig(preset=PRESETS["cpu-tiny"], steps=STEPS, micro_steps=2)
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=stand_in_pool(5))
    bench.setup()
    try:
        runs = [bench.run(steps=STEPS, stage=StageConfig(before_update=on)) for on in (False, True)]
    finally:
        bench.close()
    compared = boundary.compare(runs)
    assert compared.unstaged_extra_s == pytest.approx(FIRST_CALL_S - REGULAR_CALL_S, abs=SLACK_S)
    assert compared.stage_exposed_s == pytest.approx(
        max(0.0, stage_s - 2 * REGULAR_CALL_S), abs=SLACK_S
    )
    lines = compared.lines()
    said = [line for line in lines if line.startswith("staging costs more than the copy")]
    if stage_s:
        (line,) = said
        assert "a verdict on STAGE_BEFORE_UPDATE measures the staging path of" in line
        assert "StagingDeviceEngine" in line
        assert f"against the {compared.hid_s * 1e3:.2f} ms copy it hides" in line
        assert compared.hid_s == compared.unstaged_extra_s
    else:
        assert said == [], lines
