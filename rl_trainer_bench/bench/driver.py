"""The bench driver: build the micro-batch pool, compile, then time steps of the trainer's program.

A step is MICRO_STEPS `fwd_bwd` calls and one `update`, then a drain and a metrics read, exactly the
calls the RL trainer makes; everything else (building inputs, compiling, naming, digests) happens
off the clock. STAGE_BEFORE_UPDATE moves the next step's first host-to-device copy into the
boundary, where the device is still busy; the driver measures how much of that copy was hidden
instead of assuming it. Anything that would make a number untrustworthy fails the run; a refusal
is made as early as what it needs allows (the plan's before any work, the engine's before the
compile), and a refused run leaves earlier results as they were.

The timed loop itself is `bench/step.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from rl_trainer_bench import interrupts, io
from rl_trainer_bench.bench import (
    device_peak,
    host_link,
    load_failure,
    persistent_cache,
    results_file,
    step_record,
)
from rl_trainer_bench.bench.distributed import initialize_runtime
from rl_trainer_bench.bench.plan import refuse_unrunnable_stages, resolve
from rl_trainer_bench.bench.step import (
    ArmSettings,
    CompileWatch,
    MicroBatchPool,
    ProfilerWindow,
    StepLoop,
    stage_knob,
)
from rl_trainer_bench.bench.step_record import ArmRun, StepRecord
from rl_trainer_bench.bench.worker import TrainerWorker
from rl_trainer_bench.chips.accelerators import chip_for_device_kind
from rl_trainer_bench.code_digest import code_sha256
from rl_trainer_bench.config import compile_cache
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.engine import returns
from rl_trainer_bench.engine.config import EngineConfig, MeshConfig
from rl_trainer_bench.engine.contract import (
    STAGING_METHODS,
    Engine,
    Payload,
    StateMismatch,
    missing_methods,
    optional,
)
from rl_trainer_bench.engine.factory import engine_class
from rl_trainer_bench.errors import ConfigError
from rl_trainer_bench.payload import build as payload
from rl_trainer_bench.payload import routing_profile
from rl_trainer_bench.payload.packing import layout_from_orchestrator_argv
from rl_trainer_bench.units import human_bytes

EngineFactory = Callable[[EngineConfig], Engine]


class Bench:
    """One engine, one worker and one micro-batch pool, shared by every `run` (every A/B arm).

    `engine_factory` and `pool` exist so tests can put stand-ins in place of the engine and the
    payload builder; by default the engine is the class ENGINE names, built by
    `engine.factory`, and the pool is `DISTINCT_MICRO_BATCHES` calibrated micro-batches
    (`payload.build.build_calibrated`, indices 0..N-1), built before the engine.
    """

    def __init__(
        self,
        config: BenchConfig,
        log: Callable[[str], None] = print,
        *,
        engine_factory: EngineFactory | None = None,
        pool: Sequence[Payload] | None = None,
        engine_config: EngineConfig | None = None,
    ):
        self.config = config
        # The plan's engine config (`bench/plan.py`), so the run builds what the plan printed
        # (a run's, an A/B arm's); None: a Bench built apart from a run resolves its own plan.
        self._planned_engine = engine_config
        self.log = log
        self._engine_factory = engine_factory
        self._given_pool = pool
        self.engine: Any = None
        self.worker: TrainerWorker | None = None
        self.pool: MicroBatchPool | None = None
        self.compiles = CompileWatch()
        self._compile_listener = contextlib.ExitStack()
        self._devices = 1
        self._mesh = MeshConfig()
        self._peak_flops: float | None = None
        self.boundary_copy_s: float | None = None  # measured by `compile`

    # -- set-up (off the clock) ----------------------------------------------------------------

    def setup(self, stages: Sequence[StageConfig] = ()) -> dict[str, float]:
        """`build` then `compile`; compile seconds per program."""
        self.build(stages)
        return self.compile()

    def build(self, stages: Sequence[StageConfig] = (), state_of: Bench | None = None) -> None:
        """The micro-batch pool, the engine and the worker, and every refusal that needs them, for
        the configured stage and any other `stages` this Bench will run: nothing compiled yet.

        `state_of`: a built Bench whose engine's training state this one's engine trains too
        (`share_state`, engine/contract.py) instead of allocating its own (StateMismatch when it
        cannot).
        """
        refuse_unrunnable_stages(self.config.worker, (self.config.stage, *stages))
        # Files an engine writes of its own (MaxText's events) go inside the results folder.
        engine_config = dataclasses.replace(
            self._engine_config(),
            output_dir=str(self.config.results_dir / "engine"),
            dump_buffer_assignment=self.config.measure_peak,
        )
        factory = self._engine_factory or engine_class(self.config.engine)  # import it first
        payloads = self._build_pool(engine_config)
        self.engine = factory(engine_config) if state_of is None else state_of.shared(engine_config)
        returns.refuse_incomplete(self.engine)
        self.worker = TrainerWorker(self.engine, fused=self.config.worker == "fused")
        self.log(f"{step_record.LOG_PREFIX} worker {_describe(self.worker.info())}")
        for stage in (self.config.stage, *stages):
            self.refuse_unsupported(stage)
        self.pool = MicroBatchPool(payloads, self.engine, self.config.micro_steps)
        self._devices = engine_config.mesh.size
        self._mesh = engine_config.mesh
        chip = chip_for_device_kind(jax.devices()[0].device_kind)
        self._peak_flops = chip.per_device(chip.peak_bf16_flops) if chip else None

    def compile(self) -> dict[str, float]:
        """Compile every program on the pool's first micro-batch, then watch for later compiles.

        The compile is the run's longest silence (over a minute for cpu-tiny on a loaded 2-core
        CPU: benchmarks/reports/reliability_cpu_2026-12-03.md), so a line says it has started
        before it does.
        """
        self.log(
            f"{step_record.LOG_PREFIX} compiling the engine's programs for {self.config.preset.name}"
            " on the first micro-batch (once, before the first step; tens of seconds to minutes"
            " on a CPU, more for a large cell)"
        )
        started = time.perf_counter()
        # the engine compiles what only some micro-batches need if one of the pool's does
        will_run = optional(self.engine, "will_run")
        if will_run is not None:
            will_run([entry.payload for entry in self.pool.entries])
        with load_failure.refused_as_size(self.config.preset.name, load_failure.compile_refusal):
            compile_s = returns.compile_seconds(self.engine.compile(self.pool.entries[0].payload))
        wall = time.perf_counter() - started
        interrupts.check()  # a Ctrl-C during the compile may have been swallowed inside it
        for program, seconds in compile_s.items():
            self.log(f"{step_record.LOG_PREFIX} compile program={program} seconds={seconds:.3f}")
        self.log(f"{step_record.LOG_PREFIX} compile wall_seconds={wall:.3f} (all programs)")
        cache = persistent_cache.summary()
        if cache is not None:
            self.log(f"{step_record.LOG_PREFIX} {cache}")
        self.boundary_copy_s = self._measured_boundary_copy()
        self._compile_listener.enter_context(self.compiles.installed())
        return compile_s

    def _measured_boundary_copy(self) -> float:
        """The pool's first micro-batch copied alone to every device, and the link it crosses
        (`host_link`): what an unstaged boundary's first fwd_bwd is predicted to wait for."""
        payload = self.pool.entries[0].payload
        link, copy_s, _sent = host_link.measure(payload, self._mesh, self.engine)
        self.log(
            f"{step_record.LOG_PREFIX} host link {link.describe()}; the step boundary's copy of a"
            f" micro-batch {copy_s * 1e3:.3g} ms, MEASURED (STAGE_BEFORE_UPDATE off: each step's"
            " first fwd_bwd waits for it; on: it runs beside the step's last fwd_bwd); the"
            f" engine's copy: {staging_path(self.engine)}"
        )
        return copy_s

    def shared(self, engine_config: EngineConfig) -> Engine:
        """An engine for `engine_config` over this Bench's engine's training state; StateMismatch
        when this engine cannot share it or `engine_config` needs another."""
        share = optional(self.engine, "share_state")
        if share is None:
            raise StateMismatch(
                f"{type(self.engine).__name__} has no share_state, so no other config's programs"
                " can run on its training state"
            )
        self.log(f"{step_record.LOG_PREFIX} engine built over the training state of another bench")
        return share(engine_config)

    def refuse_unsupported(self, stage: StageConfig) -> None:
        """ConfigError when this Bench's engine lacks the methods `stage` needs (the worker's
        refusal is the plan's, made before the engine was built)."""
        missing = missing_methods(self.engine, STAGING_METHODS) if stage.enabled else []
        if missing:
            knob = stage_knob(stage)
            raise ConfigError(
                f"{knob}=on needs the engine methods {' and '.join(STAGING_METHODS)};"
                f" {type(self.engine).__name__} lacks {' and '.join(missing)}: set {knob}=off"
            )

    def _engine_config(self) -> EngineConfig:
        """The plan's engine config: the one given, else the plan of this Bench's knobs resolved
        here (a Bench built apart from a run, as tests and benchmarks build one); logs the keys
        that plan does not apply."""
        if self._planned_engine is not None:
            return self._planned_engine
        resolved = resolve(self.config, rendering=True)
        if resolved.unapplied:
            self.log(
                f"{step_record.LOG_PREFIX} engine keys not applied: {' '.join(resolved.unapplied)}"
            )
        return resolved.engine

    def _build_pool(self, engine_config: EngineConfig) -> list[Payload]:
        if self._given_pool is not None:
            return list(self._given_pool)
        layout = (
            layout_from_orchestrator_argv(engine_config, self.config.orch_argv)
            if self.config.orch_argv
            else None
        )
        profile = routing_profile.load_profile(
            self.config.routing_profile, self.config.preset.routing_profile
        )
        started = time.perf_counter()
        pool = []
        for index in range(self.config.distinct_micro_batches):
            built = payload.build_calibrated(
                engine_config, profile, seed=self.config.seed, index=index, layout=layout
            )
            if index == 0 and built.calibration is not None:
                for line in built.calibration.format().splitlines():
                    self.log(f"{step_record.LOG_PREFIX} calibration {line}")
            pool.append(built.payload)
        self.log(
            f"{step_record.LOG_PREFIX} pool micro_batches={len(pool)}"
            f" bytes_each={pool[0].nbytes} seconds={time.perf_counter() - started:.3f}"
        )
        return pool

    # -- the timed loop ------------------------------------------------------------------------

    def run(
        self,
        *,
        steps: int,
        stage: StageConfig,
        arm: str = "",
        warmup_steps: int = 1,
        results_path: Path | None = None,
        boundary_stages: Sequence[StageConfig] | None = None,
        companions: Mapping[str, str] | None = None,
    ) -> ArmRun:
        """Warm-up then `steps` scored steps, starting at pool index 0 (every arm trains the same
        micro-batches in the same order); one ruler line and one JSON line per step.

        `boundary_stages`, one per step, gives each boundary its own stage (by the step it closes,
        the last step's included) in place of `stage`: an interleaved A/B switches settings at the boundaries.
        `companions` are files written beside the results with the first step (`ResultsWriter`).
        """
        per_boundary = self._checked_stages(stage, warmup_steps + steps, boundary_stages)
        take_state = optional(self.engine, "take_shared_state")
        if take_state is not None:  # off the clock: the state another Bench's engine left
            take_state()
        updates_before = self.worker.train_step
        settings = ArmSettings(arm, warmup_steps, steps, self._devices, self._peak_flops)
        profiler = ProfilerWindow(self.config.profile_steps, self.config.results_dir / "profile")
        loop = StepLoop(
            self.worker, self.pool, stage, self.compiles, profiler, settings, self.log, per_boundary
        )
        writer = (
            results_file.ResultsWriter(results_path, self.log, companions) if results_path else None
        )
        with loop, writer or contextlib.nullcontext():
            for step in range(loop.total_steps):
                interrupts.check()  # one swallowed by library code stops the run at a boundary
                record = self._step_that_fits(loop, step)
                self.log(step_record.format_line(record))
                if record.staged is not None:
                    knob = stage_knob(loop.staging.stage_of(step))
                    self.log(step_record.stage_line(knob, record))
                if writer:
                    writer.write(record)
        digest = optional(self.engine, "parameter_digest")
        return ArmRun(
            label=arm,
            setting=arm,
            staged=stage.enabled,
            records=loop.records,
            updates=self.worker.train_step - updates_before,
            stages=loop.staging.count,
            recompiles=loop.recompiles,
            param_digest=str(digest()) if digest is not None else None,
            stages_at=[s.enabled for s in per_boundary] if boundary_stages is not None else None,
            boundary_copy_s=self.boundary_copy_s,
            staging_path=staging_path(self.engine),
        )

    def _step_that_fits(self, loop: StepLoop, step: int) -> StepRecord:
        """One step of `loop`; a program that does not load is refused as the size's answer."""
        with load_failure.refused_as_size(self.config.preset.name, load_failure.refusal):
            return loop.run_step(step)

    def measure_peak(self, stage: StageConfig, first_step: int) -> device_peak.PeakMeasurement:
        """MEASURE_PEAK: probe steps of `stage` from step `first_step` on (after the scored ones,
        off their record) beside fillers on each of this process's devices (`device_peak`)."""
        devices = jax.local_devices()
        steps = itertools.count(first_step)
        settings = ArmSettings("peak", 0, 1, self._devices, self._peak_flops)
        no_trace = ProfilerWindow(None, self.config.results_dir / "profile")
        loop = StepLoop(
            self.worker, self.pool, stage, self.compiles, no_trace, settings, lambda line: None
        )

        def probe_step() -> None:
            interrupts.check()  # Ctrl-C and SIGTERM stop the probes at a step's start, as a run
            loop.run_step(next(steps))

        with loop:
            memory = device_peak.device_memory(devices)
            probes, stopped = device_peak.bisect(
                lambda nbytes: device_peak.probe(devices, nbytes, probe_step), memory.free
            )
        return device_peak.PeakMeasurement(memory, tuple(probes), stopped)

    def _checked_stages(
        self, stage: StageConfig, boundaries: int, boundary_stages: Sequence[StageConfig] | None
    ) -> list[StageConfig]:
        """The per-boundary stages ([]: `stage` at every boundary), each refused before any step
        when the worker or the engine cannot run it."""
        if self.worker is None or self.pool is None:
            raise RuntimeError("Bench.run before Bench.setup")
        if boundary_stages is not None and len(boundary_stages) != boundaries:
            raise ValueError(f"{len(boundary_stages)} boundary stages for {boundaries} boundaries")
        per_boundary = list(boundary_stages) if boundary_stages is not None else []
        refuse_unrunnable_stages(self.config.worker, {stage, *per_boundary})
        for each in {stage, *per_boundary}:
            self.refuse_unsupported(each)
        return per_boundary

    def close(self) -> None:
        self._compile_listener.close()


