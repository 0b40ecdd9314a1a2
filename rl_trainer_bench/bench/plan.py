"""The plan of a run: every knob validated and the cell it times resolved, before any device work.

`rl-trainer-bench run --plan` (PLAN_ONLY=1) prints it and exits; every run resolves it first, so a
refusal that host work can make is made before the compile; and the renderer resolves it for the
exact environment a pod will get, so a render that succeeds never makes a pod that refuses its
knobs. The mesh is checked against TRAINER_SLICE, the slice the pod is rendered for, never against
the machine the plan happens to run on. Nothing here imports JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

from rl_trainer_bench.accelerators import TpuSlice
from rl_trainer_bench.bench.worker import refuse_stage_before_fused_update
from rl_trainer_bench.config.engine_keys import engine_config_from
from rl_trainer_bench.config.knobs import BenchConfig, driver_knobs
from rl_trainer_bench.engine.config import EngineConfig, config_problems
from rl_trainer_bench.errors import ConfigError

PLAN_PREFIX = "plan:"


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated run: its knobs, the engine config it builds and what was not applied."""

    config: BenchConfig
    engine: EngineConfig
    unapplied: tuple[str, ...]  # engine keys given that the built-in engine does not apply
    layout: str  # how the synthetic micro-batches are packed

    @property
    def trainer_slice(self) -> TpuSlice | None:
        return self.config.trainer_slice

    def cell(self) -> str:
        """One line naming the cell: preset, mesh, micro-batch shape and step."""
        mesh, engine = self.engine.mesh, self.engine
        return (
            f"{self.config.preset.name} mesh {mesh.fsdp} x {mesh.context} x {mesh.expert}"
            f" (fsdp x context x expert), micro-batch {engine.micro_batch_rows} rows of"
            f" {engine.seq_len:,} tokens, {self.config.micro_steps} micro-steps per step"
        )

    def lines(self) -> list[str]:
        """The plan as `run --plan` prints it."""
        config, engine, model = self.config, self.engine, self.engine.model
        mesh = engine.mesh
        target = (
            f"on {self.trainer_slice.name} ({self.trainer_slice.num_chips} chips)"
            if self.trainer_slice
            else "not checked against a slice (no TRAINER_SLICE)"
        )
        rows = [
            ("cell", self.cell()),
            ("preset", f"{config.preset.name} (chosen by {config.preset_source})"),
            (
                "model",
                f"layers={model.num_layers} d_model={model.d_model} heads={model.num_heads}"
                f" kv_heads={model.num_kv_heads} head_dim={model.head_dim}"
                f" experts={model.num_experts} top_k={model.top_k}"
                f" expert_ffn={model.expert_ffn_dim} shared_ffn={model.shared_expert_ffn_dim}"
                f" vocab={model.vocab_size}",
            ),
            (
                "mesh",
                f"{mesh.fsdp} x {mesh.context} x {mesh.expert} = {mesh.size} devices {target}",
            ),
            (
                "micro-batch",
                f"{engine.micro_batch_rows} rows of {engine.seq_len:,} tokens"
                f" ({engine.micro_batch_rows * engine.seq_len:,} tokens), packing: {self.layout}",
            ),
            (
                "step",
                f"micro_steps={config.micro_steps} steps={config.steps}"
                f" warmup_steps={config.warmup_steps} worker={config.worker}"
                f" stage={config.stage.describe()}",
            ),
            ("engine", config.engine),
            ("engine keys not applied", " ".join(self.unapplied) or "-"),
        ]
        return [f"{PLAN_PREFIX} {name}: {text}" for name, text in rows] + [
            f"{PLAN_PREFIX} ok: every knob is valid; nothing ran on a device"
        ]


def resolve(config: BenchConfig) -> Plan:
    """Validate what `config` asks for and resolve its cell; ConfigError naming the first problem."""
    refuse_stage_before_fused_update(config.worker, config.stage)
    engine, unapplied = engine_config_from(config.preset, config.trainer_argv, config.engine_flags)
    problems = config_problems(engine)
    if problems:
        raise ConfigError(
            f"engine config {problems[0]} (preset {config.preset.name} with TRAINER_ARGV and"
            " ENGINE_FLAGS applied): fix the key, or choose another PRESET"
        )
    _check_slice(engine, config.trainer_slice)
    return Plan(config, engine, tuple(unapplied), _layout(engine, config.orch_argv))


def environment_config(env: Mapping[str, str]) -> BenchConfig:
    """The knobs of a driver started with exactly `env` and no flags (what a pod runs)."""
    return BenchConfig.from_env(driver_knobs(env, argparse.Namespace()))


def _check_slice(engine: EngineConfig, tpu_slice: TpuSlice | None) -> None:
    """One JAX device per chip, as the chip table counts them."""
    mesh = engine.mesh
    if tpu_slice is not None and mesh.size != tpu_slice.num_chips:
        raise ConfigError(
            f"mesh {mesh.fsdp} x {mesh.context} x {mesh.expert} (fsdp x context x expert) needs"
            f" {mesh.size} devices, but TRAINER_SLICE={tpu_slice.name} has"
            f" {tpu_slice.num_chips} chips: set mesh_fsdp, mesh_context and mesh_expert to"
            " multiply to the chip count"
        )


def _layout(engine: EngineConfig, orch_argv: tuple[str, ...]) -> str:
    if not orch_argv:
        return "the routing profile's layout"
    from rl_trainer_bench.payload.packing import layout_from_orchestrator_argv

    layout = layout_from_orchestrator_argv(engine, orch_argv)
    return (
        f"from ORCH_ARGV, up to {int(layout.segments_per_row[-1])} sequences per row,"
        f" groups of {layout.group_size}"
    )
