"""A predicted step time and MFU from the compiled programs' roofline times: an estimate, never a
measurement; and, beside it, the one figure of those that is a bound.

One step of the built-in engine runs, per micro-batch, `fwd_bwd` (which adds into the step's sums),
and when that micro-batch dropped routed pairs also its dropless replay; then `update` once. So

    step = MICRO_STEPS x (fwd_bwd + P(replay) x fwd_bwd_dropless) + update

(an engine with more programs per micro-batch, such as a separate accumulate, has each of them
inside the parentheses too). MaxText's engine runs `fwd_bwd` on a step's first micro-batch only
and `fwd_bwd_accum` (which adds into the donated sum) on every later one, and never replays:

    step = fwd_bwd + (MICRO_STEPS - 1) x fwd_bwd_accum + update

with P(replay) the chance that a micro-batch overflows its expert buffers, from the calibration
report of the micro-batch the bench would time first (`payload.build.CalibrationReport`: the chance,
per layer, that one group of tokens overflows; a micro-batch replays when any group in any layer
does). The MFU divides the engine's model FLOPs (real tokens only, no recomputation; the figure the
bench's ruler uses) by the predicted step and the devices' peak.

Each program's time is its op estimate (`op_estimate`): every op at its own roofline, max(FLOPs /
peak, HBM bytes / bandwidth), Pallas kernels at their stated cost, collectives over ICI less what
the schedule hides, summed. It is not a bound either way: an op below its roofline makes it low, an
op whose bytes stay in on-chip memory high. The compute term alone, the program's FLOPs at the
chip's peak, is a lower bound on its time (no kernel runs above peak); it counts XLA's own ops
only, leaving out what a TPU kernel states for itself (a statement may count more than the kernel
runs: the grouped matmul states every row it is given), which only lowers it further; so the step
at compute speed without any replay is a lower bound on the step, and the MFU at that step an
upper bound on the MFU. Those two are the only figures labelled bounds. How far the estimate lands
from the chip on the cells the chip measured is `benchmarks/aot/step_estimate_check.py`'s latest
check (`chip_check`), printed beside it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.engine.builtin.flops import micro_batch_flops
from rl_trainer_bench.engine.config import replays_possible
from rl_trainer_bench.payload import build
from rl_trainer_bench.payload.expert_load import replay_probability
from rl_trainer_bench.preflight import op_estimate

ESTIMATE_BY = op_estimate.BY
LABEL = "ESTIMATE (not a measurement, not a bound)"
BOUND = "LOWER BOUND (compute at the chip's peak, no replay; not a measurement)"

# Public measurements of a cell on a slice, to set beside the estimate: MaxText's, for the
# qwen3.5-397b cell on 128 Ironwood chips (mesh 32 x 4 x 2, 64 rows of 65,536 tokens,
# MICRO_STEPS=9, ragged_buffer_factor=2.75, 2 token chunks), from its STAGE_BEFORE_UPDATE pull
# request (benchmarks/reports/aot-397b-fit_tpu7x-v5p_2026-12-05.md).
PUBLIC_MEASURED: Mapping[tuple[str, str], Mapping[str, float]] = {
    ("qwen3.5-397b-cell", "tpu7x:4x4x8"): {
        "fwd_bwd": 10.945,
        "step_stage_on": 100.007,
        "step_stage_off": 107.727,
    }
}
PUBLIC_SOURCE = "MEASURED by MaxText, 128 Ironwood chips, its STAGE_BEFORE_UPDATE pull request"
# The latest check of the estimate against the chip's own cells
# (`benchmarks/aot/step_estimate_check.py`), read at run time from a checkout.
CHIP_CHECK = Path(__file__).resolve().parents[2] / "benchmarks/results/aot-step-check/check.json"
ONCE_PER_STEP = "update"
REPLAY = "fwd_bwd_dropless"
FIRST = "fwd_bwd"
# An engine with this program runs FIRST on a step's first micro-batch only, this on the rest.
LATER = "fwd_bwd_accum"


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """The predicted step of one cell on one target (all times per device, in seconds)."""

    micro_steps: int
    program_seconds: Mapping[str, float | None]  # op estimate per program; None: did not compile
    replay_probability: float  # per micro-batch; 0 when the engine never replays
    model_flops_per_micro_batch: float
    devices: int
    peak_flops_per_device: float
    bytes_per_second_per_device: float
    replay_source: str  # where replay_probability comes from, in words
    # Each program's FLOPs at the peak (loop bodies counted per trip): a lower bound on its time.
    compute_seconds: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    # Each program's op estimate by term (`op_estimate.ProgramEstimate.terms`), per execution.
    program_terms: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    def step_terms(self) -> dict[str, float] | None:
        """The step's op-estimate terms (compute, HBM, kernels, collectives and the part of them
        exposed), each program's weighted by its runs a step as `step_seconds` weighs it; None
        when a program's terms are missing."""
        runs = [(float(n), p) for n, p in self._runs()]
        if self.replay_probability > 0:
            runs.append((self.micro_steps * self.replay_probability, REPLAY))
        if any(p not in self.program_terms for _, p in runs):
            return None
        keys = next(iter(self.program_terms.values())).keys()
        return {k: sum(n * self.program_terms[p][k] for n, p in runs) for k in keys}

    def _seconds(self, program: str) -> float | None:
        return self.program_seconds.get(program)

    @property
    def per_micro_batch(self) -> list[str]:
        """The programs every micro-batch runs: all but the replay and `update`."""
        programs = [p for p in self.program_seconds if p not in (ONCE_PER_STEP, REPLAY)]
        return programs or [FIRST]

    def _runs(self) -> list[tuple[int, str]]:
        """(runs per step, program) of every program but the replay: MICRO_STEPS of each
        per-micro-batch program, FIRST once and LATER on the rest where the engine has LATER."""
        runs = [(self.micro_steps, p) for p in self.per_micro_batch]
        if LATER in self.program_seconds:
            first = {FIRST: 1, LATER: self.micro_steps - 1}
            runs = [(first.get(p, n), p) for n, p in runs]
        return [*runs, (1, ONCE_PER_STEP)]

    @property
    def step_seconds(self) -> float | None:
        """None when a program the step needs did not compile."""
        needed = [p for _, p in self._runs()]
        if self.replay_probability > 0:
            needed.append(REPLAY)
        if any(self._seconds(p) is None for p in needed):
            return None
        step = sum(n * self._seconds(p) for n, p in self._runs())
        if self.replay_probability > 0:
            step += self.micro_steps * self.replay_probability * self._seconds(REPLAY)
        return step

    @property
    def mfu(self) -> float | None:
        step = self.step_seconds
        if not step:
            return None
        model_flops = self.micro_steps * self.model_flops_per_micro_batch
        return model_flops / (step * self.devices * self.peak_flops_per_device)

    @property
    def step_floor_seconds(self) -> float | None:
        """A lower bound on the step: every program but the replay at compute speed, no replay
        (which only adds). None when a program's FLOPs are unknown."""
        floors = [(n, self.compute_seconds.get(p)) for n, p in self._runs()]
        if any(floor is None for _, floor in floors):
            return None
        return sum(n * floor for n, floor in floors)

    @property
    def mfu_ceiling(self) -> float | None:
        """An upper bound on the MFU: the model FLOPs over the step's lower bound."""
        floor = self.step_floor_seconds
        if not floor:
            return None
        model_flops = self.micro_steps * self.model_flops_per_micro_batch
        return model_flops / (floor * self.devices * self.peak_flops_per_device)

    def formula(self) -> str:
        """The step as a sum of its terms, for the report."""

        def term(program: str) -> str:
            seconds = self._seconds(program)
            return f"{program} {'n/a' if seconds is None else seconds_text(seconds)}"

        replay = (
            f" + P(replay) {self.replay_probability:.3g} x {term(REPLAY)}"
            if self.replay_probability > 0
            else ""
        )
        step = self.step_seconds
        total = "n/a (a program did not compile)" if step is None else seconds_text(step)
        if LATER in self.program_seconds:
            each = " + ".join(f"{n} x {term(p)}" for n, p in self._runs()[:-1])
            return f"{each}{replay} + {term(ONCE_PER_STEP)} = {total}"
        each = " + ".join(term(p) for p in self.per_micro_batch)
        return f"{self.micro_steps} x ({each}{replay}) + {term(ONCE_PER_STEP)} = {total}"

    def to_json(self) -> dict:
        return {
            "kind": "estimate",
            "measured": False,
            "by": ESTIMATE_BY,
            "program_seconds": dict(self.program_seconds),
            "program_terms": {p: dict(t) for p, t in self.program_terms.items()},
            "step_terms": self.step_terms(),
            "micro_steps": self.micro_steps,
            "replay_probability": self.replay_probability,
            "replay_source": self.replay_source,
            "step_seconds": self.step_seconds,
            "model_flops_per_micro_batch": self.model_flops_per_micro_batch,
            "devices": self.devices,
            "peak_flops_per_device": self.peak_flops_per_device,
            "hbm_bytes_per_second_per_device": self.bytes_per_second_per_device,
            "mfu": self.mfu,
            "chip_check": chip_check(),
            "bounds": {
                "kind": "lower bound on the step, upper bound on the MFU",
                "compute_seconds": dict(self.compute_seconds),
                "step_floor_seconds": self.step_floor_seconds,
                "mfu_ceiling": self.mfu_ceiling,
            },
        }


