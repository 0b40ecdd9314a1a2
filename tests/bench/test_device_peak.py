"""MEASURE_PEAK: the bisection's bracket, what counts as a load that did not fit, the host CPU's
refusal, probes on real host devices (a real RESOURCE_EXHAUSTED from an allocation too large), and
the driver's probe steps on a device whose limit the stand-in engine emulates (the host CPU has
none)."""

import functools
import gc
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from stand_in_engine import StandInEngine, stand_in_pool

from rl_trainer_bench.bench import device_peak
from rl_trainer_bench.bench import plan as bench_plan
from rl_trainer_bench.bench.device_peak import DeviceMemory, PeakMeasurement, Probe
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import EXIT_USER_ERROR, ConfigError, run_guarded

OFF = StageConfig()
BEFORE = StageConfig(before_update=True, issue="after_last")
MIB = 1024**2
GIB = 1024**3
RESOLUTION = 8 * MIB  # the emulated device's, where a probe's filler costs its bytes on 8 devices
# The TPU runtime's own words for a program whose temporaries did not fit (tpu-v5e-facts.md)
TPU_LOAD_FAILURE = (
    "RESOURCE_EXHAUSTED: RuntimeProgramAllocationFailure: Error loading program 'jit_f':"
    " Attempting to reserve 4.00G at the bottom of memory. That was not possible. There are"
    " 3.61G free, 0B reserved"
)
# The same failure as it reached the driver on a v5e chip (JAX 0.10.2, libtpu, 2026-12-06): a
# ValueError with the runtime's text, in the probe steps of `run --measure-peak on`
CHIP_LOAD_FAILURE = ValueError(
    "RESOURCE_EXHAUSTED: RuntimeProgramAllocationFailure: Error loading program 'jit_fwd_bwd':"
    " Attempting to reserve 6.02G at the bottom of memory. That was not possible. There are"
    " 109.50M free, 0B reserved"
)


def device_that_needs(limit, in_use, need, calls):
    """A step that runs when the filler leaves it `need` bytes: the device's rule, written out."""

    def try_filler(filler):
        calls.append(filler)
        return Probe(filler, ran=in_use + filler + need <= limit, program="jit_step")

    return try_filler


@pytest.mark.parametrize("need", [1, 700 * MIB, int(5.3 * GIB), 6 * GIB + 17])
def test_bisection_brackets_the_step_need_to_its_resolution(need):
    limit, in_use = 16 * GIB, 9 * GIB
    calls = []
    probes, stopped = device_peak.bisect(
        device_that_needs(limit, in_use, need, calls), limit - in_use, resolution=64 * MIB
    )
    measured = PeakMeasurement(DeviceMemory(limit, in_use), tuple(probes), stopped)
    assert stopped == ""
    assert measured.peak_more_than < in_use + need <= measured.peak_at_most
    assert measured.peak_at_most - measured.peak_more_than <= 64 * MIB
    assert measured.failed_program == "jit_step"
    assert calls[0] == 7 * GIB  # the whole free memory first: is there any limit at all?
    assert len(calls) <= 9  # log2(7 GiB / 64 MiB) + 1


def test_a_step_that_needs_nothing_more_runs_beside_all_the_free_memory():
    calls = []
    probes, _ = device_peak.bisect(device_that_needs(16 * GIB, 9 * GIB, 0, calls), 7 * GIB)
    measured = PeakMeasurement(DeviceMemory(16 * GIB, 9 * GIB), tuple(probes))
    assert calls == [7 * GIB]
    assert measured.peak_at_most == 9 * GIB and measured.peak_more_than is None
    assert "ran beside every filler up to the free 7.00 GiB" in measured.describe()


def test_another_error_ends_the_search_with_the_bracket_it_has():
    def try_filler(filler):
        if filler < 4 * GIB:
            raise jax.errors.JaxRuntimeError("INTERNAL: the device was lost")
        return Probe(filler, ran=False, program="jit_update")

    probes, stopped = device_peak.bisect(try_filler, 8 * GIB)
    measured = PeakMeasurement(DeviceMemory(16 * GIB, 8 * GIB), tuple(probes), stopped)
    assert "raised INTERNAL: the device was lost" in stopped
    assert (measured.peak_more_than, measured.peak_at_most) == (12 * GIB, 16 * GIB)
    assert "stopped early" in measured.describe()


