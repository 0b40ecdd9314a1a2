"""One arm's timed steps, written as the RL trainer's loop: M x `fwd_bwd`, `update`, metrics read.

`StepLoop.run_step` is that loop and nothing else; what the bench adds to it sits in small parts
beside it, each named where the loop uses it:
- `StepClock` spans (clock.py) around each timed call; step_record.py builds the step's record from them;
- `Staging`: the next step's first micro-batch copied at one issue point of the step, the device
  waited for at one, the prepared input handed to the `fwd_bwd` that trains it;
- `ProgramTimeline`: each program's completion marker stamped when ready, off the host's path;
- `CompileWatch`: programs XLA compiled during the step (a compile inside a scored step fails the run);
- `ProfilerWindow`: the PROFILE_STEPS trace, started and stopped around the steps it covers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.bench import step_record
from rl_trainer_bench.bench.clock import StepClock
from rl_trainer_bench.bench.device_timeline import DeviceTimeline
from rl_trainer_bench.bench.step_record import StepRecord
from rl_trainer_bench.bench.worker import TrainerWorker
from rl_trainer_bench.config.knobs import StageConfig
from rl_trainer_bench.engine import compile_events
from rl_trainer_bench.engine.contract import Engine, Payload, PreparedInput, optional

# The points of a step where staging can issue the next first micro-batch's copy or wait for it.
BEFORE_LAST_FWD_BWD, BEFORE_UPDATE, AFTER_UPDATE = (
    "before_last_fwd_bwd",
    "before_update",
    "after_update",
)


@dataclasses.dataclass(frozen=True)
class PoolEntry:
    """A pool micro-batch with what the ruler needs about it, computed once, off the clock."""

    payload: Payload
    digest: str
    tokens: int  # real (non-padding) tokens
    flops: float | None  # model FLOPs of one fwd_bwd on it, where the engine counts them


class MicroBatchPool:
    """The micro-batches every arm trains: step s, call i takes entry (s * M + i) mod pool size."""

    def __init__(self, payloads: Sequence[Payload], engine: Engine, micro_steps: int):
        count_flops = optional(engine, "model_flops")
        self.micro_steps = micro_steps
        self.entries = [
            PoolEntry(
                payload=p,
                digest=micro_batch_digest(p),
                tokens=int(np.count_nonzero(p.segment_ids)),
                flops=float(count_flops(p)) if count_flops is not None else None,
            )
            for p in payloads
        ]

    def for_step(self, step: int) -> list[PoolEntry]:
        """Step `step`'s micro-batches in training order, named `bench_<step>_<index>` for the log."""
        return [self._entry(step, index) for index in range(self.micro_steps)]

    def first_of(self, step: int) -> Payload:
        return self._entry(step, 0).payload

    def _entry(self, step: int, index: int) -> PoolEntry:
        entry = self.entries[(step * self.micro_steps + index) % len(self.entries)]
        named = dataclasses.replace(entry.payload, name=f"bench_{step}_{index}")
        return dataclasses.replace(entry, payload=named)


def micro_batch_digest(payload: Payload) -> str:
    """One digest for a micro-batch, from the per-array digests it was built with (no hashing of
    the arrays themselves: those digests were computed once, when the micro-batch was built)."""
    joined = ";".join(f"{name}={payload.digests[name]}" for name in sorted(payload.digests))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def stage_knob(stage: StageConfig) -> str:
    """The knob that turned staging on, as the log and the refusals name it."""
    return "STAGE_BEFORE_UPDATE" if stage.before_update else "STAGE_AFTER_UPDATE"


