"""The chip scripts' programs compiled side by side: each call traces, compiles and runs its own
program on a thread of its own, so XLA's compiles (which release the GIL) run at once on the chip
host's cores instead of one after another, and the chip runs each program when it is ready. JAX's
mesh and matmul-precision settings hold per thread: each call enters the ones it needs."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's result, in order; the first error raised is raised here."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]