def public_comparison(preset: str, target: str, step: StepEstimate) -> list[str]:
    """The public measurements of this cell on this slice beside the estimate, with the ratios
    and the terms that make up the estimated step; [] when there are none."""
    public = PUBLIC_MEASURED.get((preset, target))
    if public is None:
        return []
    fwd_bwd, on, off = public["fwd_bwd"], public["step_stage_on"], public["step_stage_off"]
    lines = [
        f"public, {PUBLIC_SOURCE}: fwd_bwd {fwd_bwd} s per micro-batch; step"
        f" {on} s (STAGE_BEFORE_UPDATE on), {off} s (off)"
    ]
    if step.step_seconds:
        lines.append(
            f"  predicted step {seconds_text(step.step_seconds)} = {step.step_seconds / on:.2f} x"
            f" the public step with STAGE on, {step.step_seconds / off:.2f} x off"
        )
    terms = step.step_terms()
    if terms:
        lines.append(
            "  its terms a step: compute-bound ops "
            f"{seconds_text(terms['compute_seconds'])}, HBM-bound ops "
            f"{seconds_text(terms['memory_seconds'])}, Pallas kernels "
            f"{seconds_text(terms['kernel_seconds'])} (+ "
            f"{seconds_text(terms['kernel_vector_seconds'])} of their vector work), "
            "collectives exposed "
            f"{seconds_text(terms['exposed_collective_seconds'])} (of "
            f"{seconds_text(terms['collective_seconds'])} moving)"
        )
    for name, seconds in (
        ("op estimate", step.program_seconds.get("fwd_bwd")),
        ("compute lower bound", step.compute_seconds.get("fwd_bwd")),
    ):
        if seconds:
            lines.append(
                f"  fwd_bwd {name} {seconds_text(seconds)} = {seconds / fwd_bwd:.2f} x the public"
            )
    return lines


