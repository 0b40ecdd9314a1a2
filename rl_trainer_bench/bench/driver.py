"""The bench driver: build the micro-batch pool, compile, then time steps of the trainer's program.

A step is MICRO_STEPS `fwd_bwd` calls and one `update`, then a drain and a metrics read, exactly the
calls the RL trainer makes; everything else (building inputs, compiling, naming, digests) happens
off the clock. STAGE_BEFORE_UPDATE moves the next step's first host-to-device copy into the
boundary, where the device is still busy; the driver measures how much of that copy was hidden
instead of assuming it. Anything that would make a number untrustworthy fails the run: a bad knob
(before any device work), an engine without the staging methods, a fused worker asked to stage
before an update it does not have, and a compile inside a scored step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.accelerators import chip_for_device_kind
from rl_trainer_bench.bench import ruler
from rl_trainer_bench.bench.device_timeline import DeviceTimeline
from rl_trainer_bench.bench.ruler import StepRecord
from rl_trainer_bench.bench.worker import TrainerWorker
from rl_trainer_bench.config.knobs import (
    BenchConfig,
    StageConfig,
    add_driver_knob_arguments,
    driver_knobs,
)
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import (
    STAGING_METHODS,
    Engine,
    Payload,
    PreparedInput,
    missing_methods,
)
from rl_trainer_bench.errors import ConfigError, UserError

EngineFactory = Callable[[EngineConfig], Engine]


@dataclasses.dataclass
class ArmResult:
    """What one `Bench.run` produced; two arms that trained the same data compare on these."""

    records: list[StepRecord]  # warm-up steps included, flagged warmup=True
    param_digest: str  # parameters after the arm ("" when the engine cannot digest them)
    updates: int  # optimizer updates applied in the arm
    stages: int  # prepare_fwd_bwd_input calls in the arm
    recompiles: list[str]  # programs compiled during scored steps (must be empty)


class RecompileError(RuntimeError):
    """A program compiled inside a scored step: its time would be in the step's figures."""


class CompileWatch:
    """Names every program XLA compiles while it is installed (JAX's backend-compile event)."""

    _EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self._names: list[str] = []
        self._lock = threading.Lock()

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == self._EVENT:
            with self._lock:
                self._names.append(str(kwargs.get("fun_name", "?")))

    @contextlib.contextmanager
    def installed(self) -> Iterator[CompileWatch]:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        try:
            yield self
        finally:
            jax.monitoring.unregister_event_duration_listener(self._listen)

    def mark(self) -> int:
        with self._lock:
            return len(self._names)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self._names[mark:]


@dataclasses.dataclass(frozen=True)
class _PoolEntry:
    """A pool micro-batch with what the ruler needs about it, computed once, off the clock."""

    payload: Payload
    digest: str
    tokens: int  # real (non-padding) tokens
    flops: float | None  # model FLOPs of one fwd_bwd on it, where the engine counts them


@dataclasses.dataclass
class _StepClock:
    """Raw host stamps of one step (perf_counter seconds) before the ruler turns them into figures."""

    start: float = 0.0
    dispatch_start: list[float] = dataclasses.field(default_factory=list)
    dispatch_s: list[float] = dataclasses.field(default_factory=list)
    update_start: float = 0.0
    update_s: float = 0.0
    drain_s: float = 0.0
    end: float = 0.0
    stage_issue: float | None = None
    stage_s: float = 0.0
    device_wait_s: float = 0.0


def micro_batch_digest(payload: Payload) -> str:
    """One digest for a micro-batch, from the per-array digests it was built with (no hashing of
    the arrays themselves: those digests were computed once, when the micro-batch was built)."""
    joined = ";".join(f"{name}={payload.digests[name]}" for name in sorted(payload.digests))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def _device_arrays(prepared: PreparedInput) -> Any:
    """The fields of an engine's PreparedInput as a pytree, for the watcher to block on."""
    if dataclasses.is_dataclass(prepared):
        return {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)}
    return getattr(prepared, "__dict__", prepared)