def staging_path(engine: Engine) -> str:
    """The engine's copy of a micro-batch as its header names it: its class, and its
    `input_copy` where its `info` gives one."""
    describe = optional(engine, "info")
    copy = dict(describe()).get("input_copy") if describe is not None else None
    name = type(engine).__name__
    return f"{name} ({copy})" if copy else name


def _describe(info: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in info.items())


# ----------------------------------------------------------------------------------------------
# Entry points: bench_driver.py and `rl-trainer-bench run`
# ----------------------------------------------------------------------------------------------


def run_planned(
    config: BenchConfig,
    env: Mapping[str, str],
    log: Callable[[str], None],
    companions: Mapping[str, str] | None = None,
    engine_config: EngineConfig | None = None,
) -> int:
    """The run after its plan (`bench/entry.py`): start the runtime, time the steps, report.
    `companions` go beside results.jsonl with its first step (the plan the pod executes);
    `engine_config` is the plan's, built as the plan printed it.

    Returns the exit code: 1 when a scored step recompiled or a step's metrics were not finite.
    """
    log(initialize_runtime(env, config.preset.host_devices))
    refuse_unmeasurable_peak(config)
    # the cache is this process's: its own environment names JAX's folder and the user's
    cache_folder = compile_cache.folder(config.compile_cache, os.environ)
    log(f"{step_record.LOG_PREFIX} {persistent_cache.use(cache_folder, os.environ)}")
    log(f"{step_record.LOG_PREFIX} config {_describe(config.describe())}")
    log(f"{step_record.LOG_PREFIX} code sha256={code_sha256(engine=config.engine)}")
    results = config.results_dir / "results.jsonl"
    bench = Bench(config, log, engine_config=engine_config)
    try:
        bench.setup()
        result = bench.run(
            steps=config.steps,
            stage=config.stage,
            warmup_steps=config.warmup_steps,
            results_path=results,
            companions=companions,
        )
        if config.measure_peak:
            _report_peak(bench, config, log, first_step=config.warmup_steps + config.steps)
    finally:
        bench.close()
    log(step_record.summary(result.records))
    log(
        f"{step_record.LOG_PREFIX} final param_digest={result.param_digest or '-'}"
        f" updates={result.updates} stages={result.stages} results={results}"
    )
    failures = _failures(result)
    for failure in failures:
        log(f"{step_record.LOG_PREFIX} FAILED: {failure}")
    return 1 if failures else 0