def test_the_tpu_runtimes_load_failure_names_its_program_whichever_type_carries_it():
    assert device_peak.failed_load(jax.errors.JaxRuntimeError(TPU_LOAD_FAILURE)) == "jit_f"
    assert device_peak.failed_load(CHIP_LOAD_FAILURE) == "jit_fwd_bwd"
    out_of_memory = "RESOURCE_EXHAUSTED: Out of memory allocating 281474976710656 bytes."
    assert device_peak.failed_load(jax.errors.JaxRuntimeError(out_of_memory)) == ""
    assert device_peak.failed_load(jax.errors.JaxRuntimeError("INTERNAL: a kernel faulted")) is None


@pytest.mark.parametrize(
    "error",
    [
        # the compiler's own: a program too large for the chip fits beside no filler
        jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory"
            " space hbm. Used 21.95G of 15.48G hbm."
        ),
        # Python's own errors, whatever their text: not the runtime's
        ValueError("too many values to unpack"),
        ValueError(f"a bad shape, near {TPU_LOAD_FAILURE}"),
        RuntimeError(TPU_LOAD_FAILURE),
    ],
    ids=["compiler", "python ValueError", "quoted in a ValueError", "python RuntimeError"],
)
def test_other_errors_are_no_load_failure(error):
    assert device_peak.failed_load(error) is None


def test_a_probe_counts_the_chips_value_error_as_a_load_that_did_not_fit():
    def fails_to_load():
        raise CHIP_LOAD_FAILURE

    probe = device_peak.probe(jax.local_devices()[:1], MIB, fails_to_load)
    assert probe == Probe(MIB, ran=False, program="jit_fwd_bwd")


def test_a_probe_and_the_bisection_let_pythons_own_value_error_through():
    def bug():
        raise ValueError("too many values to unpack")

    with pytest.raises(ValueError, match="unpack"):
        device_peak.probe(jax.local_devices()[:1], MIB, bug)

    def try_filler(filler):
        raise ValueError("too many values to unpack")

    with pytest.raises(ValueError, match="unpack"):
        device_peak.bisect(try_filler, 8 * GIB)


def test_a_runtime_error_as_a_value_error_ends_the_search_with_the_bracket_it_has():
    def try_filler(filler):
        if filler < 4 * GIB:
            raise ValueError("INTERNAL: the device was lost")
        return Probe(filler, ran=False, program="jit_update")

    probes, stopped = device_peak.bisect(try_filler, 8 * GIB)
    assert "raised INTERNAL: the device was lost" in stopped and len(probes) == 3


def test_a_probe_on_host_devices_tells_a_load_that_did_not_fit_from_a_filler_that_did_not():
    devices = jax.local_devices()[:2]

    def allocates(nbytes):
        return lambda: jnp.zeros((nbytes,), jnp.uint8).block_until_ready()

    assert device_peak.probe(devices, MIB, allocates(MIB)) == Probe(MIB, ran=True)
    too_much = 2**48  # 256 TiB: the host's allocator refuses it with RESOURCE_EXHAUSTED
    assert device_peak.probe(devices, MIB, allocates(too_much)) == Probe(MIB, False, "a program")
    assert device_peak.probe(devices, too_much, allocates(MIB)) == Probe(
        too_much, False, device_peak.FILLER
    )


def test_a_probe_lets_any_other_error_through():
    def faults():
        raise jax.errors.JaxRuntimeError("INTERNAL: a kernel faulted")

    with pytest.raises(jax.errors.JaxRuntimeError, match="faulted"):
        device_peak.probe(jax.local_devices()[:1], MIB, faults)


def test_host_cpu_devices_are_refused_in_one_line_naming_the_knob():
    with pytest.raises(ConfigError, match=r"MEASURE_PEAK=on .* cpu devices report none"):
        device_peak.device_memory(jax.devices("cpu"))


