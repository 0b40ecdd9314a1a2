"""The training state's device memory from the parameter count: what the plan can say without JAX.

Whether a cell fits its devices is known only once its programs are compiled (`aot`, minutes to
tens of minutes for the production cell on a CPU host), but the state that stays on the devices
through a step follows from the parameter shapes: the float32 parameters and gradient sum, and
Adam's two moments (the first in `mu_dtype`) unless `optimizer_memory_host_offload` keeps them in
host memory. The plan prints it beside the device's memory so that a state which alone leaves no
room is seen before any compile, and says which command gives the programs' part.
"""

from __future__ import annotations

import dataclasses
import math

from rl_trainer_bench.engine.builtin.parameters import parameter_shapes
from rl_trainer_bench.engine.config import EngineConfig

ITEM_BYTES = {"float32": 4, "bfloat16": 2}
# The margin a program's device peak should leave free, as a fraction of the device's memory: room
# for what no compile sees (the runtime's own buffers, fragmentation across programs, a libtpu that
# plans a little differently on the pod). The AOT check judges it (`aot --min-headroom` sets
# another); the plan names it.
MIN_HEADROOM = 0.05


@dataclasses.dataclass(frozen=True)
class StateMemory:
    """Bytes per device of each part of the state, the parameter count split evenly over the mesh
    (within a few KiB of the largest shard: a handful of small leaves do not divide)."""

    params: int
    grad_sum: int
    optimizer: int
    optimizer_on_host: bool

    @property
    def on_device(self) -> int:
        return self.params + self.grad_sum + (0 if self.optimizer_on_host else self.optimizer)


def state_memory(engine: EngineConfig) -> StateMemory:
    """The state per device of `engine` on its mesh."""
    count = sum(math.prod(shape) for shape in parameter_shapes(engine.model).values())
    per_device = count / engine.mesh.size
    moments = ITEM_BYTES[engine.optimizer.mu_dtype] + ITEM_BYTES["float32"]
    return StateMemory(
        params=round(4 * per_device),
        grad_sum=round(4 * per_device),
        optimizer=round(moments * per_device),
        optimizer_on_host=engine.optimizer.memory_host_offload,
    )
