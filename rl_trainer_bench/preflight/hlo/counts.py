"""How often each computation of an HLO module runs, and the matmul FLOPs of an instruction (a TPU
kernel's by the count it states).

XLA's own cost analysis counts a loop body once; the collective-overlap summary (`hlo.overlap`)
and the loop-counted cost (`program_cost`) both need every computation counted as often as it
runs, with trip counts read from the text (TPU text drops XLA's `known_trip_count` record).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np

from rl_trainer_bench.preflight.hlo.mxu import padding, passes
from rl_trainer_bench.preflight.hlo.parse import Computation, HloModule, HloParseError, Instruction

_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def execution_counts(
    module: HloModule, enters: Callable[[Instruction], bool] = lambda instruction: False
) -> dict[str, int]:
    """How often each computation reached from the entry runs per execution of the entry: through
    `while`, `call` and `conditional`, and through any instruction `enters` accepts (the overlap
    summary enters fusions, whose computations may hold collectives; the loop-counted cost does
    not, since it counts a fusion's FLOPs at the fusion). An async-start's wrapped computations
    are not visited: their collectives are reported at the start.
    """
    counts: dict[str, int] = {}
    for computation, times in control_flow_runs(module, [module.entry.name], enters):
        counts[computation.name] = counts.get(computation.name, 0) + times
    return counts


def control_flow_runs(
    module: HloModule,
    starts: Iterable[str],
    enters: Callable[[Instruction], bool] = lambda instruction: False,
) -> Iterator[tuple[Computation, int]]:
    """Each computation that running `starts` once each runs, with how often, by control flow:
    a `while` runs its body and condition its trip count times (`trip_count`), `call` and
    `conditional` their computations once, and so does any instruction `enters` accepts. A
    computation reached twice is yielded twice. HLO has no recursion, so a computation that calls
    itself, directly or not, is damaged text: refused.
    """
    calling: list[str] = []

    def visit(name: str, times: int) -> Iterator[tuple[Computation, int]]:
        computation = module.computations.get(name)
        if computation is None:
            return
        if name in calling:
            raise recursion_error(computation, calling)
        calling.append(name)
        yield computation, times
        for instruction in computation.instructions:
            if instruction.opcode == "while":
                trips = trip_count(instruction, computation, module)
                for key in ("body", "condition"):
                    called = instruction.attribute(key)
                    if called:
                        yield from visit(called.lstrip("%"), times * trips)
            elif instruction.opcode in ("call", "conditional") or enters(instruction):
                for called in instruction.called_computations():
                    yield from visit(called, times)
        calling.pop()

    for name in starts:
        yield from visit(name, 1)


def recursion_error(computation: Computation, calling: list[str]) -> HloParseError:
    """The error for text where `computation` runs again while `calling` (outermost first) runs."""
    cycle = " -> ".join([*calling[calling.index(computation.name) :], computation.name])
    return HloParseError(
        f"line {computation.line}: computation {computation.name} calls itself ({cycle}); HLO has "
        "no recursion: is the text damaged?"
    )


def trip_count(loop: Instruction, caller: Computation, module: HloModule) -> int:
    """Iterations of a `while`: XLA's `known_trip_count` when recorded (GPU, CPU), else read from
    the loop itself (TPU drops the record): a condition `counter < N` on a tuple element whose
    initial value is a constant c gives N - c. 1 when neither is readable.
    """
    match = _TRIP_COUNT.search(loop.attributes)
    if match:
        return int(match.group(1))
    condition = module.computations.get((loop.attribute("condition") or "").lstrip("%"))
    compare = root_instruction(condition) if condition else None
    if compare is None or compare.opcode != "compare" or "direction=LT" not in compare.attributes:
        return 1
    inside = condition.by_name()
    counter, limit = (inside.get(o) for o in compare.operands[:2])
    bound = _constant(limit, inside)
    if counter is None or counter.opcode != "get-tuple-element" or bound is None:
        return 1
    index_text = counter.attribute("index") or "0"
    if not index_text.isdigit():
        return 1
    index = int(index_text)
    outside = caller.by_name()
    init = outside.get(loop.operands[0]) if loop.operands else None
    start = 0
    if init is not None and init.opcode == "tuple" and index < len(init.operands):
        start = _constant(outside.get(init.operands[index]), outside) or 0
    return max(bound - start, 1)


def root_instruction(computation: Computation) -> Instruction | None:
    return computation.instructions[-1] if computation.instructions else None


def _constant(instruction: Instruction | None, by_name: Mapping[str, Instruction]) -> int | None:
    """The integer value of a scalar constant, looking through copies and conversions."""
    while instruction is not None and instruction.opcode in ("copy", "bitcast", "convert"):
        instruction = by_name.get(instruction.operands[0]) if instruction.operands else None
    if instruction is None or instruction.opcode != "constant":
        return None
    try:
        return int(instruction.literal)
    except ValueError:
        return None


class FlopCounter:
    """Matmul FLOPs of an instruction, descending into fusions, calls and loop bodies; a TPU
    kernel's as it states them, unless `kernels` is False (then none of its own). With `mxu` (the
    side of the chip's matrix unit, 0 if unknown) each XLA matmul counts the work the unit does
    for it instead (`hlo.mxu`: its bfloat16 passes, its dimensions padded to the unit)."""

    def __init__(self, module: HloModule, kernels: bool = True, mxu: int | None = None) -> None:
        self._module = module
        self._kernels = kernels
        self._mxu = mxu
        self._memo: dict[str, float] = {}
        self._callers = {
            i.name: c
            for c in module.computations.values()
            for i in c.instructions
            if i.opcode == "while"
        }

    def of_computation(self, name: str) -> float:
        if name not in self._memo:
            computation = self._module.computations.get(name)
            self._memo[name] = 0.0
            if computation is not None:
                by_name = computation.by_name()
                self._memo[name] = sum(
                    self.of_instruction(i, by_name) for i in computation.instructions
                )
        return self._memo[name]

    def of_instruction(self, instruction: Instruction, by_name: Mapping[str, Instruction]) -> float:
        opcode = instruction.opcode
        if opcode == "dot":
            lhs, rhs = (by_name.get(o) for o in (*instruction.operands, "", "")[:2])
            contracted = _contracted(instruction, lhs)
            flops = 2.0 * _elements(instruction) * contracted
            return flops * self._mxu_factor(instruction, lhs, rhs, contracted)
        if opcode == "convolution":
            lhs, rhs = (by_name.get(o) for o in (*instruction.operands, "", "")[:2])
            flops = 2.0 * _elements(instruction) * _kernel_reduction(instruction, lhs, rhs)
            return flops * self._mxu_factor(
                instruction, lhs, rhs, _kernel_dim(instruction, rhs, "i")
            )
        if opcode == "while":
            body = instruction.attribute("body")
            trips = trip_count(instruction, self._callers[instruction.name], self._module)
            return trips * self.of_computation(body.lstrip("%")) if body else 0
        if opcode == "custom-call" and (kernel := _kernel_cost_flops(instruction)) is not None:
            return kernel if self._kernels else 0.0
        if opcode in ("fusion", "call", "async-start", "conditional", "custom-call"):
            return sum(self.of_computation(c) for c in instruction.called_computations())
        return 0.0

    def _mxu_factor(
        self,
        matmul: Instruction,
        lhs: Instruction | None,
        rhs: Instruction | None,
        contracted: int,
    ) -> float:
        """The unit's work per FLOP of `matmul` (1 when counting FLOPs): its passes, and its
        padding over the rows of one batch element, the contracted size of one pass and the
        output features."""
        if self._mxu is None:
            return 1.0
        if matmul.opcode == "dot":
            batch, columns = _dot_batch_and_columns(matmul, rhs)
        elif (
            (matmul.attribute("feature_group_count") or "1")
            == (matmul.attribute("batch_group_count") or "1")
            == "1"
        ):
            batch, columns = 1, _kernel_dim(matmul, rhs, "o")
        else:  # a grouped convolution: its groups' sizes are not modelled
            batch, columns = 1, 0
        rows = _elements(matmul) // max(batch * columns, 1)
        return passes(matmul, lhs, rhs) * padding(rows, contracted, columns, self._mxu)


# A Pallas TPU kernel's own FLOP count, which libtpu's cost analysis also takes: the
# `pl.CostEstimate` its author wrote, carried in the custom call's backend config (the grouped
# matmul `gmm` states 2 m k n).
_KERNEL_FLOPS = re.compile(r'"cost_estimate":\{"flops":"(\d+)"')


def _kernel_cost_flops(custom_call: Instruction) -> float | None:
    """The FLOPs a TPU kernel's custom call states for itself, or None where it states none."""
    found = _KERNEL_FLOPS.search(custom_call.attributes)
    return float(found.group(1)) if found else None


_TPU_KERNEL_TARGET = '"tpu_custom_call"'
_CALL_NUMBER = re.compile(r"\.\d+$")


def unstated_kernel(instruction: Instruction) -> str | None:
    """The name of the TPU kernel this instruction calls when the kernel states no FLOPs (Pallas'
    splash attention states none): neither XLA's count nor the walk sees its work; None for any
    other instruction. The name is the call's, less XLA's `.N` suffix."""
    if instruction.opcode != "custom-call" or _kernel_cost_flops(instruction) is not None:
        return None
    if instruction.attribute("custom_call_target") != _TPU_KERNEL_TARGET:
        return None
    return _CALL_NUMBER.sub("", instruction.name)


def _elements(instruction: Instruction) -> int:
    return instruction.arrays[0].elements if instruction.arrays else 0


def _contracted(dot: Instruction, lhs: Instruction | None) -> int:
    """Product of the lhs contracting dimensions (1 when the lhs shape is unknown)."""
    dims = dot.attribute("lhs_contracting_dims")
    if lhs is None or not lhs.arrays or not dims:
        return 1
    shape = lhs.arrays[0].dims
    listed = re.fullmatch(r"\{\s*(\d+(?:\s*,\s*\d+)*)?\s*\}", dims)
    indices = [int(d) for d in (listed.group(1) or "").split(",") if d.strip()] if listed else []
    if listed is None or any(i >= len(shape) for i in indices):
        raise HloParseError(
            f"line {dot.line}: {dot.name} has lhs_contracting_dims={dims}, which does not name "
            f"dimensions of its lhs {list(shape)}; is the HLO text damaged?"
        )
    return math.prod(shape[i] for i in indices)


def _dims(text: str | None) -> list[int]:
    """The dimension numbers of `{0,2}`; [] for none."""
    return [int(d) for d in (text or "").strip("{}").split(",") if d.strip()]


def _dot_batch_and_columns(dot: Instruction, rhs: Instruction | None) -> tuple[int, int]:
    """(batch elements, output features) of a dot: the product of its rhs batch dimensions and of
    its rhs dimensions neither batch nor contracted; (1, 0) where the rhs shape is unknown."""
    if rhs is None or not rhs.arrays:
        return 1, 0
    shape = rhs.arrays[0].dims
    batch_dims = _dims(dot.attribute("rhs_batch_dims"))
    skipped = set(batch_dims) | set(_dims(dot.attribute("rhs_contracting_dims")))
    batch = math.prod(shape[d] for d in batch_dims if d < len(shape))
    return batch, math.prod(size for d, size in enumerate(shape) if d not in skipped)


def _kernel_dim(convolution: Instruction, rhs: Instruction | None, label: str) -> int:
    """The size of the kernel dimension labelled `label` (`i` input, `o` output features); 0
    where the labels or the kernel shape are unknown."""
    labels = convolution.attribute("dim_labels") or ""
    kernel = labels.split("_", 1)[1].split("->")[0] if "_" in labels else ""
    if (
        rhs is None
        or not rhs.arrays
        or label not in kernel
        or len(kernel) != len(rhs.arrays[0].dims)
    ):
        return 0
    return rhs.arrays[0].dims[kernel.index(label)]


def _kernel_reduction(
    convolution: Instruction, lhs: Instruction | None, rhs: Instruction | None
) -> float:
    """Kernel elements that meet a real input element, per output element: every kernel dim but
    the output feature one, each spatial dim counted by its taps that land on the input rather
    than on its padding or between its dilated elements (averaged over the output positions).

    TPU compilers write a batched matmul as a convolution whose batch dims are spatial dims that
    every output element meets once: a base-dilated window (`size=64 stride=63 lhs_dilate=64`) or a
    window over padding (`size=16 pad=15_15` on an input of 1). Counting the whole window there
    counted a Gated DeltaNet chunk's matmul 4,096 times over
    (benchmarks/reports/aot-one-chip-cost_v5e-v6e_2026-12-06.md, "The FLOP count of a TPU batched
    matmul").
    """
    labels = convolution.attribute("dim_labels")
    if rhs is None or not rhs.arrays or not labels or "_" not in labels:
        return 1
    lhs_labels, rest = labels.split("_", 1)
    kernel_labels = rest.split("->")[0]
    shape = rhs.arrays[0].dims
    if len(kernel_labels) != len(shape):
        return 1
    inputs = dict(zip(lhs_labels, lhs.arrays[0].dims, strict=False)) if lhs and lhs.arrays else {}
    windows = _window(convolution.attribute("window") or "")
    reduction = 1.0
    for label, size in zip(kernel_labels, shape, strict=True):
        if label.isdigit() and label in inputs and int(label) < len(windows):
            reduction *= _taps_on_input(inputs[label], windows[int(label)])
        elif label != "o":
            reduction *= size
    return reduction


def _window(text: str) -> list[dict[str, tuple[int, ...]]]:
    """Each spatial dim's window fields from `window={size=AxB stride=.. pad=lo_hixlo_hi ..}`."""
    fields = dict(re.findall(r"(\w+)=([\d_x]+)", text))
    sizes = [int(v) for v in fields.get("size", "").split("x") if v]

    def per_dim(key: str, default: tuple[int, ...]) -> list[tuple[int, ...]]:
        if key not in fields:
            return [default] * len(sizes)
        return [tuple(int(v) for v in part.split("_")) for part in fields[key].split("x")]

    columns = {
        "size": [(k,) for k in sizes],
        "stride": per_dim("stride", (1,)),
        "pad": per_dim("pad", (0, 0)),
        "lhs_dilate": per_dim("lhs_dilate", (1,)),
        "rhs_dilate": per_dim("rhs_dilate", (1,)),
    }
    return [{key: column[i] for key, column in columns.items()} for i in range(len(sizes))]


def _taps_on_input(length: int, window: Mapping[str, tuple[int, ...]]) -> float:
    """Mean number of a window's taps that land on one of `length` real input elements."""
    (size,), (stride,), (low, high) = window["size"], window["stride"], window["pad"]
    (base,), (spread,) = window["lhs_dilate"], window["rhs_dilate"]
    extent = (length - 1) * base + 1  # the dilated input
    outputs = (extent + low + high - ((size - 1) * spread + 1)) // stride + 1
    if outputs <= 0:
        return 0.0
    if outputs * size > _MAX_WINDOW_PAIRS:  # too many to list: the window's density instead
        return max(1.0, size / base)
    position = (
        np.arange(outputs)[:, None] * stride + np.arange(size)[None, :] * spread - low
    )  # each tap's place in the dilated input
    real = (position >= 0) & (position < extent) & (position % base == 0)
    return float(real.sum()) / outputs


# Output positions x taps of one spatial dim beyond which the taps are not listed one by one.
_MAX_WINDOW_PAIRS = 1 << 24