class Bench:
    """One engine, one worker and one micro-batch pool, shared by every `run` (every A/B arm).

    `engine_factory` and `pool` exist so tests can put stand-ins in place of the JAX engine and the
    payload builder; by default they come from `engine.jax_engine` and `payload.build_pool`.
    """

    def __init__(
        self,
        config: BenchConfig,
        log: Callable[[str], None] = print,
        *,
        engine_factory: EngineFactory | None = None,
        pool: Sequence[Payload] | None = None,
    ):
        self.config = config
        self.log = log
        self._engine_factory = engine_factory
        self._given_pool = pool
        self._pool: list[_PoolEntry] = []
        self.engine: Any = None
        self.worker: TrainerWorker | None = None
        self._compiles = CompileWatch()
        self._compile_listener: contextlib.ExitStack | None = None
        self._devices = 1
        self._peak_flops: float | None = None

    # -- set-up (off the clock) ----------------------------------------------------------------

    def setup(self) -> dict[str, float]:
        """Build the micro-batch pool (off the clock), the engine and worker, compile; compile
        seconds per program."""
        engine_config = self._engine_config()
        pool = self._build_pool(engine_config)
        factory = self._engine_factory or _jax_engine
        self.engine = factory(engine_config)
        self.worker = TrainerWorker(self.engine, fused=self.config.worker == "fused")
        self.log(f"{ruler.LOG_PREFIX} worker {_describe(self.worker.info())}")
        self._refuse_unsupported_staging(self.config.stage)
        count_flops = getattr(self.engine, "model_flops", None)
        self._pool = [
            _PoolEntry(
                payload=p,
                digest=micro_batch_digest(p),
                tokens=int(np.count_nonzero(p.segment_ids)),
                flops=float(count_flops(p)) if callable(count_flops) else None,
            )
            for p in pool
        ]
        self._devices = engine_config.mesh.size
        chip = chip_for_device_kind(jax.devices()[0].device_kind)
        self._peak_flops = chip.peak_bf16_flops if chip else None
        compile_s = dict(self.engine.compile(pool[0]))
        for program, seconds in compile_s.items():
            self.log(f"{ruler.LOG_PREFIX} compile program={program} seconds={seconds:.3f}")
        self._compile_listener = contextlib.ExitStack()
        self._compile_listener.enter_context(self._compiles.installed())
        return compile_s

    def _engine_config(self) -> EngineConfig:
        """The preset's engine config with TRAINER_ARGV and ENGINE_FLAGS applied; logs what is not."""
        if not self.config.trainer_argv and not self.config.engine_flags:
            return self.config.preset.engine
        from rl_trainer_bench.config.engine_keys import engine_config_from

        engine_config, unapplied = engine_config_from(
            self.config.preset,
            trainer_argv=self.config.trainer_argv,
            engine_flags=self.config.engine_flags,
        )
        if unapplied:
            self.log(f"{ruler.LOG_PREFIX} engine keys not applied: {' '.join(unapplied)}")
        return engine_config

    def _build_pool(self, engine_config: EngineConfig) -> list[Payload]:
        if self._given_pool is not None:
            return list(self._given_pool)
        from rl_trainer_bench.payload import build as payload
        from rl_trainer_bench.payload import routing_profile

        layout = (
            payload.layout_from_orchestrator_argv(engine_config, self.config.orch_argv)
            if self.config.orch_argv
            else None
        )
        profile = routing_profile.load_profile(self.config.routing_profile)
        started = time.perf_counter()
        pool = []
        for index in range(self.config.distinct_micro_batches):
            built = payload.build_calibrated(
                engine_config, profile, seed=self.config.seed, index=index, layout=layout
            )
            if index == 0 and built.calibration is not None:
                for line in built.calibration.format().splitlines():
                    self.log(f"{ruler.LOG_PREFIX} calibration {line}")
            pool.append(built.payload)
        self.log(
            f"{ruler.LOG_PREFIX} pool micro_batches={len(pool)}"
            f" bytes_each={pool[0].nbytes} seconds={time.perf_counter() - started:.3f}"
        )
        return pool

    def _refuse_unsupported_staging(self, stage: StageConfig) -> None:
        if not stage.enabled:
            return
        missing = missing_methods(self.engine, STAGING_METHODS)
        if missing:
            knob = "STAGE_BEFORE_UPDATE" if stage.before_update else "STAGE_AFTER_UPDATE"
            raise ConfigError(
                f"{knob}=on needs the engine methods {' and '.join(STAGING_METHODS)};"
                f" {type(self.engine).__name__} lacks {' and '.join(missing)}: set {knob}=off"
            )

    # -- the timed loop ------------------------------------------------------------------------

    def run(
        self,
        *,
        steps: int,
        stage: StageConfig,
        arm: str = "",
        warmup_steps: int = 1,
        results_path: Path | None = None,
    ) -> ArmResult:
        """Warm-up then `steps` scored steps, starting at pool index 0 (every arm trains the same
        micro-batches in the same order); one ruler line and one JSON line per step."""
        if self.worker is None:
            raise RuntimeError("Bench.run before Bench.setup")
        self._refuse_unsupported_staging(stage)
        arm_run = _ArmRun(self, stage, arm, warmup_steps, steps)
        writer = ruler.ResultsWriter(results_path) if results_path else None
        try:
            for step in range(warmup_steps + steps):
                record = arm_run.step(step)
                self.log(ruler.format_line(record))
                if record.staged is not None:
                    self.log(arm_run.stage_line(record))
                if writer:
                    writer.write(record)
        finally:
            arm_run.close()
            if writer:
                writer.close()
        digest = getattr(self.engine, "parameter_digest", None)
        return ArmResult(
            records=arm_run.records,
            param_digest=str(digest()) if callable(digest) else "",
            updates=self.worker.train_step - arm_run.train_step_at_start,
            stages=arm_run.stages,
            recompiles=arm_run.recompiles,
        )

    def close(self) -> None:
        if self._compile_listener:
            self._compile_listener.close()
            self._compile_listener = None

    def micro_batch(self, step: int, index: int) -> _PoolEntry:
        """Step `step`'s `index`-th micro-batch: the pool in order, cycling, named for the log."""
        entry = self._pool[(step * self.micro_steps + index) % len(self._pool)]
        named = dataclasses.replace(entry.payload, name=f"bench_{step}_{index}")
        return dataclasses.replace(entry, payload=named)

    @property
    def micro_steps(self) -> int:
        return self.config.micro_steps