class Staging:
    """Stages the next step's first micro-batch: issues its copy at one point of the step, waits
    for the device at one, and hands the prepared input to the `fwd_bwd` that trains it.

    STAGE_BEFORE_UPDATE issues before the step's last `fwd_bwd` (where STAGE_ISSUE says so for the
    platform) or after it, and waits before `update`; STAGE_AFTER_UPDATE issues and waits right
    after `update`. The copies' ready stamps say how much of each copy the device's work hid.
    `stages`, by the step whose closing boundary it serves, gives a boundary its own stage (an
    interleaved A/B); steps past its end use `stage`.
    """

    def __init__(
        self,
        engine: Engine,
        stage: StageConfig,
        platform: str,
        stages: Sequence[StageConfig] = (),
    ):
        self._engine = engine
        self._stage, self._stages, self._platform = stage, stages, platform
        self.count = 0
        enabled = stage.enabled or any(s.enabled for s in stages)
        self._copies = DeviceTimeline("bench-copies") if enabled else None
        self._prepared: dict[str, PreparedInput] = {}  # by the name of the micro-batch it holds

    def stage_of(self, step: int) -> StageConfig:
        """The stage of the boundary that closes step `step`."""
        return self._stages[step] if step < len(self._stages) else self._stage

    def points(self, step: int) -> tuple[str | None, str | None]:
        """Where step `step` issues its stage's copy and where it waits for the device (None: not)."""
        stage = self.stage_of(step)
        if stage.before_update:
            early = stage.issue_before_last(self._platform)
            return (BEFORE_LAST_FWD_BWD if early else BEFORE_UPDATE), BEFORE_UPDATE
        if stage.after_update:
            return AFTER_UPDATE, AFTER_UPDATE
        return None, None

    def at(self, point: str, upcoming: Payload, clock: StepClock, step: int) -> None:
        """Staging's work at `point` of step `step`. A run's last step stages too (the copy is
        dropped when the run ends): a setting that acts at the boundary is then part of every
        step it times, a one-step A/B turn's included."""
        issue_at, wait_at = self.points(step)
        if point == issue_at:
            with clock.span("stage", f"stage {upcoming.name}"):
                prepared = self._engine.prepare_fwd_bwd_input(upcoming)
            self._copies.watch(f"{step}/stage", _device_arrays(prepared))
            self._prepared[upcoming.name] = prepared
            self.count += 1
        if point == wait_at:
            with clock.span("device_wait"):
                self._engine.wait_for_device()

    def lead_in(self, first: Payload) -> bool:
        """Off the clock, stage `first` as the boundary before it would have, when the run's stage
        stages: a run that scores from its first step (an A/B turn after another arm's) then
        starts as a steady-state step of its setting does. Not counted as a boundary's stage."""
        if not self._stage.enabled:
            return False
        self._prepared[first.name] = self._engine.prepare_fwd_bwd_input(first)
        self._engine.wait_for_device()
        return True

    def input_for(self, payload: Payload) -> Payload | PreparedInput:
        """What `fwd_bwd` gets for `payload`: its staged copy where one was issued, else itself."""
        return self._prepared.pop(payload.name, payload)

    def copy_ready(self, step: int) -> float | None:
        """When step `step`'s staged copy was ready (None: nothing was staged at that step)."""
        return self._copies.ready(f"{step}/stage") if self._copies else None

    def close(self) -> None:
        self._prepared.clear()  # the last step's stage, for a step this run does not train
        if self._copies:
            self._copies.close()


def _device_arrays(prepared: PreparedInput) -> Any:
    """The fields of an engine's PreparedInput as a pytree, for the watcher to block on."""
    if dataclasses.is_dataclass(prepared):
        return {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)}
    return getattr(prepared, "__dict__", prepared)


class ProgramTimeline:
    """Stamps each dispatched program's completion marker when ready, where the engine gives one."""

    def __init__(self, engine: Engine):
        self._marker = optional(engine, "completion_marker")
        self._timeline = DeviceTimeline("bench-programs") if self._marker is not None else None
        self._previous_ready: float | None = None

    def watch(self, label: str) -> None:
        if self._timeline:
            self._timeline.watch(label, self._marker())

    def stamps(
        self, step: int, calls: int, copy_ready: float | None
    ) -> step_record.DeviceStamps | None:
        """Step `step`'s ready stamps, read after its clock stopped (None: no completion markers)."""
        if not self._timeline:
            return None
        ready = [self._timeline.ready(f"{step}/fwd_bwd/{index}") for index in range(calls)]
        update = self._timeline.ready(f"{step}/update")
        stamps = step_record.DeviceStamps(ready, update, self._previous_ready, copy_ready)
        self._previous_ready = update
        return stamps

    def close(self) -> None:
        if self._timeline:
            self._timeline.close()


class CompileWatch:
    """Names every program XLA compiles while it is installed (JAX's backend-compile event)."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._lock = threading.Lock()

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == compile_events.BACKEND_COMPILE:
            with self._lock:
                self._names.append(str(kwargs.get("fun_name", "?")))

    @contextlib.contextmanager
    def installed(self) -> Iterator[CompileWatch]:
        with compile_events.listening(self._listen):
            yield self

    @contextlib.contextmanager
    def during(self) -> Iterator[list[str]]:
        """The programs compiled inside the block, in the yielded list once the block is over."""
        with self._lock:
            mark = len(self._names)
        compiled: list[str] = []
        yield compiled
        with self._lock:
            compiled.extend(self._names[mark:])


class ProfilerWindow:
    """PROFILE_STEPS: a trace from the window's first step to its last, written under `folder`."""

    def __init__(self, steps: tuple[int, int] | None, folder: Path):
        self._steps, self._folder = steps, folder
        self._tracing = False

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[None]:
        """One step, annotated for the trace viewer's step view; the trace starts before the
        window's first step and stops after its last, or after a step that fails inside it."""
        if self._steps and step == self._steps[0]:
            jax.profiler.start_trace(str(self._folder))
            self._tracing = True
        try:
            with jax.profiler.StepTraceAnnotation("bench_step", step_num=step):
                yield
        except BaseException:
            self._stop()
            raise
        if self._steps and step == self._steps[1]:
            self._stop()

    def _stop(self) -> None:
        if self._tracing:
            jax.profiler.stop_trace()
            self._tracing = False


