"""Step ruler: one record per trainer step, as a log line and as JSON.

The log line is what people read in a pod's log, so it is short and stable; the JSON line is what
tools read, so it carries every figure. `parse` turns the log lines back into records, because two
pods' logs are often all a user has to compare.
"""

from __future__ import annotations

import dataclasses
from typing import Any

LOG_PREFIX = "[TrainerBench]"


@dataclasses.dataclass
class StepRecord:
    """Everything measured about one step. Times are seconds; `None` means not measured/not known."""

    step: int
    warmup: bool  # reported, never scored
    step_s: float  # from the step's first dispatch to its drain (metrics read) on the host
    fwd_bwd_dispatch_s: list[float]  # per micro-batch: host seconds inside worker.fwd_bwd
    first_call_extra_s: float  # first fwd_bwd's device time over the median regular one
    update_s: float  # host seconds inside worker.update
    drain_s: float  # host seconds waiting for the step's results after update returned
    stage_s: float  # host seconds inside prepare_fwd_bwd_input (0 when not staged)
    device_wait_s: float  # seconds wait_for_device blocked (0 when not staged)
    tokens: int  # real (non-padding) tokens trained this step
    tokens_per_s_per_device: float
    tflops_per_device: float | None
    mfu: float | None  # achieved / peak, where the chip's peak is known
    loss: float
    grad_norm: float
    loss_denominator: float  # completion tokens summed over the step's micro-batches
    overflow_count: int
    replay_count: int
    micro_batches: list[str]  # names, in the order trained (bench_<step>_<index>)
    digests: list[str]  # one content digest per micro-batch, same order
    device_ready_s: list[float]  # per fwd_bwd: when its result was ready, from the step's start
    update_ready_s: float | None  # when the update's result was ready, from the step's start
    boundary_idle_s: (
        float | None
    )  # device idle from the previous update ready to this step's first work
    staged: str | None = None  # name of the micro-batch staged at this step's boundary
    stage_hidden: float | None = None  # fraction of the stage's copy that overlapped device work
    recompiles: int = 0
    arm: str = ""  # A/B arm label; empty outside an A/B

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