def refuse_unmeasurable_peak(config: BenchConfig) -> None:
    """MEASURE_PEAK=on refused before the compile on devices with no memory limit (the host
    CPU's); a runtime of several processes or Pathways was refused by the plan already."""
    if config.measure_peak:
        device_peak.device_memory(jax.local_devices())


def _report_peak(bench: Bench, config: BenchConfig, log: Callable[[str], None], first_step: int):
    """The measured peak, aot's sum for the same compiled programs beside it, and both in
    RESULTS_DIR/device_peak.json."""
    measured = bench.measure_peak(config.stage, first_step)
    log(f"{step_record.LOG_PREFIX} {measured.describe()}")
    footprint = optional(bench.engine, "program_memory")
    programs = footprint() if footprint is not None else {}
    if programs:
        sums = ", ".join(f"{name} {human_bytes(p['peak'])}" for name, p in programs.items())
        log(
            f"{step_record.LOG_PREFIX} aot's peak of the same compiled programs (argument + output"
            f" - alias + temporaries + the state beside; the temporaries on TPU as the buffer"
            f" assignment's HBM block), ESTIMATE: {sums}"
        )
    document = {
        "measured": measured.as_dict(),
        "aot_model": programs,
        "stage": config.stage.describe(),
    }
    io.write_text_atomically(
        config.results_dir / "device_peak.json", json.dumps(document, indent=1) + "\n"
    )


def _failures(result: ArmRun) -> list[str]:
    """What makes a finished run's figures untrustworthy: a compile in a scored step, or a step
    whose loss, gradient norm or loss denominator the engine reported as NaN or infinite."""
    failures = []
    if result.recompiles:
        failures.append(
            f"programs compiled during scored steps: {', '.join(result.recompiles)};"
            " their compile time is in those steps' figures"
        )
    broken = [f"{r.step} ({', '.join(r.non_finite)})" for r in result.records if r.non_finite]
    if broken:
        failures.append(
            f"non-finite metrics at step(s) {'; '.join(broken)}: the engine's training diverged"
            " or is broken, so its step times do not time a working trainer"
        )
    return failures