@dataclasses.dataclass(frozen=True)
class ArmSettings:
    """What one arm's loop needs besides the engine: its label, its steps, and where it runs."""

    arm: str
    warmup_steps: int
    steps: int
    devices: int
    peak_flops: float | None


class StepLoop:
    """One arm's steps on a compiled engine: run_step is the trainer's loop, timed."""

    def __init__(
        self,
        worker: TrainerWorker,
        pool: MicroBatchPool,
        stage: StageConfig,
        compiles: CompileWatch,
        profiler: ProfilerWindow,
        settings: ArmSettings,
        log: Callable[[str], None],
        boundary_stages: Sequence[StageConfig] = (),
    ):
        self.worker, self.pool = worker, pool
        self.staging = Staging(worker.engine, stage, jax.default_backend(), boundary_stages)
        self.compiles, self.profiler, self.settings = compiles, profiler, settings
        self.log = log
        self.programs = ProgramTimeline(worker.engine)
        self.records: list[StepRecord] = []
        self.recompiles: list[str] = []  # programs compiled during scored steps

    def __enter__(self) -> StepLoop:
        first = self.pool.first_of(0)
        if self.settings.warmup_steps == 0 and self.staging.lead_in(first):
            self.log(
                f"{step_record.LOG_PREFIX} stage lead_in={first.name} (off the clock: the first"
                " step is scored, its input staged as a boundary would have)"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.programs.close()
        self.staging.close()

    def run_step(self, step: int) -> StepRecord:
        batches = self.pool.for_step(step)
        upcoming = self.pool.first_of(step + 1)
        clock = StepClock(annotate=jax.profiler.TraceAnnotation)
        last = len(batches) - 1
        with self.profiler.around(step), self.compiles.during() as compiled, clock.running():
            for index, batch in enumerate(batches):
                if index == last:
                    self.staging.at(BEFORE_LAST_FWD_BWD, upcoming, clock, step)
                request = self.staging.input_for(batch.payload)
                with clock.span("fwd_bwd", f"fwd_bwd {batch.payload.name}"):
                    self.worker.fwd_bwd(request, apply_optimizer=index == last)
                self.programs.watch(f"{step}/fwd_bwd/{index}")
            self.staging.at(BEFORE_UPDATE, upcoming, clock, step)
            with clock.span("update"):
                self.worker.update()
            self.programs.watch(f"{step}/update")
            self.staging.at(AFTER_UPDATE, upcoming, clock, step)
            metrics = self.worker.get_metrics()
        staged = upcoming.name if self.staging.points(step)[0] else None
        return self._record(step, batches, clock, compiled, metrics, staged)

    @property
    def total_steps(self) -> int:
        return self.settings.warmup_steps + self.settings.steps

    def _record(
        self,
        step: int,
        batches: Sequence[PoolEntry],
        clock: StepClock,
        compiled: list[str],
        metrics: Any,
        staged: str | None,
    ) -> StepRecord:
        """The ruler's record of the step, built after its clock stopped; scored compiles noted."""
        scored = step >= self.settings.warmup_steps
        if scored and compiled:
            self.recompiles.extend(compiled)
            self.log(
                f"{step_record.LOG_PREFIX} RECOMPILE step={step} programs={','.join(compiled)}"
            )
        flops = [b.flops for b in batches]
        inputs = step_record.StepInputs(
            step=step,
            warmup=not scored,
            arm=self.settings.arm,
            micro_batches=[b.payload.name for b in batches],
            digests=[b.digest for b in batches],
            tokens=sum(b.tokens for b in batches),
            model_flops=None if None in flops else sum(flops),  # type: ignore[arg-type]
            staged=staged,
            devices=self.settings.devices,
            peak_flops=self.settings.peak_flops,
        )
        copy_ready = self.staging.copy_ready(step) if staged else None
        device = self.programs.stamps(step, len(batches), copy_ready)
        record = step_record.from_measurements(
            inputs, clock, device, metrics, recompiles=len(compiled) if scored else 0
        )
        self.records.append(record)
        return record
