"""The host-to-device link, measured where the bench runs: the rate and the fixed cost of a copy.

The boundary's prediction (`boundary_copy.py`) needs the link's rate and each array's fixed cost.
A plan made before launch can only assume them; the run measures them after its compile, off the
clock, with the micro-batch's own arrays: each array's bytes, split evenly over every device of
the mesh as the engines split a micro-batch, copied from host memory and waited for. Two copies
tell the two figures apart: the whole micro-batch's arrays, and as many arrays of one byte a
device, which cost the fixed part alone. Under Pathways the copy goes through the proxy, exactly
as the pod's micro-batches do; with a process per host each process copies its own devices'
shares, so the bytes counted are the ones this process sent.

A copy is timed only after a first one of the same arrays (an unwarmed copy pays for allocating
its buffers), and the median of up to REPEATS is kept, fewer when a copy is slow (a production
micro-batch through a proxy can take seconds: the measurement stops once it has spent BUDGET_S).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import jax
import numpy as np

from rl_trainer_bench.bench.boundary_copy import MEASURED, HostLink
from rl_trainer_bench.engine.contract import Payload

REPEATS = 5  # timed copies of each kind, at most
BUDGET_S = 5.0  # past this, no further timed copy of the whole micro-batch starts


def measure(payload: Payload, devices: Sequence[jax.Device]) -> tuple[HostLink, float, int]:
    """The link to `devices` as `payload`'s copy crosses it: (the link, the median seconds of
    the whole micro-batch's copy, the bytes this process sent in it)."""
    mesh = jax.sharding.Mesh(np.asarray(devices), ("devices",))
    spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
    count = len(devices)
    whole = [_split(array, count) for array in payload.arrays().values()]
    fixed = [np.zeros((count, 1), np.uint8) for _ in whole]
    whole_s = _median_copy(whole, spread, BUDGET_S)
    fixed_s = _median_copy(fixed, spread, BUDGET_S)
    sent = _sent_bytes(whole, spread)
    per_transfer = fixed_s / len(whole)
    rate = sent / (whole_s - fixed_s) if whole_s > fixed_s else float("inf")
    source = (
        f"{len(whole)} arrays, {sent:,} B from this process to {count} device(s), the median of"
        " timed copies after a first"
    )
    return HostLink(rate, per_transfer, MEASURED, source), whole_s, sent


def _split(array: np.ndarray, count: int) -> np.ndarray:
    """`array`'s bytes as `count` equal rows, one a device (the last padded to a whole row)."""
    flat = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    row = -(-flat.size // count)
    padded = np.zeros(row * count, np.uint8)
    padded[: flat.size] = flat
    return padded.reshape(count, row)


def _sent_bytes(arrays: list[np.ndarray], sharding: jax.sharding.Sharding) -> int:
    """The bytes of `arrays` this process's devices receive under `sharding`."""
    total = 0
    for array in arrays:
        for index in sharding.addressable_devices_indices_map(array.shape).values():
            total += array[index].nbytes
    return total


def _median_copy(arrays: list[np.ndarray], sharding: jax.sharding.Sharding, budget: float) -> float:
    """The median seconds of copying `arrays` onto `sharding` and waiting for them, after a
    first copy; up to REPEATS timed copies, none started past `budget` seconds."""
    jax.block_until_ready(jax.device_put(arrays, sharding))
    started, times = time.perf_counter(), []
    while len(times) < REPEATS and (not times or time.perf_counter() - started < budget):
        start = time.perf_counter()
        copies = jax.device_put(arrays, sharding)
        jax.block_until_ready(copies)
        times.append(time.perf_counter() - start)
        del copies
    return statistics.median(times)
