"""A program the device could not hold in a run: the size the user chose, refused in one line.

On a TPU the runtime reserves a program's temporaries when it first runs it; a cell too large for
the chip compiles and then fails there with RESOURCE_EXHAUSTED naming the program (on a v5e chip,
tpu-v5e-1 at 8 rows per micro-batch: "Error loading program 'jit_fwd_bwd': Attempting to reserve
8.36G at the bottom of memory ... 7.56G free",
benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md). A cell larger still fails in the
compile: XLA sizes the program's temporaries against the device's memory and stops with
RESOURCE_EXHAUSTED ("the total memory required for HLO temporaries (17.77G) exceeds available HBM
(15.75G)": MaxText's engine at tpu-v5e-1's micro-batch on a v5e chip). Either is the chosen size's
answer, not a bug of the bench, so it is a UserError (exit 2) whose line keeps the runtime's words
and names the fix; MEASURE_PEAK's probes take a failed load as their answer instead
(`device_peak.probe`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rl_trainer_bench.bench.device_peak import RUNTIME_ERRORS, failed_load, runtime_status
from rl_trainer_bench.engine.kernel_vmem import VMEM_OVERFLOW, vmem_overflow_fix
from rl_trainer_bench.errors import UserError, one_line


class DoesNotFit(UserError):
    """A program of the run did not fit in its device's memory when it was loaded."""


class KernelTooLarge(UserError):
    """A kernel's program, sized by an engine key, did not fit in a TPU core's VMEM."""


def refusal(error: BaseException, preset: str) -> DoesNotFit | None:
    """The one-line refusal for `error` when it is a load that did not fit, else None."""
    program = failed_load(error)
    if program is None:
        return None
    return _does_not_fit(f"{program or 'a program'} did not fit", error, preset)


def compile_refusal(error: BaseException, preset: str) -> UserError | None:
    """The one-line refusal for `error` when the compiler found a program larger than the
    device's memory, or a program the compile ran did not load, else None. A kernel's tiles too
    large for the core's own memory ("memory space vmem") are not the cell's size: where an engine
    key sizes that kernel the refusal names the key (`kernel_vmem`); any other such error passes
    through as it came."""
    if runtime_status(error) != "RESOURCE_EXHAUSTED":
        return None
    if VMEM_OVERFLOW in str(error).lower():
        fix = vmem_overflow_fix(str(error))
        if fix is None:
            return None
        return KernelTooLarge(
            f"{fix}, checking it first with `rl-trainer-bench aot --preset {preset} --target local`"
        )
    loaded = refusal(error, preset)
    return loaded or _does_not_fit("the engine's programs do not fit when compiled", error, preset)


def _does_not_fit(what: str, error: BaseException, preset: str) -> DoesNotFit:
    return DoesNotFit(
        f"{what} in the device's memory at this size: {one_line(str(error))[:240]}; lower the"
        " micro-batch (train_micro_batch_size in --engine-flags) or the model, and check the size"
        f" first with `rl-trainer-bench aot --preset {preset} --target local`"
    )


@contextlib.contextmanager
def refused_as_size(
    preset: str, refusal_of: Callable[[BaseException, str], UserError | None]
) -> Iterator[None]:
    """The block's runtime error that `refusal_of` takes for the size's answer, raised as its
    one-line refusal; any other passes through as it came."""
    try:
        yield
    except RUNTIME_ERRORS as error:
        refused = refusal_of(error, preset)
        if refused is None:
            raise
        raise refused from error
