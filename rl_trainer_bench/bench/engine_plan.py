"""What the plan says about the engine: which one, which MaxText, the loss, and why.

The plan's reader must know before anything runs whether the timed program is the trainer's. For
a MaxText trainer (config/engine_choice.py) the default is MaxText's engine with the trainer's
keys, and the plan names the MaxText (its version where it is importable, the trainer's image's
otherwise), the check of the trainer's keys (bench/maxtext_check.py) and the loss. When another
engine times a MaxText trainer (ENGINE set, or a model MaxText's engine cannot time here), the plan
says plainly that the program is not the trainer's and what differs: the kernels, the MoE
exchange and, for the built-in engine, the ratio of FLOPs it executes to the model's, from the
shape arithmetic of the pool's first micro-batch (engine/builtin/program_flops.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_trainer_bench.bench import maxtext_check
from rl_trainer_bench.chips.accelerators import chip_by_name
from rl_trainer_bench.config.engine_choice import maxtext_evidence
from rl_trainer_bench.config.engine_keys import trainer_key_fates
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import ONE_CHIP_PRESETS
from rl_trainer_bench.config.trainer_maxtext import (
    APPLICABLE,
    FLAG_PREFIX,
    NO_EQUIVALENT,
    TrainerKey,
    marked_from_flags,
    maxtext_fates,
)
from rl_trainer_bench.engine import extra_work
from rl_trainer_bench.engine.builtin.program_flops import builtin_fwd_bwd_flops
from rl_trainer_bench.engine.config import SORTED_EXPERT_COMPUTE, EngineConfig, ModelConfig
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.engine.maxtext import tunix_grpo
from rl_trainer_bench.engine.maxtext.keys import HELD_KEYS
from rl_trainer_bench.errors import ConfigError
from rl_trainer_bench.payload.build import first_segment_ids
from rl_trainer_bench.payload.packing import layout_from_orchestrator_argv
from rl_trainer_bench.payload.routing_profile import load_profile

# MaxText keys that choose a kernel, and MaxText keys that shape the MoE exchange: the trainer's
# values are quoted where another engine times it.
KERNEL_KEYS = (
    "attention",
    "use_tokamax_splash",
    "use_splash_scheduler",
    "use_gdn_kernel",
    "megablox",
    "sparse_matmul",
    "use_tokamax_gmm",
    "use_gmm_v2",
)
EXCHANGE_KEYS = ("custom_mesh_and_rule", "use_ring_of_experts", "use_ragged_sort")
# MaxText's mesh rule that runs the context axis as expert parallelism too (the tpu7x recipe's).
CONTEXT_AS_EXPERT = "cp-as-ep"

MAXTEXT_LOSS = (
    "MaxText's router-replay loss (token cross-entropy with the rollout's routes forced), through"
    " MaxText's training engine called by the adapter; not Tunix's GRPO loss and chunked log-prob"
    " pass: the per-token cost differs by a few element-wise ops, the matmuls are the same"
)
TUNIX_LOSS = (
    f"Tunix's GRPO loss (algo_core.grpo_loss_fn, {tunix_grpo.LOSS_AGG_MODE}, k3 KL, the rollout's"
    " routes replayed) through Tunix's TrainerWorker around MaxText's training engine, as a"
    " Tunix trainer with --trainer_backend=maxtext runs it"
)
BUILT_IN_LOSS = (
    "the built-in GRPO surrogate with its chunked log-prob pass (engine/builtin/loss.py)"
)

Facts = tuple[tuple[str, str], ...]


def trainer_key_fates_for(config: BenchConfig, engine: EngineConfig) -> tuple[TrainerKey, ...]:
    """Each MaxText key of the trainer's (and of ENGINE_FLAGS' `maxtext.KEY` words) with its fate
    on the engine that runs. On the built-in engine a `maxtext.KEY` it has no equivalent for is
    refused, naming the keys it can apply: an arm that sets one would time a copy of another arm.
    """
    flag_keys = config.engine_flags.maxtext
    if config.engine == MAXTEXT:
        fates = maxtext_fates(engine.trainer_maxtext_keys, HELD_KEYS)
        return tuple(marked_from_flags(fates, len(flag_keys)))
    fates = trainer_key_fates(config.trainer_argv, config.engine_flags)
    if config.engine == BUILT_IN:
        refused = [f for f in fates[len(fates) - len(flag_keys) :] if f.fate == NO_EQUIVALENT]
        if refused:
            raise ConfigError(
                f"ENGINE_FLAGS {' '.join(f'{FLAG_PREFIX}.{f.key}={f.value}' for f in refused)}:"
                f" the built-in engine has no equivalent; it applies"
                f" {', '.join(f'{FLAG_PREFIX}.{key}' for key in APPLICABLE)}; time MaxText's"
                " engine (ENGINE=maxtext) to set the others"
            )
    return tuple(fates)


def engine_facts(config: BenchConfig, engine: EngineConfig, in_pod_image: bool) -> Facts:
    """The plan's rows about the engine. `in_pod_image`: the plan runs where the run will (the
    pod, or `run --plan` on this host), so MaxText is looked for here; False when rendering."""
    rows = [("engine", f"{config.engine} ({config.engine_source})")]
    if config.engine == MAXTEXT:
        return (
            *rows,
            *_maxtext_rows(config, engine, in_pod_image),
            *maxtext_loss_rows(
                config.maxtext_driver, in_pod_image, engine.loss.compute_logps_chunk_size
            ),
        )
    rows.append(("loss", BUILT_IN_LOSS if config.engine == BUILT_IN else "the engine's own"))
    work = extra_work_line(config, engine)
    if work:
        rows.append(("extra device work", work))
    evidence = maxtext_evidence(config.trainer_argv)
    if evidence:
        rows += _not_the_trainers(config, engine, evidence)
    return tuple(rows)


def extra_work_line(config: BenchConfig, engine: EngineConfig) -> str | None:
    """extra_device_work's size, in FLOPs and as an ESTIMATE at the peak of the run's chip: the
    trainer slice's, else the one-chip preset's (none for a host preset); None without it."""
    if not engine.extra_device_work:
        return None
    chip = config.trainer_slice.chip if config.trainer_slice else None
    kind = next((k for k, name in ONE_CHIP_PRESETS.items() if name == config.preset.name), None)
    if chip is None and kind is not None:
        chip = chip_by_name(kind)
    return extra_work.describe(
        engine.extra_device_work,
        config.micro_steps,
        chip.name if chip else "",
        chip.per_device(chip.peak_bf16_flops) if chip else None,
    )


def _maxtext_rows(config: BenchConfig, engine: EngineConfig, in_pod_image: bool) -> Facts:
    if not in_pod_image:
        return (
            ("maxtext", "the trainer's image's, expected there (the bench embeds no MaxText)"),
            ("maxtext config", maxtext_check.IN_THE_POD),
        )
    builder = maxtext_check.installed_builder()
    if builder is None:
        return (
            ("maxtext", "not importable here: the run needs maxtext and Tunix installed"),
            ("maxtext config", "not checked: MaxText is not importable here"),
        )
    platform = "tpu" if config.trainer_slice is not None else "cpu"
    flag_keys = config.engine_flags.maxtext
    checked = maxtext_check.check_apart(engine, platform, len(flag_keys))
    return (("maxtext", f"maxtext {builder.version}, installed here"), ("maxtext config", checked))


def maxtext_loss_rows(driver: str, in_pod_image: bool, chunk_size: int) -> Facts:
    """Which loss runs through which calls on MaxText's engine, and why (MAXTEXT_DRIVER), and its
    log-prob pass for `compute_logps_chunk_size=chunk_size`. Where the plan cannot look into the
    trainer's image it says what is expected there."""
    if driver == tunix_grpo.MAXTEXT:
        return (("loss", f"{MAXTEXT_LOSS} (MAXTEXT_DRIVER=maxtext)"),)
    tunix_rows = (
        ("loss", TUNIX_LOSS),
        (
            "chunked log-prob pass",
            tunix_grpo.planned_chunked_pass(chunk_size),
        ),
    )
    if not in_pod_image:  # a rendered pod: the image is checked there, before the runtime starts
        return (
            (
                "loss",
                f"{TUNIX_LOSS} (MAXTEXT_DRIVER={driver}); checked in the pod: a pod whose image"
                " lacks Tunix's worker or loss refuses to start (MAXTEXT_DRIVER=maxtext times"
                " MaxText's own loss instead)",
            ),
            tunix_rows[1],
        )
    absent = tunix_grpo.tunix_absent()
    if absent is None:
        why = f" (MAXTEXT_DRIVER={driver}: Tunix's worker and loss are here)"
        return (("loss", TUNIX_LOSS + why), tunix_rows[1])
    if driver == tunix_grpo.TUNIX:
        raise ConfigError(
            f"MAXTEXT_DRIVER=tunix: {absent} here: put a Tunix checkout with tunix/experimental"
            " on PYTHONPATH, or set MAXTEXT_DRIVER=maxtext"
        )
    return (("loss", f"{MAXTEXT_LOSS} (MAXTEXT_DRIVER=auto: {absent} here)"),)


