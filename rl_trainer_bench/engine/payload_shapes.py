"""One micro-batch's arrays as shapes and dtypes, from the engine config alone: the one place
that says which arrays an engine's micro-batch holds.

The programs are lowered for these shapes (`abstract_inputs`), the plan sizes the pool, a
device's share and the boundary's copy from them (`bench/micro_batch_memory.py`,
`bench/boundary_copy.py`), and `check` holds a built micro-batch to them, so the four cannot
disagree; none of it needs JAX.

`extra_host_bytes` adds an array of filler bytes to every micro-batch: `k` bytes a token, the
fewest that hold the bytes asked for (so B x T x k, a multiple of the micro-batch's token count,
at least the request). It is sharded like the token arrays, so each device receives its rows'
share and each host its devices', and the copy at the step boundary grows as a production
micro-batch's would: the one-chip bench can carry a micro-batch of a production host's size
without training on more tokens.
"""

from __future__ import annotations

import numpy as np

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import PAYLOAD_FIELDS


def extra_bytes_per_token(config: EngineConfig) -> int:
    """k: the filler bytes a token carries for `extra_host_bytes` (0 without it)."""
    tokens = config.micro_batch_rows * config.seq_len
    return -(-config.extra_host_bytes // tokens) if config.extra_host_bytes > 0 else 0


def payload_shapes(config: EngineConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of one micro-batch as the engine's programs take it: name -> (shape, dtype)."""
    b, t = config.micro_batch_rows, config.seq_len
    shapes = {
        name: ((b, t), dtype)
        for name, (dtype, rank) in PAYLOAD_FIELDS.items()
        if rank == 2 and name != "ref_logps"
    }
    if config.loss.beta > 0:
        shapes["ref_logps"] = ((b, t), PAYLOAD_FIELDS["ref_logps"][0])
    if config.moe.router_replay:
        routes = (b, t, config.model.num_layers, config.model.top_k)
        shapes["routed_experts"] = (routes, PAYLOAD_FIELDS["routed_experts"][0])
    per_token = extra_bytes_per_token(config)
    if per_token:
        shapes["extra_host_bytes"] = ((b, t, per_token), PAYLOAD_FIELDS["extra_host_bytes"][0])
    return shapes


def array_bytes(config: EngineConfig) -> dict[str, int]:
    """Host bytes of each array of one micro-batch, by name."""
    return {
        name: int(np.prod(shape)) * dtype.itemsize
        for name, (shape, dtype) in payload_shapes(config).items()
    }