def chip_check(path: Path = CHIP_CHECK) -> dict | None:
    """The latest check's summary (cells within 10%, the errors, the changes' signs), with the
    chip and the file it came from; None where the file is absent (an installed package without
    the checkout's benchmarks/) or unreadable."""
    try:
        check = json.loads(path.read_text())
        summary = dict(check["summary"])
        rates = check["rates"]["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {**summary, "file": str(path), "rates": rates}


def chip_check_line(summary: dict | None) -> str:
    """One line: how far the estimate landed from the chip on the cells the chip measured."""
    if summary is None:
        return (
            f"  on the chip's own cells: no check found ({CHIP_CHECK} is made by"
            " benchmarks/aot/step_estimate_check.py in a checkout)"
        )
    return (
        f"  on the chip's own cells (the latest check, {summary['file']}): within 10% on"
        f" {summary['within_10_percent']} of {summary['cells']} measured tpu-v5e-1 cells, the"
        f" largest error {summary['max_abs_error']:.1%} (median {summary['median_abs_error']:.1%});"
        f" the sign of {summary['signs_right_over_1_percent']} of"
        f" {summary['changes_over_1_percent']} measured program changes over 1% right"
    )


def seconds_text(seconds: float | None) -> str:
    """A time for a report: s, ms or us; `-` when there is none."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclasses.dataclass(frozen=True)
class MicroBatchFacts:
    """What the estimate needs from the micro-batch the bench would time first."""

    replay_probability: float
    model_flops: float
    source: str


def micro_batch_facts(config, profile, seed: int) -> MicroBatchFacts:
    """Build the bench's first micro-batch (index 0 of `seed`) and read its replay chance and model
    FLOPs (`profile`: a `routing_profile.RoutingProfile`); with retry off or a buffer that never
    drops there is no replay to predict."""
    replays = replays_possible(config)
    built = build.build_calibrated(config, profile, seed=seed, index=0, replay=replays)
    flops = micro_batch_flops(config, built.payload.segment_ids, count_remat=False)
    if built.calibration is None:
        return MicroBatchFacts(
            0.0, flops, "none: the engine never replays (retry off or a dropless factor)"
        )
    calibration = built.calibration
    probability = replay_probability(
        calibration.overflow.overflow_probability,
        calibration.tokens_per_group,
        config.micro_batch_rows * config.seq_len,
    )
    kind = "synthetic" if calibration.synthetic else "measured"
    source = (
        f"calibration report of micro-batch 0 (seed {seed}, {kind} routing profile) at "
        f"ragged_buffer_factor={calibration.factor:g}"
    )
    return MicroBatchFacts(probability, flops, source)
