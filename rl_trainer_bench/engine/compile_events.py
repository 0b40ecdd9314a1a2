"""JAX's compile events, and a scope that listens to them.

Both the driver (which names every program compiled inside a scored step, so a recompile fails the
run) and the MaxText adapter (which times MaxText's compiles, since its `compile` returns None)
read the durations JAX reports through `jax.monitoring`; this is where the event names and the
register/unregister pair live.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import jax

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
ALL = (TRACE, LOWER, BACKEND_COMPILE)  # tracing, lowering and compiling one program


@contextlib.contextmanager
def listening(listener: Callable[..., None]) -> Iterator[None]:
    """`listener(event, seconds, **kwargs)` gets every duration event JAX reports inside the block."""
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
