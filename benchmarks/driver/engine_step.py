"""Time the built-in engine's step on this machine, or lower a preset too big to run here.

    python benchmarks/driver/engine_step.py --preset cpu-tiny --steps 5
    python benchmarks/driver/engine_step.py --preset gpu-small --steps 5          # on one GPU
    python benchmarks/driver/engine_step.py --preset qwen3.5-397b-cell --lower-only --fake-devices 256
    python benchmarks/driver/engine_step.py --preset cpu-tiny --compare-expert-compute

A step is MICRO_STEPS fwd_bwd calls and one update, timed from the first dispatch to the update's
result being ready; compile happens before, off the clock, and the first step is reported as
warm-up. Prints step seconds (median and spread), tokens/s/device, model TFLOP/s/device and MFU
when the chip's peak is known (`rl_trainer_bench.chips.accelerators`).

Remakes BENCHMARKS.md's driver suite; benchmarks/reports/engine-step_cpu_2026-11-30.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-tiny")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
    parser.add_argument("--micro-steps", type=int, default=0, help="default: the preset's")
    parser.add_argument("--engine-flags", default="", help="key=value engine keys")
    parser.add_argument(
        "--lower-only", action="store_true", help="lower every program, run nothing"
    )
    parser.add_argument("--fake-devices", type=int, default=0, help="host CPU devices to fake")
    parser.add_argument(
        "--compare-expert-compute", action="store_true", help="time einsum vs ragged_dot experts"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    from rl_trainer_bench.config.engine_keys import engine_config_from
    from rl_trainer_bench.config.presets import preset

    cell = preset(args.preset)
    devices = args.fake_devices or cell.host_devices
    if devices:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
        )
    config, unapplied = engine_config_from(cell, engine_flags=args.engine_flags)
    if unapplied:
        print(f"keys not applied: {', '.join(unapplied)}")
    if args.lower_only:
        return lower(config)
    if args.compare_expert_compute:
        return compare_expert_compute(config)
    return time_steps(config, args.steps, args.micro_steps or cell.micro_steps)


def lower(config) -> int:
    import jax

    from rl_trainer_bench.engine.builtin.programs import lower_programs
    from rl_trainer_bench.engine.builtin.sharding import make_mesh

    mesh = make_mesh(config.mesh, jax.devices()[: config.mesh.size])
    before = len(jax.live_arrays())
    start = time.perf_counter()
    lowered = lower_programs(config, mesh)
    seconds = time.perf_counter() - start
    allocated = len(jax.live_arrays()) - before
    print(f"lowered {', '.join(lowered)} over {mesh.devices.size} {jax.default_backend()} devices")
    print(f"lowering seconds: {seconds:.1f}; arrays allocated: {allocated}")
    return 0 if allocated == 0 else 1


def compare_expert_compute(config) -> int:
    """Forward+backward of the expert SwiGLU on one group's buffer, by each method."""
    import jax
    import jax.numpy as jnp

    from rl_trainer_bench.engine.builtin import moe
    from rl_trainer_bench.engine.config import expert_capacity

    m = config.model
    tokens = config.micro_batch_rows * config.seq_len // config.mesh.size
    slots = expert_capacity(tokens, m.top_k, m.num_experts, config.moe.ragged_buffer_factor)
    dtype = jnp.dtype(m.dtype)
    keys = jax.random.split(jax.random.key(0), 4)
    buffer = jax.random.normal(keys[0], (m.num_experts, slots, m.d_model), dtype)
    gate, up = (
        jax.random.normal(k, (m.num_experts, m.d_model, m.expert_ffn_dim), dtype) for k in keys[1:3]
    )
    down = jax.random.normal(keys[3], (m.num_experts, m.expert_ffn_dim, m.d_model), dtype)
    flops = 3 * 3 * 2 * m.num_experts * slots * m.d_model * m.expert_ffn_dim  # fwd + bwd
    for method in moe.BUFFER_EXPERT_COMPUTE:
        step = jax.jit(
            jax.grad(
                lambda b, g, u, d, m=method: moe.experts_ffn(
                    b, moe.ExpertWeights((g, u), d), m
                ).sum(),
                (0, 1, 2, 3),
            )
        )
        jax.block_until_ready(step(buffer, gate, up, down))
        times = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(step(buffer, gate, up, down))
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        print(
            f"{method:10s} E={m.num_experts} C={slots} D={m.d_model} F={m.expert_ffn_dim}: "
            f"{median * 1e3:.2f} ms (min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}), "
            f"{flops / median / 1e12:.3f} TFLOP/s"
        )
    return 0


def time_steps(config, steps: int, micro_steps: int) -> int:
    import jax

    from rl_trainer_bench.chips.accelerators import chip_for_device_kind
    from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
    from rl_trainer_bench.engine.contract import example_payloads_for

    engine = JaxEngine(config, jax.devices()[: config.mesh.size])
    payloads = example_payloads_for(config, micro_steps, segment_len=min(config.seq_len, 2048))
    print(engine.info())
    compile_seconds = engine.compile(payloads[0])
    print("compile seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in compile_seconds.items()))
    flops = sum(engine.model_flops(p) for p in payloads)
    tokens = sum(int((p.segment_ids != 0).sum()) for p in payloads)
    devices = engine.mesh.devices.size
    chip = chip_for_device_kind(engine.info()["device_kind"])
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        for p in payloads:
            engine.fwd_bwd(p)
        engine.update()
        jax.block_until_ready(engine.completion_marker())
        times.append(time.perf_counter() - start)
        metrics = engine.get_metrics()
        label = "warm-up" if step == 0 else f"step {step}"
        print(
            f"{label}: {times[-1]:.3f} s, loss {metrics['loss']:.4f}, "
            f"overflow {metrics['overflow_count']}, replays {metrics['replay_count']}"
        )
    timed = times[1:]
    median = statistics.median(timed)
    tflops = flops / median / devices / 1e12
    line = (
        f"{config.micro_batch_rows}x{config.seq_len} x {micro_steps} micro-batches on "
        f"{devices} device(s): step {median:.3f} s (min {min(timed):.3f}, max {max(timed):.3f}), "
        f"{tokens / median / devices:,.0f} tokens/s/device, {tflops:.3g} model TFLOP/s/device"
    )
    if chip is not None:
        line += (
            f", MFU {tflops * 1e12 / chip.per_device(chip.peak_bf16_flops):.1%} of {chip.name} peak"
        )
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
