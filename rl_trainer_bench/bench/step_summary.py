"""The table a run ends with: median, min, max and spread of each figure over the scored steps."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from rl_trainer_bench.bench.ruler import StepRecord
from rl_trainer_bench.bench.step_line import LOG_PREFIX

# (label, how to read the figure from a record); rows without a value in any scored step are left out.
_SUMMARY_ROWS: tuple[tuple[str, Any], ...] = (
    ("step_s", lambda r: r.step_s),
    ("fwd_bwd dispatch_s (mean)", lambda r: _mean(r.fwd_bwd_dispatch_s)),
    ("fwd_bwd device_s (mean)", lambda r: _mean(r.fwd_bwd_device_s)),
    ("first_call_extra_s", lambda r: r.first_call_extra_s),
    ("update_s", lambda r: r.update_s),
    ("drain_s", lambda r: r.drain_s),
    ("stage_s", lambda r: r.stage_s),
    ("device_wait_s", lambda r: r.device_wait_s),
    ("boundary_idle_s", lambda r: r.boundary_idle_s),
    ("stage_hidden", lambda r: r.stage_hidden),
    ("tokens/s/device", lambda r: r.tokens_per_s_per_device),
    ("TFLOP/s/device", lambda r: r.tflops_per_device),
    ("MFU", lambda r: r.mfu),
)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summary(records: Sequence[StepRecord]) -> str:
    """A table of the scored steps: median, min, max and spread ((max - min) / median) per figure."""
    scored = [r for r in records if not r.warmup]
    lines = [
        f"{LOG_PREFIX} summary over {len(scored)} scored steps"
        + (f" (arm {scored[0].arm})" if scored and scored[0].arm else ""),
        f"{'figure':<28}{'median':>14}{'min':>14}{'max':>14}{'spread':>10}",
    ]
    for label, read in _SUMMARY_ROWS:
        values = [v for v in (read(r) for r in scored) if v is not None and math.isfinite(v)]
        if not values:
            continue
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median if median else 0.0
        lines.append(
            f"{label:<28}{median:>14.6g}{min(values):>14.6g}{max(values):>14.6g}{spread:>9.1%}"
        )
    return "\n".join(lines)
