"""A predicted step time and MFU from the compiled programs' roofline times: an estimate, never a
measurement.

One step of the built-in engine runs, per micro-batch, `fwd_bwd` (which adds into the step's sums),
and when that micro-batch dropped routed pairs also its dropless replay; then `update` once. So

    step = MICRO_STEPS x (fwd_bwd + P(replay) x fwd_bwd_dropless) + update

(an engine with more programs per micro-batch, such as a separate accumulate, has each of them
inside the parentheses too)

with P(replay) the chance that a micro-batch overflows its expert buffers, from the calibration
report of the micro-batch the bench would time first (`payload.build.CalibrationReport`: the chance,
per layer, that one group of tokens overflows; a micro-batch replays when any group in any layer
does). The MFU divides the engine's model FLOPs (real tokens only, no recomputation; the figure the
bench's ruler uses) by the predicted step and the devices' peak. Each program's time is the roofline
of `program_cost`, a lower bound, so the step is a lower bound and the MFU an upper bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.payload.routing_profile import replay_probability

ESTIMATE_BY = (
    "rl-trainer-bench: roofline of XLA's cost analysis (loop bodies counted per trip) against the "
    "chip table's peak FLOP/s and HBM bandwidth"
)
LABEL = "ESTIMATE (not a measurement)"
ONCE_PER_STEP = "update"
REPLAY = "fwd_bwd_dropless"


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """The predicted step of one cell on one target (all times per device, in seconds)."""

    micro_steps: int
    program_seconds: Mapping[str, float | None]  # roofline per program; None: did not compile
    replay_probability: float  # per micro-batch; 0 when the engine never replays
    model_flops_per_micro_batch: float
    devices: int
    peak_flops_per_device: float
    bytes_per_second_per_device: float
    replay_source: str  # where replay_probability comes from, in words

    def _seconds(self, program: str) -> float | None:
        return self.program_seconds.get(program)

    @property
    def per_micro_batch(self) -> list[str]:
        """The programs every micro-batch runs: all but the replay and `update`."""
        programs = [p for p in self.program_seconds if p not in (ONCE_PER_STEP, REPLAY)]
        return programs or ["fwd_bwd"]

    @property
    def step_seconds(self) -> float | None:
        """None when a program the step needs did not compile."""
        needed = [*self.per_micro_batch, ONCE_PER_STEP]
        if self.replay_probability > 0:
            needed.append(REPLAY)
        if any(self._seconds(p) is None for p in needed):
            return None
        per_micro_batch = sum(self._seconds(p) for p in self.per_micro_batch)
        if self.replay_probability > 0:
            per_micro_batch += self.replay_probability * self._seconds(REPLAY)
        return self.micro_steps * per_micro_batch + self._seconds(ONCE_PER_STEP)

    @property
    def mfu(self) -> float | None:
        step = self.step_seconds
        if not step:
            return None
        model_flops = self.micro_steps * self.model_flops_per_micro_batch
        return model_flops / (step * self.devices * self.peak_flops_per_device)

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
        each = " + ".join(term(p) for p in self.per_micro_batch)
        return f"{self.micro_steps} x ({each}{replay}) + {term(ONCE_PER_STEP)} = {total}"

    def to_json(self) -> dict:
        return {
            "kind": "estimate",
            "measured": False,
            "by": ESTIMATE_BY,
            "program_seconds": dict(self.program_seconds),
            "micro_steps": self.micro_steps,
            "replay_probability": self.replay_probability,
            "replay_source": self.replay_source,
            "step_seconds": self.step_seconds,
            "model_flops_per_micro_batch": self.model_flops_per_micro_batch,
            "devices": self.devices,
            "peak_flops_per_device": self.peak_flops_per_device,
            "hbm_bytes_per_second_per_device": self.bytes_per_second_per_device,
            "mfu": self.mfu,
        }


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
    from rl_trainer_bench.engine.flops import micro_batch_flops
    from rl_trainer_bench.engine.programs import replays_possible
    from rl_trainer_bench.payload import build

    replays = replays_possible(config)
    built = build.build_calibrated(config, profile, seed=seed, index=0, replay=replays)
    flops = micro_batch_flops(config, built.payload.segment_ids, count_remat=False)
    if built.calibration is None:
        return MicroBatchFacts(
            0.0, flops, "none: the engine never replays (retry off or factor -1)"
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