def _not_the_trainers(config: BenchConfig, engine: EngineConfig, evidence: str) -> Facts:
    keys = dict(engine.trainer_maxtext_keys)
    return (
        (
            "not the trainer's program",
            f"the trainer runs MaxText ({evidence}); this run times {config.engine}, another"
            " program: its step time is not the trainer's"
            + (
                " (unset ENGINE to time MaxText's engine)"
                if config.engine_source == "ENGINE"
                else ""
            ),
        ),
        ("differs: kernels", _kernels(config, engine, keys)),
        ("differs: MoE exchange", _exchange(engine, keys)),
        ("differs: FLOPs", _flops(config, engine)),
    )


def _quoted(keys: dict[str, str], names: Sequence[str]) -> str:
    set_here = [f"{name}={keys[name]}" for name in names if name in keys]
    return " ".join(set_here) if set_here else "MaxText's defaults for this model"


def _kernels(config: BenchConfig, engine: EngineConfig, keys: dict[str, str]) -> str:
    if config.engine != BUILT_IN:
        ours = "that engine's own"
    else:
        parts = [ATTENTION_KERNELS[engine.model.attention]]
        if "linear_attention" in engine.model.layer_types:
            parts.append(_gated_deltanet_kernel(engine.model))
        parts.append(_expert_kernel(engine.moe.expert_compute))
        ours = ", ".join(parts)
    return f"the trainer's: {_quoted(keys, KERNEL_KEYS)}; this run's: {ours}"


