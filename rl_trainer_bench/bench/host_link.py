"""The host-to-device link, measured where the bench runs: the rate and the fixed cost of a copy.

The boundary's prediction (`boundary_copy.py`) needs the link's rate and each array's fixed cost.
A plan made before launch can only assume them; the run measures them after its compile, off the
clock, with the micro-batch itself: its arrays, in their own shapes and dtypes (a TPU lays an
array out by its shape, so a copy's time depends on it, not only on its bytes), copied by the
engine's own copy of an unstaged input (`copy_input`) where the engine has one, so the figure is
the copy the engine makes (the built-in engine's goes in pieces where that is faster), else put on
the mesh's devices as a plain engine's input goes, rows over (fsdp, expert) and tokens over
context. That is the copy the first `fwd_bwd` after an unstaged boundary waits for. As many arrays of one element a device cost the fixed part alone, so
the two figures come apart (`fit`). Under Pathways the copy goes through the proxy, exactly as the
pod's micro-batches do; with a process per host each process copies its own devices' shares, so
the bytes counted are the ones this process sent.

A copy is timed only after a first one of the same arrays (an unwarmed copy pays for allocating
its buffers), and the median of up to REPEATS is kept, fewer when a copy is slow (a production
micro-batch through a proxy can take seconds: the measurement stops once it has spent BUDGET_S).
How much of a staged copy the device's work hid, and what staging cost a step, are the steps' to
measure: the ruler's `stage_s`, `device_wait_s`, `hidden` and `stage_exposed_s`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding

from rl_trainer_bench.bench.boundary_copy import MEASURED, HostLink
from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import Engine, Payload, optional

REPEATS = 5  # timed copies of each kind, at most
BUDGET_S = 5.0  # past this, no further timed copy of the whole micro-batch starts


def measure(payload: Payload, mesh: MeshConfig, engine: Engine) -> tuple[HostLink, float, int]:
    """The link to the mesh's devices as `payload`'s copy crosses it, by `engine`'s own copy
    where it has one: (the link, the median seconds of the whole micro-batch's copy, the bytes
    this process sent in it)."""
    devices = sharding.make_mesh(mesh, jax.devices()[: mesh.size])  # an engine's: the first ones
    whole = payload.arrays()
    spread = {name: sharding.payload_sharding(devices, a.ndim) for name, a in whole.items()}
    fixed = {name: np.zeros((mesh.row_groups, mesh.context), np.uint8) for name in whole}
    tiny = {name: sharding.payload_sharding(devices, 2) for name in whole}
    copy_input = optional(engine, "copy_input")
    if copy_input is None:
        how = "put as a plain engine's unstaged input goes"
        whole_s = _median_seconds(lambda: jax.device_put(whole, spread), BUDGET_S)
    else:
        how = f"by {type(engine).__name__}'s own copy of an unstaged input"
        whole_s = _median_seconds(lambda: copy_input(payload), BUDGET_S)
    fixed_s = _median_seconds(lambda: jax.device_put(fixed, tiny), BUDGET_S)
    sent = _sent_bytes(whole, spread)
    source = (
        f"{len(whole)} arrays, {sent:,} B from this process to {mesh.size} device(s) {how},"
        " the median of timed copies after a first"
    )
    return fit(whole_s, fixed_s, len(whole), sent, source), whole_s, sent


def fit(whole_s: float, fixed_s: float, arrays: int, sent: int, source: str) -> HostLink:
    """The link from two timed copies of `arrays` arrays: the micro-batch's (`sent` bytes in
    `whole_s` seconds) and as many one-element arrays' (`fixed_s`, the fixed costs alone). Each
    array's fixed cost is its share of `fixed_s`; the rate is the bytes over the time left when
    the fixed costs are taken out (infinite where nothing is left)."""
    rate = sent / (whole_s - fixed_s) if whole_s > fixed_s else float("inf")
    return HostLink(rate, fixed_s / arrays, MEASURED, source)


def _sent_bytes(arrays: dict[str, np.ndarray], shardings: dict[str, NamedSharding]) -> int:
    """The bytes of `arrays` this process's devices receive under `shardings`."""
    total = 0
    for name, array in arrays.items():
        for index in shardings[name].addressable_devices_indices_map(array.shape).values():
            total += array[index].nbytes
    return total


def _median_seconds(copy: Callable[[], object], budget: float) -> float:
    """The median seconds of `copy()` waited for, after a first one; up to REPEATS timed copies,
    none started past `budget` seconds."""
    jax.block_until_ready(copy())
    started, times = time.perf_counter(), []
    while len(times) < REPEATS and (not times or time.perf_counter() - started < budget):
        start = time.perf_counter()
        jax.block_until_ready(copy())
        times.append(time.perf_counter() - start)
    return statistics.median(times)
