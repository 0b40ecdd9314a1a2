"""A program the device could not load in a run: the size the user chose, refused in one line.

On a TPU the runtime reserves a program's temporaries when it first runs it; a cell too large for
the chip compiles and then fails there with RESOURCE_EXHAUSTED naming the program (on a v5e chip,
tpu-v5e-1 at 8 rows per micro-batch: "Error loading program 'jit_fwd_bwd': Attempting to reserve
8.36G at the bottom of memory ... 7.56G free", BENCHMARKS.md). That is the chosen size's answer,
not a bug of the bench, so it is a UserError (exit 2) whose line keeps the runtime's words and
names the fix; MEASURE_PEAK's probes take the same failure as their answer instead
(`device_peak.probe`).
"""

from __future__ import annotations

from rl_trainer_bench.bench.device_peak import failed_load
from rl_trainer_bench.errors import UserError, one_line


class DoesNotFit(UserError):
    """A program of the run did not fit in its device's memory when it was loaded."""


def refusal(error: BaseException, preset: str) -> DoesNotFit | None:
    """The one-line refusal for `error` when it is a load that did not fit, else None."""
    program = failed_load(error)
    if program is None:
        return None
    return DoesNotFit(
        f"{program or 'a program'} did not fit in the device's memory at this size:"
        f" {one_line(str(error))[:240]}; lower the micro-batch (train_micro_batch_size in"
        f" --engine-flags) or the model, and check the size first with `rl-trainer-bench aot"
        f" --preset {preset} --target local`"
    )
