"""`extra_device_work`: a known amount of device work added to every `fwd_bwd`, sized here.

An A/B that finds no effect where none exists must also be shown to find one where one does: this
key gives an arm a known, small amount of extra device work, so a 1% effect is measured on a chip
rather than only simulated. The work is a chain of `count` square matmuls of `side` x `side`
matrices in the model's compute dtype, on every device, built from a parameter (so XLA cannot fold
it at compile time) and returned by the program beside its sums (so XLA cannot drop it); nothing
of it reaches the loss, the gradient or the state (engine/builtin/programs.py). Its size is stated
in FLOPs (2 x side**3 per matmul, as XLA's cost analysis counts a dot), and in milliseconds only as
an ESTIMATE at a chip's peak: a matmul of this shape runs below the peak.

Sizing is plain arithmetic, so a plan states it with no JAX.
"""

from __future__ import annotations

import math

MAX_SIDE = 4096  # wide enough to keep a TPU's matrix unit busy; a larger request takes more matmuls
SIDE_STEP = 128  # a TPU's matrix tile
MAX_MATMULS = 64  # each matmul is one more op in the program to compile: 8.8e12 FLOPs per call


def matmuls(flops: float) -> tuple[int, int]:
    """(side, count) of the chain nearest `flops` per call: the widest side, a multiple of 128
    up to 4096, whose one matmul does not exceed `flops`, and the count nearest the request (at
    least one); (0, 0) for no work."""
    if flops <= 0:
        return 0, 0
    side = int((flops / 2) ** (1 / 3)) // SIDE_STEP * SIDE_STEP
    side = min(max(side, SIDE_STEP), MAX_SIDE)
    return side, max(1, round(flops / matmul_flops(side)))


def matmul_flops(side: int) -> float:
    """FLOPs of one side x side by side x side matmul (a multiply and an add per term)."""
    return 2.0 * side**3


def chain_flops(flops: float) -> float:
    """The FLOPs the chain for a request of `flops` does per call, per device."""
    side, count = matmuls(flops)
    return count * matmul_flops(side) if count else 0.0


def describe(flops: float, micro_steps: int, chip_name: str, peak_flops: float | None) -> str:
    """The plan's line: the chain, its FLOPs per call and per step, and an ESTIMATE of its time at
    the named chip's peak (none where no chip is named)."""
    side, count = matmuls(flops)
    per_call = chain_flops(flops)
    per_step = per_call * micro_steps
    text = (
        f"extra_device_work={flops:g}: {count} matmul(s) of {side} x {side} in every fwd_bwd call"
        f" on every device, {per_call:.3g} FLOPs per call, {per_step:.3g} per step"
        f" ({micro_steps} calls); its result is returned beside the sums, never in the loss"
    )
    if peak_flops:
        milliseconds = per_step / peak_flops * 1e3
        text += (
            f"; ESTIMATE {milliseconds:.3g} ms per step at {chip_name}'s peak"
            f" ({peak_flops / 1e12:.0f} TFLOP/s; below the peak it takes longer)"
        )
    return text


def refusal(flops: float) -> str | None:
    """Why `flops` is no amount of work (None: it is one)."""
    if not math.isfinite(flops) or flops < 0:
        return f"extra_device_work={flops!r}: must be a finite FLOP count >= 0 (0: none)"
    if matmuls(flops)[1] > MAX_MATMULS:
        most = MAX_MATMULS * matmul_flops(MAX_SIDE)
        return f"extra_device_work={flops:g}: at most {most:.3g} FLOPs per fwd_bwd call"
    return None