class _ArmRun:
    """The state of one arm's loop: the timelines, the staged input, the previous step's stamps."""

    def __init__(self, bench: Bench, stage: StageConfig, arm: str, warmup: int, steps: int):
        self.bench = bench
        self.engine = bench.engine
        self.worker = bench.worker
        self.stage = stage
        self.arm = arm
        self.warmup = warmup
        self.total = warmup + steps
        self.issue_before_last = stage.before_update and stage.issue_before_last(
            jax.default_backend()
        )
        self.marker = getattr(self.engine, "completion_marker", None)
        self.programs = DeviceTimeline("bench-programs") if callable(self.marker) else None
        self.copies = DeviceTimeline("bench-copies") if stage.enabled else None
        self.prepared: PreparedInput | None = None
        self.previous_ready: float | None = None
        self.records: list[StepRecord] = []
        self.recompiles: list[str] = []
        self.stages = 0
        self.train_step_at_start = self.worker.train_step
        self.profile = bench.config.profile_steps
        self.profile_dir = bench.config.results_dir / "profile"
        self.tracing = False

    def close(self) -> None:
        for timeline in (self.programs, self.copies):
            if timeline:
                timeline.close()
        if self.tracing:  # a failed step inside the window: still write the trace
            jax.profiler.stop_trace()

    def step(self, step: int) -> StepRecord:
        bench, worker = self.bench, self.worker
        batches = [bench.micro_batch(step, i) for i in range(bench.micro_steps)]
        upcoming = bench.micro_batch(step + 1, 0).payload if step + 1 < self.total else None
        clock = _StepClock()
        staged_name = None
        if self.profile and step == self.profile[0]:
            jax.profiler.start_trace(str(self.profile_dir))
            self.tracing = True
        compiles_mark = bench._compiles.mark()
        train_step = worker.train_step
        with jax.profiler.StepTraceAnnotation("bench_step", step_num=step):
            clock.start = time.perf_counter()
            for index, entry in enumerate(batches):
                last = index == len(batches) - 1
                if last and upcoming is not None and self.issue_before_last:
                    staged_name = self._stage(upcoming, clock, step)
                request = (
                    self.prepared if index == 0 and self.prepared is not None else entry.payload
                )
                if index == 0:
                    self.prepared = None
                clock.dispatch_start.append(time.perf_counter())
                with jax.profiler.TraceAnnotation(f"fwd_bwd {entry.payload.name}"):
                    worker.fwd_bwd(request, apply_optimizer=last)
                clock.dispatch_s.append(time.perf_counter() - clock.dispatch_start[-1])
                self._watch(f"{step}/fwd_bwd/{index}")
            if upcoming is not None and self.stage.before_update:
                self._refuse_fused(train_step)
                if staged_name is None:
                    staged_name = self._stage(upcoming, clock, step)
                clock.device_wait_s = float(self.engine.wait_for_device())
            clock.update_start = time.perf_counter()
            with jax.profiler.TraceAnnotation("update"):
                worker.update()
            clock.update_s = time.perf_counter() - clock.update_start
            self._watch(f"{step}/update")
            if upcoming is not None and self.stage.after_update:
                staged_name = self._stage(upcoming, clock, step)
                clock.device_wait_s = float(self.engine.wait_for_device())
            update_ready = self.programs.ready(f"{step}/update") if self.programs else None
            metrics = worker.get_metrics()
            clock.end = time.perf_counter()
            clock.drain_s = clock.end - clock.update_start - clock.update_s
        if self.profile and step == self.profile[1]:
            jax.profiler.stop_trace()
            self.tracing = False
        compiled = bench._compiles.since(compiles_mark)
        scored = step >= self.warmup
        if scored and compiled:
            self.recompiles.extend(compiled)
            bench.log(f"{ruler.LOG_PREFIX} RECOMPILE step={step} programs={','.join(compiled)}")
        record = self._record(step, batches, clock, metrics, update_ready, staged_name)
        record.recompiles = len(compiled) if scored else 0
        self.records.append(record)
        return record

    def _watch(self, label: str) -> None:
        if self.programs:
            self.programs.watch(label, self.marker())

    def _stage(self, payload: Payload, clock: _StepClock, step: int) -> str:
        """Start the next first micro-batch's copy; the next step's first fwd_bwd consumes it."""
        clock.stage_issue = time.perf_counter()
        with jax.profiler.TraceAnnotation(f"stage {payload.name}"):
            self.prepared = self.engine.prepare_fwd_bwd_input(payload)
        clock.stage_s = time.perf_counter() - clock.stage_issue
        self.copies.watch(f"{step}/stage", _device_arrays(self.prepared))
        self.stages += 1
        return payload.name

    def _refuse_fused(self, train_step_before: int) -> None:
        moved_to = self.worker.train_step
        if moved_to != train_step_before:
            raise ConfigError(
                "STAGE_BEFORE_UPDATE=on needs an update to stage before, but train_step moved"
                f" {train_step_before} -> {moved_to} inside the step's last fwd_bwd (a fused"
                " worker applies the optimizer there): set WORKER=separate or STAGE_BEFORE_UPDATE=off"
            )

    def _record(
        self,
        step: int,
        batches: Sequence[_PoolEntry],
        clock: _StepClock,
        metrics: Mapping[str, Any],
        update_ready: float | None,
        staged_name: str | None,
    ) -> StepRecord:
        bench = self.bench
        step_s = clock.end - clock.start
        tokens = sum(b.tokens for b in batches)
        flops = [b.flops for b in batches]
        tflops = (
            None if None in flops else sum(flops) / step_s / bench._devices / 1e12  # type: ignore[arg-type]
        )
        ready, device_s, hidden, idle = [], [], None, None
        if self.programs:
            ready = [self.programs.ready(f"{step}/fwd_bwd/{i}") for i in range(len(batches))]
            device_s = ruler.device_seconds(clock.dispatch_start, ready, self.previous_ready)
            idle = ruler.boundary_idle(self.previous_ready, clock.dispatch_start[0])
            if staged_name is not None and clock.stage_issue is not None:
                busy_starts = [*clock.dispatch_start, clock.update_start]
                busy_ends = [*ready, update_ready]
                spans = ruler.device_seconds(busy_starts, busy_ends, self.previous_ready)
                busy = [(end - s, end) for s, end in zip(spans, busy_ends, strict=True)]
                copy_ready = self.copies.ready(f"{step}/stage")
                hidden = ruler.overlap_fraction((clock.stage_issue, copy_ready), busy)
            self.previous_ready = update_ready
        relative = [r - clock.start for r in ready]
        return StepRecord(
            step=step,
            warmup=step < self.warmup,
            step_s=step_s,
            fwd_bwd_dispatch_s=clock.dispatch_s,
            # A dropless replay of micro-batch i is dispatched inside fwd_bwd(i+1), so with replays
            # the regular calls carry extra work the first one does not: not comparable.
            first_call_extra_s=(
                ruler.first_call_extra(device_s)
                if int(metrics.get("replay_count", 0)) == 0
                else None
            ),
            update_s=clock.update_s,
            drain_s=clock.drain_s,
            stage_s=clock.stage_s,
            device_wait_s=clock.device_wait_s,
            tokens=tokens,
            tokens_per_s_per_device=tokens / step_s / bench._devices,
            tflops_per_device=tflops,
            mfu=(
                tflops * 1e12 / bench._peak_flops
                if tflops is not None and bench._peak_flops
                else None
            ),
            loss=float(metrics["loss"]),
            grad_norm=float(metrics["grad_norm"]),
            loss_denominator=float(metrics["loss_denominator"]),
            overflow_count=int(metrics.get("overflow_count", 0)),
            replay_count=int(metrics.get("replay_count", 0)),
            micro_batches=[b.payload.name for b in batches],
            digests=[b.digest for b in batches],
            device_ready_s=relative,
            update_ready_s=None if update_ready is None else update_ready - clock.start,
            boundary_idle_s=idle,
            staged=staged_name,
            stage_hidden=hidden,
            arm=self.arm,
            fwd_bwd_device_s=device_s,
        )

    def stage_line(self, record: StepRecord) -> str:
        knob = "STAGE_BEFORE_UPDATE" if self.stage.before_update else "STAGE_AFTER_UPDATE"
        hidden = "-" if record.stage_hidden is None else f"{record.stage_hidden:.3f}"
        return (
            f"{knob} step={record.step} staged={record.staged} stage_s={record.stage_s:.6f}"
            f" device_wait_s={record.device_wait_s:.6f} hidden={hidden}"
        )