def test_run_refuses_it_on_the_host_cpu_before_compiling_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "rl_trainer_bench.cli", "run", "--measure-peak", "on"],
        capture_output=True,
        text=True,
        env={"RESULTS_DIR": str(results), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    assert done.returncode != 0
    error = done.stderr.strip().splitlines()[-1]
    assert "MEASURE_PEAK=on" in error and "set MEASURE_PEAK=off" in error
    assert "compiling" not in done.stdout
    assert not results.exists()


class LimitedDeviceEngine(StandInEngine):
    """The stand-in engine on a device with a memory limit, emulated: its `fwd_bwd` needs `need`
    bytes beside what is live on the first host device (the real filler arrays among them), and
    fails to load as the TPU runtime words it when they are not there."""

    def __init__(self, limit, need, load_failure):
        super().__init__()
        self.limit, self.need, self.load_failure = limit, need, load_failure

    def fwd_bwd(self, batch):
        if live_bytes_on_first_device() + self.need > self.limit:
            raise self.load_failure
        super().fwd_bwd(batch)


def live_bytes_on_first_device():
    first = jax.local_devices()[0]
    return sum(
        shard.data.nbytes
        for array in jax.live_arrays()
        for shard in array.addressable_shards
        if shard.device == first
    )


@pytest.mark.parametrize(
    ("stage", "load_failure"),
    [
        (OFF, jax.errors.JaxRuntimeError(TPU_LOAD_FAILURE.replace("jit_f", "jit_fwd_bwd"))),
        (BEFORE, jax.errors.JaxRuntimeError(TPU_LOAD_FAILURE.replace("jit_f", "jit_fwd_bwd"))),
        (OFF, CHIP_LOAD_FAILURE),
    ],
    ids=["stage off", "stage on", "the chip's ValueError"],
)
def test_the_driver_brackets_an_emulated_devices_step_through_its_own_loop(
    monkeypatch, stage, load_failure
):
    """At an eighth of the driver's resolution (8 MiB, not 64): each probe writes its filler on
    all 8 host devices, and the search is the same at any scale. Earlier tests' arrays are
    collected first: one freed during the search would move its bracket."""
    gc.collect()
    in_use, need = live_bytes_on_first_device(), 12 * MIB
    limit = in_use + 32 * MIB
    monkeypatch.setattr(
        device_peak,
        "device_memory",
        lambda devices: DeviceMemory(limit, live_bytes_on_first_device()),
    )
    monkeypatch.setattr(
        device_peak, "bisect", functools.partial(device_peak.bisect, resolution=RESOLUTION)
    )
    engine = LimitedDeviceEngine(limit, need, load_failure)
    config = BenchConfig(
        preset=PRESETS["cpu-tiny"], steps=2, micro_steps=2, distinct_micro_batches=3
    )
    bench = Bench(config, lambda line: None, engine_factory=lambda _: engine, pool=stand_in_pool(3))
    bench.setup()
    try:
        result = bench.run(steps=2, stage=stage)
        updates = engine.calls.count(("update",))
        measured = bench.measure_peak(stage, first_step=3)
    finally:
        bench.close()
    assert measured.stopped == "" and measured.failed_program == "jit_fwd_bwd"
    assert measured.peak_more_than < in_use + need <= measured.peak_at_most
    assert measured.peak_at_most - measured.peak_more_than <= RESOLUTION
    assert len(measured.probes) > 3  # a bisection, not the first guess
    assert len(result.records) == 3  # the probes are not the run's steps
    # the probes that ran were whole steps, update included
    assert engine.calls.count(("update",)) > updates


@pytest.mark.parametrize(
    "env",
    [
        {"JAX_PLATFORMS": "proxy,cpu", "JAX_BACKEND_TARGET": "grpc://proxy:29000"},
        {"JAX_COORDINATOR_ADDRESS": "host:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
    ],
    ids=["pathways", "two processes"],
)
def test_the_plan_refuses_it_where_a_probe_would_be_one_process_of_several(env):
    """The render's plan too: a pod's own runtime is known before it starts."""
    config = BenchConfig.from_env({"MEASURE_PEAK": "on", "PRESET": "qwen3.5-397b-cell"})
    with pytest.raises(ConfigError, match=r"MEASURE_PEAK=on measures a single process's devices"):
        bench_plan.resolve(config, env=env, rendering=True)
    bench_plan.resolve(config, env={}, rendering=True)  # one process: left to the devices' check


@pytest.mark.parametrize("driver", ["auto", "tunix"])
def test_the_plan_refuses_it_where_tunixs_worker_would_end_at_the_first_failed_probe(driver):
    """On the chip, MaxText's engine under Tunix's TrainerWorker stopped at the bisection's second
    probe: "TrainerWorker is not ready: ERROR" (reported as a bug of the bench then)."""
    env = {"MEASURE_PEAK": "on", "PRESET": "cpu-tiny-qwen3.5", "ENGINE": "maxtext"}
    config = BenchConfig.from_env({**env, "MAXTEXT_DRIVER": driver})
    with pytest.raises(ConfigError, match=rf"^MEASURE_PEAK=on with MAXTEXT_DRIVER={driver}: .*set"):
        bench_plan.resolve(config, env={})
    bench_plan.resolve(BenchConfig.from_env({**env, "MAXTEXT_DRIVER": "maxtext"}), env={})


@pytest.mark.parametrize(
    "load_failure",
    [
        jax.errors.JaxRuntimeError(TPU_LOAD_FAILURE.replace("jit_f", "jit_fwd_bwd")),
        CHIP_LOAD_FAILURE,
    ],
    ids=["JaxRuntimeError", "the chip's ValueError"],
)
def test_a_run_whose_program_does_not_load_is_refused_in_one_line_not_reported_as_a_bug(
    load_failure, capsys
):
    engine = LimitedDeviceEngine(limit=0, need=1, load_failure=load_failure)
    config = BenchConfig(preset=PRESETS["cpu-tiny"], steps=1, micro_steps=2)
    bench = Bench(config, lambda line: None, engine_factory=lambda _: engine, pool=stand_in_pool(3))
    bench.setup()
    try:
        code = run_guarded("rl-trainer-bench run", lambda: bench.run(steps=1, stage=OFF) and 0)
    finally:
        bench.close()
    assert code == EXIT_USER_ERROR
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("rl-trainer-bench run: jit_fwd_bwd did not fit in the device's memory")
    assert "Attempting to reserve" in line and "train_micro_batch_size" in line
    assert "--preset cpu-tiny --target local" in line and "bug" not in line


def test_a_run_lets_another_runtime_error_through_as_it_came():
    fault = jax.errors.JaxRuntimeError("INTERNAL: a kernel faulted")
    engine = LimitedDeviceEngine(limit=0, need=1, load_failure=fault)
    config = BenchConfig(preset=PRESETS["cpu-tiny"], steps=1, micro_steps=2)
    bench = Bench(config, lambda line: None, engine_factory=lambda _: engine, pool=stand_in_pool(3))
    bench.setup()
    try:
        with pytest.raises(jax.errors.JaxRuntimeError, match="faulted"):
            bench.run(steps=1, stage=OFF)
    finally:
        bench.close()


class CompilerRefusingEngine(StandInEngine):
    """The stand-in engine whose compile fails as XLA's does for a program too large."""

    def __init__(self, failure):
        super().__init__()
        self.failure = failure

    def compile(self, example):
        raise self.failure


# XLA's words for programs whose temporaries exceed the device (MaxText's engine at tpu-v5e-1's
# micro-batch on a v5e chip, 2026-12-06; the older libtpu's form, preflight/aot/compile.py)
TEMPORARIES_TOO_LARGE = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries"
    " (17.77G) exceeds available HBM (15.75G)."
)
HBM_EXCEEDED = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm."
    " Used 20.50G of 15.48G hbm. Exceeded hbm capacity by 5.02G."
)


