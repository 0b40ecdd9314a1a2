"""The A/B's device memory before launch: one state for every arm, the staged micro-batch, and
the command that compiles every arm's programs for their temporaries.

The arms of a same-pod A/B share one model state (parameters, gradient sum, optimizer state), each
arm's programs compiled against it, so the device holds one state whatever the number of arms,
beside the temporaries of whichever program runs: the A/B's peak is one state plus the largest
arm program's temporaries, plus the next step's micro-batch where an arm stages it. The plan can
say the first and the last from the shapes alone (bench/state_memory.py,
bench/micro_batch_memory.py); the temporaries are known once the programs are compiled, which is
`aot --ab-arms`'s work, so the line names that command.
"""

from __future__ import annotations

from rl_trainer_bench.ab.plan import ArmPlan
from rl_trainer_bench.bench.micro_batch_memory import micro_batch_bytes
from rl_trainer_bench.bench.state_memory import state_memory
from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.units import human_bytes


def memory_line(arm_plan: ArmPlan, arms: str) -> str:
    """The A/B's per-device memory as far as the plan knows it, against the slice's device."""
    engines = {
        name: engine_config_from(
            arm_plan.preset, config.trainer_argv, config.engine_flags, engine=config.engine
        )[0]
        for name, config in arm_plan.bench_configs.items()
    }
    states = {name: state_memory(engine).on_device for name, engine in engines.items()}
    largest = max(states, key=states.__getitem__)
    staging = [arm.setting for arm in arm_plan.arms if arm_plan.stages[arm.label].enabled]
    engine = engines[largest]
    staged = -(-micro_batch_bytes(engine) // engine.mesh.size) if staging else 0
    stage_text = (
        f" + the staged micro-batch {human_bytes(staged)} (arms {', '.join(dict.fromkeys(staging))})"
        if staging
        else " (no arm stages a micro-batch)"
    )
    config = arm_plan.bench_configs[largest]
    tpu_slice = config.trainer_slice
    device = (
        f" of {human_bytes(tpu_slice.chip.device_memory_bytes)} per {tpu_slice.chip.name} device"
        if tpu_slice is not None
        else ""
    )
    target = tpu_slice.name if tpu_slice is not None else "local"
    return (
        f"A/B device memory: one state for every arm, {human_bytes(states[largest])} per device"
        f"{stage_text}, + the largest arm program's temporaries{device}; the temporaries and the"
        f" fit: rl-trainer-bench aot --preset {arm_plan.preset.name} --target {target} --ab-arms"
        f" '{arms}' with this TRAINER_ARGV and ENGINE_FLAGS"
    )