def _jax_engine(engine_config: EngineConfig) -> Engine:
    from rl_trainer_bench.engine.jax_engine import JaxEngine

    return JaxEngine(engine_config)


def _describe(info: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in info.items())


# ----------------------------------------------------------------------------------------------
# Entry points: bench_driver.py and `rl-trainer-bench run`
# ----------------------------------------------------------------------------------------------


def run_bench(config: BenchConfig, env: Mapping[str, str], log: Callable[[str], None]) -> int:
    """The driver's whole run; returns the exit code (1 when a scored step recompiled)."""
    from rl_trainer_bench.bench.distributed import initialize_runtime
    from rl_trainer_bench.launch.code_bundle import code_sha256

    log(initialize_runtime(env, config.preset.host_devices))
    log(f"{ruler.LOG_PREFIX} config {_describe(config.describe())}")
    log(f"{ruler.LOG_PREFIX} code sha256={code_sha256()}")
    results = config.results_dir / "results.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    bench = Bench(config, log)
    try:
        bench.setup()
        result = bench.run(
            steps=config.steps,
            stage=config.stage,
            warmup_steps=config.warmup_steps,
            results_path=results,
        )
    finally:
        bench.close()
    log(ruler.summary(result.records))
    log(
        f"{ruler.LOG_PREFIX} final param_digest={result.param_digest or '-'}"
        f" updates={result.updates} stages={result.stages} results={results}"
    )
    if result.recompiles:
        log(
            f"{ruler.LOG_PREFIX} FAILED: programs compiled during scored steps:"
            f" {', '.join(result.recompiles)}; their compile time is in those steps' figures"
        )
        return 1
    return 0


def run_command(args: argparse.Namespace) -> int:
    """`rl-trainer-bench run`: knobs from the environment, overridden by flags."""
    config = BenchConfig.from_env(driver_knobs(os.environ, args))
    return run_bench(config, os.environ, lambda line: print(line, flush=True))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """bench_driver.py's entry: knobs from `env` (default os.environ) and flags in `argv`."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="bench_driver", description=__doc__.splitlines()[0])
    add_driver_knob_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = BenchConfig.from_env(driver_knobs(env, args))
        return run_bench(config, env, lambda line: print(line, flush=True))
    except UserError as error:
        print(f"bench_driver: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