# What each `linear_chunk_inverse` choice runs, as the plan says it beside a trainer's MaxText.
GATED_DELTANET_KERNELS = {
    "xla": "the chunked Gated DeltaNet in XLA",
    "pallas": "the chunked Gated DeltaNet in XLA with its triangular inverses in a Pallas kernel",
}
# What `linear_chunk_kernel=pallas` runs instead of either.
GATED_DELTANET_CHUNK_KERNEL = "the chunked Gated DeltaNet in Pallas kernels, forward and backward"


# What `linear_conv_kernel=pallas` adds.
GATED_DELTANET_CONV_KERNEL = "its short convolutions in a Pallas kernel, forward and backward"


def _gated_deltanet_kernel(model: ModelConfig) -> str:
    """What runs the chunked Gated DeltaNet, as the kernels line says it."""
    if model.linear_chunk_kernel == "pallas":
        rule = GATED_DELTANET_CHUNK_KERNEL
    else:
        rule = GATED_DELTANET_KERNELS[model.linear_chunk_inverse]
    if model.linear_conv_kernel == "pallas":
        return f"{rule}, {GATED_DELTANET_CONV_KERNEL}"
    return rule


# What each `attention` choice runs, as the plan says it beside a trainer's MaxText, on TPUs (where
# `auto` is the XLA path).
ATTENTION_KERNELS = {
    "auto": "XLA attention over query chunks",
    "xla": "XLA attention over query chunks",
    "cudnn": "cuDNN's flash attention",
    "splash": "Pallas' splash attention kernel",
}


def _expert_kernel(expert_compute: str) -> str:
    if expert_compute in SORTED_EXPERT_COMPUTE:
        kernel = SORTED_EXPERT_COMPUTE[expert_compute]
        return f"the routed pairs sorted by expert through {kernel}, drops as in E x C buffers"
    matmul = "ragged_dot" if expert_compute == "ragged_dot" else "einsum"
    return f"a capacity-padded {matmul} for the experts (a grouped matmul only in the replay)"


def _exchange(engine: EngineConfig, keys: dict[str, str]) -> str:
    mesh = engine.mesh
    trainer = _quoted(keys, EXCHANGE_KEYS)
    if keys.get("custom_mesh_and_rule") == CONTEXT_AS_EXPERT:
        trainer += f" (experts over context x expert = {mesh.context * mesh.expert} shards)"
    ours = (
        f"experts over the expert axis ({mesh.expert} shards), one all-to-all each way per group"
        " of tokens"
        if mesh.expert > 1
        else "no expert axis: every device runs every expert on its own tokens"
    )
    return f"the trainer's: {trainer}; the built-in engine's: {ours}"


def _flops(config: BenchConfig, engine: EngineConfig) -> str:
    if config.engine != BUILT_IN:
        return "not known to the bench: that engine's program is its own"
    profile = load_profile(config.routing_profile, config.preset.routing_profile)
    layout = None
    if config.orch_argv:
        layout = layout_from_orchestrator_argv(engine, config.orch_argv)
    flops = builtin_fwd_bwd_flops(engine, first_segment_ids(engine, profile, config.seed, layout))
    parts = [f"experts {flops.expert_ratio:.2f}x the routed work"]
    if flops.attention_ratio:
        parts.append(f"attention {flops.attention_ratio:.2f}x the causal work, every key scored")
    return (
        f"the built-in fwd_bwd executes {flops.ratio:.2f}x the model FLOPs of the pool's first"
        f" micro-batch, by shape arithmetic ({'; '.join(parts)})"
    )
