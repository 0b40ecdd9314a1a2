"""The bench's micro-batch as MaxText's engine takes it: Tunix's payload, then MaxText's loss inputs.

Shared by the adapter, which converts real micro-batches (masks: the adapter's docstring), and by
the AOT path (`maxtext.aot`), which needs the same mapping as shapes only: a 397B micro-batch's
routes alone are 5 GB, so the abstract one is built from zero-stride arrays and mapped under
`jax.eval_shape`, allocating nothing of that size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.engine.contract import Payload
from rl_trainer_bench.engine.maxtext import metrics as maxtext_metrics
from rl_trainer_bench.engine.maxtext.tunix_grpo import token_aligned


def replay_payload_type(payload_type: type) -> type:
    """`payload_type` with a `routed_experts` field, which Tunix's payload lacks but MaxText reads.

    MaxText reads `routed_experts` off the payload by attribute, and rebuilds the payload with
    `dataclasses.replace` before reading it; a field (not a set attribute) survives that.
    """
    if "routed_experts" in {f.name for f in dataclasses.fields(payload_type)}:
        return payload_type
    return dataclasses.make_dataclass(
        f"Replay{payload_type.__name__}",
        [("routed_experts", Any, dataclasses.field(default=None))],
        bases=(payload_type,),
        kw_only=True,
    )


def to_maxtext_payload(payload: Payload, payload_type: type) -> Any:
    """The bench's micro-batch as MaxText's packed RLTrainerPayload (module docstring: masks)."""
    rows = payload.shape[0]
    mask = token_aligned(payload.completion_mask)
    empty = np.zeros((rows, 0), np.int32)
    return payload_type(
        token_ids=payload.input_ids,
        token_mask=(payload.segment_ids != 0).astype(np.int32),
        segment_ids=payload.segment_ids,
        segment_positions=payload.positions,
        advantages=payload.advantages,
        loss_mask=payload.completion_mask,
        prompt_ids=empty,
        prompt_mask=empty,
        completion_ids=payload.input_ids,
        completion_mask=mask,
        old_per_token_logps=payload.old_logps,
        ref_per_token_logps=payload.ref_logps,
        routed_experts=payload.routed_experts,
    )


def abstract_payload(spec: Mapping[str, jax.ShapeDtypeStruct]) -> Payload:
    """A Payload of `spec`'s shapes whose arrays are one broadcast zero each (no memory)."""
    arrays = {name: np.broadcast_to(np.zeros((), s.dtype), s.shape) for name, s in spec.items()}
    return Payload(**arrays, name="abstract")


def abstract_model_input(
    spec: Mapping[str, jax.ShapeDtypeStruct],
    payload_type: type,
    gen_model_input_fn: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """MaxText's loss inputs for a micro-batch of `spec`, as ShapeDtypeStructs: the adapter's
    conversion, then MaxText's input mapping traced on shapes."""
    payload = to_maxtext_payload(abstract_payload(spec), payload_type)
    arrays = {
        f.name: jax.ShapeDtypeStruct(value.shape, value.dtype)
        for f in dataclasses.fields(payload)
        if isinstance(value := getattr(payload, f.name), np.ndarray)
    }
    return jax.eval_shape(
        lambda traced: gen_model_input_fn(dataclasses.replace(payload, **traced)), arrays
    )


def with_router_replay(engine: Any, api: Any, maxtext_config: Any, input_fn: Callable) -> Any:
    """`engine` (a MaxText training engine) with MaxText's router-replay loss and `input_fn` as
    its input hook, as the adapter runs it.

    MaxText records a loss's aux entries (its overflow flags among them) only with has_aux; they
    are eager appends per micro-batch, so only when there is a drop to count.
    """
    counted = maxtext_metrics.overflow_source(maxtext_config.moe_dropless_fallback) is not None
    return engine.with_loss_fn(
        api.make_loss_fn(maxtext_config), has_aux=counted
    ).with_gen_model_input_fn(input_fn)
