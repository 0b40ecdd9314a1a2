"""MEASURE_PEAK=on: the device memory one step needs, found by what still runs beside a filler.

A device's own figures do not give it: the TPU runtime reserves a program's temporaries when it
loads the program, and `memory_stats()['peak_bytes_in_use']` never counts them (docs/run.md,
"The measured peak"). What a device answers truly is whether a step runs. So after its scored steps
the run holds a filler allocation of F bytes on each of its devices and runs one more step of its
own setting, and bisects F: the largest F under which the step ran and the smallest under which it
did not bracket the step's peak, limit - F, and both ends are measured. A step that fails to load
raises RESOURCE_EXHAUSTED, naming the program that did not fit: that is "does not fit beside this
filler", whichever Python type carries it. JAX raises the runtime's errors as JaxRuntimeError (the
XlaRuntimeError of older names), but on a v5e chip (JAX 0.10.2, libtpu) a program's failed load
reached the driver as a ValueError with the runtime's own text: "RESOURCE_EXHAUSTED: ... Error
loading program 'jit_fwd_bwd': Attempting to reserve 6.02G at the bottom of memory ...". So an
error is the runtime's by what it says (a message that opens with a status code, as every runtime
error's does), and a load that does not fit is one opening with RESOURCE_EXHAUSTED that is not the
compiler's (a program that cannot compile at all fits beside no filler); any other runtime error
stops the search with the bracket it has, and anything else propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rl_trainer_bench.errors import ConfigError
from rl_trainer_bench.units import human_bytes

# The bracket's width at which the search stops: a few probe steps for a 16 GiB device
RESOLUTION = 64 * 1024**2
# "Error loading program 'jit_f': Attempting to reserve 4.00G at the bottom of memory"
_PROGRAM = re.compile(r"program '([^']+)'")
# What a probe that could not even place its filler reports as the program
FILLER = "(the filler itself)"
# The Python types the runtime's errors arrive as (module docstring)
RUNTIME_ERRORS = (jax.errors.JaxRuntimeError, ValueError)
# absl's status codes, which open every runtime error's message ("RESOURCE_EXHAUSTED: ...")
_STATUS = re.compile(
    r"(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS"
    r"|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE"
    r"|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED): "
)
# XLA's own out-of-memory while compiling ("XLA:TPU compile permanent error. Ran out of memory")
_COMPILER = re.compile(r"\bcompile\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One step beside a filler of `filler` bytes per device: whether it ran, and if not, the
    program that did not fit (`FILLER` when the filler itself did not)."""

    filler: int
    ran: bool
    program: str = ""


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Per device, the smallest memory limit and the most bytes in use among the run's devices."""

    limit: int
    in_use: int

    @property
    def free(self) -> int:
        return self.limit - self.in_use


@dataclasses.dataclass(frozen=True)
class PeakMeasurement:
    """The bracket the probes found: the step ran beside `ran_beside` bytes of filler and did not
    beside `failed_beside` (None: it ran beside every filler tried, up to the free memory)."""

    memory: DeviceMemory
    probes: tuple[Probe, ...]
    stopped: str = ""  # why the search ended before its resolution ("" when it did not)

    @property
    def ran_beside(self) -> int:
        return max(p.filler for p in self.probes if p.ran)

    @property
    def failed_beside(self) -> int | None:
        failed = [p.filler for p in self.probes if not p.ran]
        return min(failed) if failed else None

    @property
    def peak_at_most(self) -> int:
        """The step ran in this much of a device's memory (limit minus the filler beside it)."""
        return self.memory.limit - self.ran_beside

    @property
    def peak_more_than(self) -> int | None:
        """The step did not run in this much (None: no probe failed)."""
        failed = self.failed_beside
        return None if failed is None else self.memory.limit - failed

    @property
    def failed_program(self) -> str:
        failed = self.failed_beside
        return next((p.program for p in self.probes if p.filler == failed and not p.ran), "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "limit": self.memory.limit,
            "in_use_before": self.memory.in_use,
            "peak_at_most": self.peak_at_most,
            "peak_more_than": self.peak_more_than,
            "failed_program": self.failed_program or None,
            "stopped": self.stopped or None,
            "probes": [dataclasses.asdict(p) for p in self.probes],
        }

    def describe(self) -> str:
        """One line: the bracket, what did not fit, and what the search measured."""
        if self.peak_more_than is None:
            bracket = (
                f"at most {human_bytes(self.peak_at_most)}: it ran beside every filler up to the"
                f" free {human_bytes(self.memory.free)}"
            )
        else:
            bracket = (
                f"more than {human_bytes(self.peak_more_than)} and at most"
                f" {human_bytes(self.peak_at_most)} ({self.failed_program} did not load beside"
                f" {human_bytes(self.failed_beside or 0)} of filler)"
            )
        stopped = f"; stopped early: {self.stopped}" if self.stopped else ""
        return (
            f"device peak of one step, MEASURED by {len(self.probes)} probe steps beside a filler:"
            f" {bracket}, of a {human_bytes(self.memory.limit)} limit per device{stopped}"
        )