def setup_exit_and_line(engine, capsys):
    config = BenchConfig(preset=PRESETS["cpu-tiny"], steps=1, micro_steps=2)
    bench = Bench(config, lambda line: None, engine_factory=lambda _: engine, pool=stand_in_pool(3))
    try:
        code = run_guarded("rl-trainer-bench run", lambda: bench.setup() and 0)
    finally:
        bench.close()
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("failure", "amount"),
    [
        (jax.errors.JaxRuntimeError(TEMPORARIES_TOO_LARGE), "(17.77G) exceeds available HBM"),
        (ValueError(HBM_EXCEEDED), "Used 20.50G of 15.48G hbm"),
        (jax.errors.JaxRuntimeError(TPU_LOAD_FAILURE), "jit_f did not fit"),
    ],
    ids=["temporaries", "hbm used", "a load inside the compile"],
)
def test_a_compile_too_large_for_the_device_is_refused_in_one_line_not_reported_as_a_bug(
    failure, amount, capsys
):
    code, lines = setup_exit_and_line(CompilerRefusingEngine(failure), capsys)
    assert code == EXIT_USER_ERROR
    (line,) = lines
    assert line.startswith("rl-trainer-bench run: ") and "in the device's memory" in line
    assert amount in line and "train_micro_batch_size" in line and "bug" not in line


def test_a_kernel_an_engine_key_sizes_too_large_for_the_core_is_refused_naming_the_key(capsys):
    """What libtpu 0.0.42.1 printed compiling tpu-v5e-1 with linear_chunk_kernel_heads=16 for a
    v5e: the user's key, not the micro-batch, and not a bug."""
    vmem = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for"
        " %gated_delta_rule_backward.10 = (f32[5,4096,2048]{2,1,0:T(8,128)}) custom-call(%g)"
    )
    code, lines = setup_exit_and_line(CompilerRefusingEngine(vmem), capsys)
    assert code == EXIT_USER_ERROR
    (line,) = lines
    assert line.startswith("rl-trainer-bench run: the Pallas kernel gated_delta_rule_backward")
    assert "set fewer value heads a program (linear_chunk_kernel_heads in --engine-flags)" in line
    assert "train_micro_batch_size" not in line and "bug" not in line


def test_a_kernels_tiles_too_large_for_the_core_are_not_the_cells_size(capsys):
    vmem = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack"
    )
    code, lines = setup_exit_and_line(CompilerRefusingEngine(vmem), capsys)
    assert code != EXIT_USER_ERROR and "train_micro_batch_size" not in lines[-1]
