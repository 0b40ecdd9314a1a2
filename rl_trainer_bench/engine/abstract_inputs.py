"""What a program is lowered for without building an engine: one micro-batch's shapes and the
platform of the mesh.

Both the built-in engine's programs (`programs`) and MaxText's AOT path (`maxtext.aot`) lower from
these. They live apart from `programs` so that MaxText's adapter, whose module carries the AOT
functions `aot` looks for, does not pull the built-in engine's model into a MaxText pod's code
bundle (`code_digest.code_files`), which must stay under kubectl's 262,144-byte manifest limit.
"""

from __future__ import annotations

import jax
import numpy as np

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.payload_shapes import payload_shapes


def payload_spec(config: EngineConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one micro-batch as the engine's programs take it."""
    return {
        name: jax.ShapeDtypeStruct(shape, dtype)
        for name, (shape, dtype) in payload_shapes(config).items()
    }


def platform_of(mesh) -> str:
    """The platform of a concrete mesh's devices (the default backend for an abstract mesh)."""
    devices = getattr(mesh, "devices", None)
    if isinstance(devices, np.ndarray):
        return devices.flat[0].platform
    return jax.default_backend()
