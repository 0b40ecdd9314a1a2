"""Will the micro-batches fit? Their bytes from the shapes alone, against the host and the device.

A sequence length of 10^11 tokens is a valid integer, plans fine and then dies in the payload
builder with a MemoryError minutes later (or kills the pod). The plan refuses it first: each
micro-batch's bytes follow from its arrays' shapes and dtypes (`engine/payload_shapes.py`), the pool
of DISTINCT_MICRO_BATCHES of them is built on the host, and each device holds its share of one
(rows split over fsdp x expert, the sequence over context). Both are compared with what there is:
the host's memory (its RAM, or a smaller container limit) where the plan runs on the host that
will build the pool, and the memory of the TRAINER_SLICE's chip from the chip table. These are
necessary conditions, not a fit: `aot` checks the programs' memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from rl_trainer_bench.chips.accelerators import TpuSlice
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.payload_shapes import array_bytes
from rl_trainer_bench.errors import ConfigError
from rl_trainer_bench.units import human_bytes

CGROUP_MEMORY_LIMIT = Path("/sys/fs/cgroup/memory.max")
SHORTER_POOL = (
    "shorten max_prompt_length/max_response_length, lower train_micro_batch_size or"
    " DISTINCT_MICRO_BATCHES"
)
SHORTER_MICRO_BATCH = "shorten the sequence or lower train_micro_batch_size"


def micro_batch_bytes(engine: EngineConfig) -> int:
    """Host bytes of one micro-batch as the payload builder makes it for `engine`."""
    return sum(array_bytes(engine).values())


def host_memory_bytes() -> int | None:
    """This host's memory for a process: physical RAM, or the container's limit when smaller."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    try:
        limit = CGROUP_MEMORY_LIMIT.read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def refuse_oversized(
    engine: EngineConfig,
    pool_size: int,
    host_bytes: int | None,
    tpu_slice: TpuSlice | None,
) -> None:
    """ConfigError, with the numbers, when the pool cannot fit the host (`host_bytes`, None: not
    checked) or one micro-batch's share cannot fit a device of `tpu_slice` (None: not checked)."""
    each = micro_batch_bytes(engine)
    shape = f"{engine.micro_batch_rows} rows of {engine.seq_len:,} tokens"
    pool = each * pool_size
    if host_bytes is not None and pool > host_bytes:
        raise ConfigError(
            f"the micro-batch pool needs {human_bytes(pool)} of host memory ({pool_size} x"
            f" {human_bytes(each)}: {shape}) and this host has {human_bytes(host_bytes)}:"
            f" {_remedy(engine, SHORTER_POOL)}"
        )
    if tpu_slice is not None:
        share = -(-each // engine.mesh.size)
        chip = tpu_slice.chip
        device_bytes = chip.device_memory_bytes
        if share > device_bytes:
            raise ConfigError(
                f"one micro-batch ({shape}, {human_bytes(each)}) puts {human_bytes(share)} on"
                f" each of {engine.mesh.size} devices and a {chip.name} device has"
                f" {human_bytes(device_bytes)}: {_remedy(engine, SHORTER_MICRO_BATCH)}"
            )


def _remedy(engine: EngineConfig, otherwise: str) -> str:
    """What to change: the engine key extra_host_bytes where its filler is most of a micro-batch
    (a user who asked for a production host's bytes asked for too many), else `otherwise`."""
    sizes = array_bytes(engine)
    if 2 * sizes.get("extra_host_bytes", 0) > sum(sizes.values()):
        return (
            f"lower the engine key extra_host_bytes (ENGINE_FLAGS; {engine.extra_host_bytes:,}"
            " filler bytes a micro-batch)"
        )
    return otherwise
