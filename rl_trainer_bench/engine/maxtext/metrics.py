"""MaxText's metrics buffer as the ruler's step metrics: what MaxText measured, None where it did not.

MaxText's training engine records, per micro-batch, the loss as a `WeightedMetric` and every entry
of the loss's aux dict as a scalar (appended along the step), and per update `gradient_norm` and
`learning_rate`. Of the bench's MoE counters it measures only drops, and only where its config
asks (maxtext 0.2.5, `maxtext/trainers/pre_train/train.py`, `loss_fn`):

- `moe_dropless_fallback=step`: `has_moe_overflow`, one flag per micro-batch, true when a layer's
  ragged buffer would have dropped tokens. The training engine does not act on it (the step
  replay lives in MaxText's pre-training loop), so drops are counted, replays are not.
- `moe_dropless_fallback=layer`: `moe_dropless_fallback_layers`, per micro-batch the layers that
  overflowed and re-ran their tokens dropless in place: a micro-batch with any counts as one
  overflow; no micro-batch is re-run, so there is no replay count either.
- otherwise (no fallback, the default): MaxText reports no drop at all (its `has_moe_overflow`
  aux entry is a constant false then), so `overflow_count` is None.

`replay_count` and `mult_prob_error_max` (the replayed routes' probability error) are never
measured by MaxText's engine: None. None reaches the step record as "-", never as 0.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

OVERFLOW_FLAGS = {"step": "has_moe_overflow", "layer": "moe_dropless_fallback_layers"}
NEVER_MEASURED = ("replay_count", "mult_prob_error_max")


def overflow_source(dropless_fallback: Any) -> str | None:
    """The metric MaxText counts drops in under `moe_dropless_fallback`, or None (not measured)."""
    return OVERFLOW_FLAGS.get(str(dropless_fallback).lower())


def not_measured(dropless_fallback: Any) -> tuple[str, ...]:
    """The ruler's MoE counters MaxText does not measure under this `moe_dropless_fallback`."""
    if overflow_source(dropless_fallback) is None:
        return ("overflow_count", *NEVER_MEASURED)
    return NEVER_MEASURED


def step_metrics(buffer: Any, tokens: int, dropless_fallback: Any) -> dict[str, Any]:
    """The step's metrics from MaxText's `MetricsBuffer` ({} when it holds no loss yet).

    `loss` = sum of the step's unreduced losses / sum of their denominators (what the update
    divides by), `grad_norm` = `gradient_norm`, `loss_denominator` = the summed denominators,
    `tokens` = real tokens fed (counted by the adapter).
    """
    loss = buffer.weighted_metrics.get("loss")
    if loss is None:
        return {}
    total, denominator, scalars = jax.device_get(
        (loss.unreduced_sum, loss.denominator, dict(buffer.scalar_metrics))
    )
    loss_denominator = float(np.sum(denominator))
    out: dict[str, Any] = {
        "loss": float(np.sum(total)) / max(loss_denominator, 1.0),
        "grad_norm": _last(scalars["gradient_norm"]),
        "loss_denominator": loss_denominator,
        "tokens": tokens,
        "train_step": int(buffer.id) + 1,
        **dict.fromkeys(not_measured(dropless_fallback)),
    }
    source = overflow_source(dropless_fallback)
    if source is not None:
        out["overflow_count"] = int(np.count_nonzero(np.asarray(scalars[source]) > 0))
    if "learning_rate" in scalars:
        out["learning_rate"] = _last(scalars["learning_rate"])
    return out


def _last(values: Any) -> float:
    return float(np.asarray(values).reshape(-1)[-1])