def device_memory(devices: Sequence[Any]) -> DeviceMemory:
    """The devices' limit and use; ConfigError when they report no limit (the host CPU's)."""
    stats = [device.memory_stats() for device in devices]
    if not stats or any(not s or "bytes_limit" not in s for s in stats):
        raise ConfigError(
            f"MEASURE_PEAK=on measures a device's memory limit, and this run's"
            f" {devices[0].platform if devices else 'no'} devices report none (memory_stats):"
            " run it on an accelerator, or set MEASURE_PEAK=off"
        )
    return DeviceMemory(
        limit=min(int(s["bytes_limit"]) for s in stats),
        in_use=max(int(s.get("bytes_in_use", 0)) for s in stats),
    )


def runtime_status(error: BaseException) -> str | None:
    """The status code a runtime error opens with (RUNTIME_ERRORS' types only); None for any
    other error, a ValueError of Python's own among them."""
    if not isinstance(error, RUNTIME_ERRORS):
        return None
    match = _STATUS.match(str(error).lstrip())
    return match.group(1) if match else None


def failed_load(error: BaseException) -> str | None:
    """The program a runtime error says did not fit in the device's memory when loaded or
    allocated ('' when it names none); None for any other error, the compiler's own
    RESOURCE_EXHAUSTED among them."""
    text = str(error)
    if runtime_status(error) != "RESOURCE_EXHAUSTED" or _COMPILER.search(text):
        return None
    match = _PROGRAM.search(text)
    return match.group(1) if match else ""


@contextlib.contextmanager
def filler(devices: Sequence[Any], nbytes: int) -> Iterator[None]:
    """`nbytes` held on each device for the block, created on the device (no host copy)."""
    held = [
        jax.jit(
            functools.partial(jnp.zeros, (nbytes,), jnp.uint8),
            out_shardings=jax.sharding.SingleDeviceSharding(device),
        )()
        for device in devices
    ]
    jax.block_until_ready(held)
    try:
        yield
    finally:
        for array in held:
            array.delete()


def probe(devices: Sequence[Any], nbytes: int, step: Callable[[], None]) -> Probe:
    """Run `step` beside `nbytes` of filler per device; a load that does not fit (`failed_load`)
    is a Probe that did not run, any other error propagates."""
    try:
        with filler(devices, nbytes):
            try:
                step()
            except RUNTIME_ERRORS as error:
                program = failed_load(error)
                if program is None:
                    raise
                return Probe(nbytes, ran=False, program=program or "a program")
    except RUNTIME_ERRORS as error:
        if failed_load(error) is None:
            raise
        return Probe(nbytes, ran=False, program=FILLER)
    return Probe(nbytes, ran=True)


def bisect(
    try_filler: Callable[[int], Probe], free: int, resolution: int = RESOLUTION
) -> tuple[list[Probe], str]:
    """Probes from the whole free memory down, halving the bracket to `resolution`: (probes, why
    the search stopped early or ''). The step is known to run beside no filler (the scored steps
    ran), so that end needs no probe; a runtime error other than a load that does not fit
    (`runtime_status`) ends the search, anything else propagates.
    """
    probes = [Probe(0, ran=True)]
    low, high = 0, free
    while True:
        filler_bytes = high if len(probes) == 1 else (low + high) // 2
        try:
            result = try_filler(filler_bytes)
        except RUNTIME_ERRORS as error:
            if runtime_status(error) is None:
                raise
            first = str(error).strip().splitlines()[0][:200]
            return probes, f"a probe step beside {human_bytes(filler_bytes)} raised {first}"
        probes.append(result)
        if result.ran:
            low = filler_bytes
        else:
            high = filler_bytes
        if high - low <= resolution:
            return probes, ""
