"""The engine's three programs as pure functions, their state and inputs, and their lowering.

`fwd_bwd` (one micro-batch's gradient and statistics, added into the step's running sums),
`fwd_bwd_dropless` (the same with no pair dropped, run only to replay a micro-batch that dropped
pairs) and `update` (divides by the step's token count, clips, applies AdamW). `JaxEngine` runs
them; `lower_programs` and `abstract_state` give the AOT check the same programs on abstract inputs
without allocating anything (docs/engine.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_trainer_bench.engine import extra_work, residency
from rl_trainer_bench.engine.abstract_inputs import payload_spec, platform_of
from rl_trainer_bench.engine.builtin import model, moe, parameters, sharding
from rl_trainer_bench.engine.builtin.loss import micro_batch_loss
from rl_trainer_bench.engine.config import (
    DROPLESS,
    EngineConfig,
    OptimizerConfig,
    config_problems,
    replays_possible,
    tpu_kernel_refusal,
)
from rl_trainer_bench.engine.contract import ContractError, Payload
from rl_trainer_bench.engine.payload_shapes import extra_bytes_per_token

# The dropless replay's program: run only for a micro-batch that dropped pairs.
REPLAY = "fwd_bwd_dropless"


class StepStat(NamedTuple):
    """A statistic a micro-batch reports and the step keeps: its dtype and how values combine."""

    dtype: Any
    combine: Callable[[jax.Array, jax.Array], jax.Array]


# Each micro-batch's `fwd_bwd` combines these into the step's values and `update` reports them (with
# the loss and gradient norm) as the step's metrics.
STEP_STATS: Mapping[str, StepStat] = {
    "loss_sum": StepStat(jnp.float32, jnp.add),
    "loss_denominator": StepStat(jnp.float32, jnp.add),  # loss tokens
    "tokens": StepStat(jnp.int32, jnp.add),  # non-padding tokens
    "overflow_count": StepStat(jnp.int32, jnp.add),  # micro-batches that dropped a pair
    "mult_prob_error_max": StepStat(jnp.float32, jnp.maximum),
}


class TrainState(NamedTuple):
    """What stays on the device between programs."""

    params: Any
    opt_state: Any
    grad_sum: Any  # the step's gradient so far, not yet divided by its token count
    step_stats: dict[str, jax.Array]


class Accumulated(NamedTuple):
    """`fwd_bwd`'s outputs: the step's sums with the micro-batch in, and whether it dropped pairs.

    `overflow` is a scalar of its own, for the host's replay decision and for the completion
    marker: the sums are donated to the next program, so a watcher could find them deleted.
    """

    grad_sum: Any
    step_stats: dict[str, jax.Array]
    overflow: jax.Array  # int32: 1 when the micro-batch dropped a routed pair
    # `extra_outputs` (None without extra work or bytes): returned, so XLA must compute it; unread.
    extra_work: jax.Array | None = None


class Updated(NamedTuple):
    """`update`'s outputs: the next state (zero gradient sum and statistics) and the step's metrics."""

    state: TrainState
    metrics: dict[str, jax.Array]


class Programs(NamedTuple):
    """The pure functions `lower_programs` compiles."""

    fwd_bwd: Callable[..., Accumulated]  # (params, grad_sum, step_stats, batch, capacity_factor)
    update: Callable[[TrainState], Updated]


# ----------------------------------------------------------------------------------------------
# Config and input checks
# ----------------------------------------------------------------------------------------------


def check_config(config: EngineConfig) -> None:
    """Raise ContractError naming the field when the config cannot be built or laid out on the mesh."""
    problems = config_problems(config)
    if problems:
        raise ContractError(f"engine config {problems[0]}")


def check_payload(payload: Payload, spec: Mapping[str, jax.ShapeDtypeStruct]) -> None:
    """Raise ContractError naming the first field whose presence, dtype or shape breaks `spec`."""
    arrays = payload.arrays()
    for name, expected in spec.items():
        if name not in arrays:
            raise ContractError(
                f"payload {payload.name}: field {name} is missing; this engine's programs take "
                f"{', '.join(spec)}"
            )
        array = arrays[name]
        if array.dtype != expected.dtype or tuple(array.shape) != tuple(expected.shape):
            raise ContractError(
                f"payload {payload.name}: field {name} is {array.dtype}{list(array.shape)}, "
                f"expected {expected.dtype}{list(expected.shape)}"
            )
    extra = sorted(set(arrays) - set(spec))
    if extra:
        raise ContractError(
            f"payload {payload.name}: field {extra[0]} is present but the engine was compiled "
            f"without it; compile with a payload that carries it (or drop it)"
        )


def check_routes(routed_experts: np.ndarray, num_experts: int, name: str) -> None:
    """Expert ids must be -1 (empty slot) or in [0, num_experts)."""
    low, high = int(routed_experts.min()), int(routed_experts.max())
    if low < -1 or high >= num_experts:
        bad = low if low < -1 else high
        raise ContractError(
            f"payload {name}: field routed_experts holds expert id {bad}; ids must be -1 "
            f"(empty slot) or in 0..{num_experts - 1}"
        )


# ----------------------------------------------------------------------------------------------
# The programs as pure functions
# ----------------------------------------------------------------------------------------------


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the configured schedule."""
    if config.schedule == "warmup_cosine_decay_schedule":
        schedule = optax.warmup_cosine_decay_schedule(
            init_value=config.init_value,
            peak_value=config.peak_value,
            warmup_steps=config.warmup_steps,
            decay_steps=config.decay_steps,
            end_value=config.end_value,
        )
    else:
        schedule = optax.constant_schedule(config.learning_rate)
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(
            schedule,
            config.b1,
            config.b2,
            config.eps,
            mu_dtype=jnp.dtype(config.mu_dtype),
            weight_decay=config.weight_decay,
        ),
    )


class Methods(NamedTuple):
    """The implementation choices of a config once `auto` is resolved for a platform."""

    attention: str
    expert_compute: str
    dropless_compute: str
    pair_ranking: str
    linear_chunk_inverse: str
    linear_chunk_kernel: str
    linear_conv_kernel: str
    prefuse_moe_weights: bool
    keep_moe_gate_up: bool


def resolved_methods(config: EngineConfig, platform: str) -> Methods:
    """Every `auto` choice resolved for `platform`; a TPU kernel is refused elsewhere."""
    refusal = tpu_kernel_refusal(config, platform)
    if refusal:
        raise ContractError(refusal)
    return Methods(
        model.attention_method(config.model.attention, platform),
        moe.expert_compute_for(config.moe.expert_compute, platform),
        moe.dropless_compute_for(config.moe.dropless_compute, platform),
        moe.pair_ranking_for(config.moe.pair_ranking, config.model.num_experts),
        config.model.linear_chunk_inverse,
        config.model.linear_chunk_kernel,
        config.model.linear_conv_kernel,
        config.moe.prefuse_moe_weights,
        config.moe.keep_moe_gate_up,
    )


def zero_stats() -> dict[str, jax.Array]:
    """The step's statistics before its first micro-batch."""
    return {name: jnp.zeros((), stat.dtype) for name, stat in STEP_STATS.items()}


def accumulated(grad_sum, step_stats, stats, kept, extra=None) -> Accumulated:
    """The step's sums, the gradient's already summed, with the micro-batch's statistics added
    where `kept`; its overflow count is added either way, so a micro-batch that is replayed
    counts it once."""
    step_stats = {
        name: jnp.where(
            True if name == "overflow_count" else kept,
            stat.combine(step_stats[name], stats[name]),
            step_stats[name],
        )
        for name, stat in STEP_STATS.items()
    }
    return Accumulated(grad_sum, step_stats, stats["overflow_count"], extra)


def extra_outputs(params, batch, config: EngineConfig) -> jax.Array | None:
    """What `fwd_bwd` returns beside its sums so XLA must compute it, one float32 scalar (None
    with neither): `extra_device_work`'s matmul chain and the sum of `extra_host_bytes`' filler,
    which makes the program read the whole array, so its copy is the program's input like any
    other. Neither reaches the loss or the gradient."""
    parts = [extra_matmuls(params, config)]
    if extra_bytes_per_token(config):
        parts.append(jnp.sum(batch["extra_host_bytes"], dtype=jnp.float32))
    present = [part for part in parts if part is not None]
    return sum(present[1:], present[0]) if present else None


def extra_matmuls(params, config: EngineConfig) -> jax.Array | None:
    """`extra_device_work`: its chain of square matmuls (engine/extra_work.py), reduced to one
    float32 scalar (None without it). The matrix is the sine of a fixed pattern shifted by a
    parameter's sum, so XLA can fold none of it at compile time; scaled by 1/side, so the chain
    stays finite. Computed from `params` outside the loss, it leaves the loss and gradient as
    they were."""
    side, count = extra_work.matmuls(config.extra_device_work)
    if not count:
        return None
    dtype = jnp.dtype(config.model.dtype)
    shift = jnp.sum(params["final_norm"])
    pattern = jax.lax.broadcasted_iota(jnp.float32, (side, side), 0) * 0.37 + (
        jax.lax.broadcasted_iota(jnp.float32, (side, side), 1) * 0.11
    )
    matrix = (jnp.sin(pattern + shift) / side).astype(dtype)
    product = matrix
    for _ in range(count):  # unrolled: XLA's cost analysis counts a loop's body once
        product = jnp.dot(product, matrix, preferred_element_type=jnp.float32).astype(dtype)
    return jnp.sum(product.astype(jnp.float32))


def has_extra_outputs(config: EngineConfig) -> bool:
    """Whether `fwd_bwd` returns `extra_outputs` (its output sharding needs one then)."""
    return bool(config.extra_device_work or extra_bytes_per_token(config))


def gradient_summed(params, grad_sum, batch, capacity_factor, config: EngineConfig, methods):
    """The step's gradient sum with one micro-batch's gradient added, the micro-batch's
    statistics, and whether they count (`kept`: False for a micro-batch a dropless replay will
    run again, which adds only its overflow count; its replay adds the rest).

    The layer weights are constants of the differentiated function: their gradient reaches the
    sum through `sums`, added layer by layer in the backward pass (`model.decoder`). The others
    (embedding, head, final norm) are differentiated as usual and added after. A micro-batch that
    is not kept differentiates a loss whose cotangent is 0: it adds zeros (exact where its
    gradient is finite).
    """
    layered = {n: w for n, w in params.items() if parameters.PARAMETERS[n].layered}
    others = {n: w for n, w in params.items() if n not in layered}

    def objective(others, sums):
        hidden, overflow, sums = model.decoder(
            {**layered, **others},
            batch,
            config.model,
            capacity_factor=capacity_factor,
            token_chunks=config.moe.token_chunks,
            methods=methods,
            sums=sums,
        )
        loss_sum, stats = micro_batch_loss(hidden, others["head"], batch, config.loss)
        return (loss_sum, sums), (stats, overflow)

    layer_sums = {n: grad_sum[n] for n in layered}
    (loss_sum, _), pull, (stats, overflow) = jax.vjp(objective, others, layer_sums, has_aux=True)
    stats = {
        **stats,
        "loss_sum": loss_sum,
        "tokens": jnp.sum(batch["segment_ids"] != 0, dtype=jnp.int32),
        "overflow_count": overflow.astype(jnp.int32),
    }
    replayed_later = replays_possible(config) and capacity_factor != DROPLESS
    kept = jnp.logical_not(overflow) if replayed_later else jnp.bool_(True)
    d_others, summed = pull((kept.astype(loss_sum.dtype), layer_sums))
    return summed | {n: grad_sum[n] + d_others[n] for n in others}, stats, kept


def build_programs(config: EngineConfig, methods: Methods, opt_state_on_device=None) -> Programs:
    """The programs as pure functions of arrays, traced under the mesh they run on.

    opt_state_on_device: with the optimizer state offloaded to host memory, its shardings in
    device memory, where `update` moves it before using it (its output goes back to the host).
    """
    optimizer = make_optimizer(config.optimizer)

    def fwd_bwd(params, grad_sum, step_stats, batch, capacity_factor) -> Accumulated:
        summed, stats, kept = gradient_summed(
            params, grad_sum, batch, capacity_factor, config, methods
        )
        return accumulated(summed, step_stats, stats, kept, extra_outputs(params, batch, config))

    def update(state: TrainState) -> Updated:
        denominator = jnp.maximum(state.step_stats["loss_denominator"], 1.0)
        grads = jax.tree.map(lambda g: g / denominator, state.grad_sum)
        opt_state = state.opt_state
        if opt_state_on_device is not None:
            opt_state = jax.device_put(opt_state, opt_state_on_device)
        updates, opt_state = optimizer.update(grads, opt_state, state.params)
        metrics = {
            **state.step_stats,
            "loss": state.step_stats["loss_sum"] / denominator,
            "grad_norm": optax.tree.norm(grads),
        }
        zeros = jax.tree.map(jnp.zeros_like, state.grad_sum)
        params = optax.apply_updates(state.params, updates)
        return Updated(TrainState(params, opt_state, zeros, zero_stats()), metrics)

    return Programs(fwd_bwd, update)


# ----------------------------------------------------------------------------------------------
# State, shardings and lowering (nothing allocated)
# ----------------------------------------------------------------------------------------------


def initial_state(config: EngineConfig) -> TrainState:
    """Parameters from the seed, a fresh optimizer state, a zero gradient sum and zero stats."""
    params = model.init_params(config.model, jax.random.key(config.seed))
    opt_state = make_optimizer(config.optimizer).init(params)
    return TrainState(params, opt_state, jax.tree.map(jnp.zeros_like, params), zero_stats())


def state_shapes(config: EngineConfig) -> TrainState:
    """The state as ShapeDtypeStructs (no sharding)."""
    return jax.eval_shape(functools.partial(initial_state, config))


def state_shardings(config: EngineConfig, mesh, shapes: TrainState | None = None) -> TrainState:
    """Where every leaf of the state rests between programs: optimizer moments follow their
    parameter, in pinned host memory with `optimizer_memory_host_offload`."""
    shapes = state_shapes(config) if shapes is None else shapes
    params = sharding.parameter_shardings(mesh, shapes.params)
    replicated = sharding.named(mesh, sharding.REPLICATED)
    opt_state = optax.tree_map_params(
        make_optimizer(config.optimizer),
        lambda _, s: s,
        shapes.opt_state,
        params,
        transform_non_params=lambda _: replicated,
    )
    if config.optimizer.memory_host_offload:
        opt_state = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), opt_state)
    stats = jax.tree.map(lambda _: replicated, shapes.step_stats)
    return TrainState(params, opt_state, params, stats)


def abstract_state(config: EngineConfig, mesh) -> dict[str, Any]:
    """What stays between programs, as sharded ShapeDtypeStructs (their memory kind says where)."""
    shapes = state_shapes(config)
    shardings = state_shardings(config, mesh, shapes)

    def attach(shape, s):
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=s)

    abstract = jax.tree.map(attach, shapes, shardings)
    return {
        "params": abstract.params,
        "opt_state": abstract.opt_state,
        "grad_accum": abstract.grad_sum,
    }


def sharded_micro_batch(config: EngineConfig, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """One micro-batch as sharded ShapeDtypeStructs, as the programs take it on `mesh`."""
    spec = payload_spec(config)
    shardings = input_shardings(mesh, spec)
    return {
        n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=shardings[n]) for n, s in spec.items()
    }


def state_beside(config: EngineConfig, mesh, stage_before_update: bool = True) -> dict[str, int]:
    """Per-device bytes of each part of the state that stays on the device (`residency`)."""
    return residency.state_bytes(
        abstract_state(config, mesh),
        sharded_micro_batch(config, mesh),
        stage_before_update=stage_before_update,
    )


def compile_reservations(config: EngineConfig, mesh) -> dict[str, int]:
    """Per program, the device bytes the state beside it holds while it runs: what the engine
    tells XLA to leave free (`residency.compile_options`). The staged micro-batch is counted: the
    engine cannot know whether the driver will stage, and one micro-batch is small beside the
    rest (20 MiB per device for the Qwen3.5 cell)."""
    state = state_beside(config, mesh, stage_before_update=True)
    return {name: residency.beside(name, state) for name in residency.BESIDE}


def input_shardings(mesh, spec: Mapping[str, jax.ShapeDtypeStruct]):
    """Where each payload array goes: rows over (fsdp, expert), tokens over context."""
    return {name: sharding.payload_sharding(mesh, len(s.shape)) for name, s in spec.items()}


def jitted_programs(config: EngineConfig, mesh, spec) -> dict[str, tuple[Any, tuple]]:
    """Every program jitted with its shardings, beside the abstract arguments to lower it on."""
    shapes = state_shapes(config)
    shardings = state_shardings(config, mesh, shapes)
    on_device = None
    if config.optimizer.memory_host_offload:
        on_device = jax.tree.map(lambda s: s.with_memory_kind("device"), shardings.opt_state)
    programs = build_programs(config, resolved_methods(config, platform_of(mesh)), on_device)
    replicated = sharding.named(mesh, sharding.REPLICATED)
    sums = (shardings.grad_sum, shardings.step_stats)

    def fwd_bwd_at(factor, name):
        def program(params, grad_sum, stats, batch):
            return programs.fwd_bwd(params, grad_sum, stats, batch, factor)

        # The compiled module is named after the program (jit_fwd_bwd, jit_fwd_bwd_dropless), as
        # a profiler trace and XLA's dump name it; two programs both `jit__lambda` are told
        # apart by neither.
        program.__name__ = program.__qualname__ = name
        return jax.jit(
            program,
            in_shardings=(shardings.params, *sums, input_shardings(mesh, spec)),
            out_shardings=Accumulated(
                *sums, replicated, replicated if has_extra_outputs(config) else None
            ),
            donate_argnums=(1, 2),
        )

    arguments = (shapes.params, shapes.grad_sum, shapes.step_stats, spec)
    jitted = {"fwd_bwd": (fwd_bwd_at(config.moe.ragged_buffer_factor, "fwd_bwd"), arguments)}
    if replays_possible(config):
        jitted[REPLAY] = (fwd_bwd_at(DROPLESS, REPLAY), arguments)
    jitted["update"] = (
        jax.jit(
            programs.update,
            in_shardings=(shardings,),
            out_shardings=Updated(shardings, replicated),
            donate_argnums=(0,),
        ),
        (shapes,),
    )
    return jitted


def lower_programs(
    config: EngineConfig,
    mesh,
    spec: Mapping[str, jax.ShapeDtypeStruct] | None = None,
) -> dict[str, jax.stages.Lowered]:
    """Lower every program on abstract inputs sharded over `mesh`; nothing is allocated.

    Returns `fwd_bwd`, `update`, and `fwd_bwd_dropless` when a replay can happen
    (`replays_possible`). `spec` defaults to `payload_spec(config)`.
    """
    return dict(lowered_one_by_one(config, mesh, spec))


def lowered_one_by_one(
    config: EngineConfig,
    mesh,
    spec: Mapping[str, jax.ShapeDtypeStruct] | None = None,
    wanted: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[str, jax.stages.Lowered]]:
    """`lower_programs`' programs, each as soon as it is lowered: a caller compiles the first
    while the next are traced and lowered (tracing holds the GIL, XLA's compile does not).
    `wanted(name)`, asked just before a program would be lowered, leaves it out when false."""
    check_config(config)
    spec = payload_spec(config) if spec is None else spec
    jitted = jitted_programs(config, mesh, spec)  # outside the mesh: optax evaluates eagerly
    for name, (program, args) in jitted.items():
        if wanted(name):
            yield name, _lowered(config, mesh, program, args)


def lowered_program(
    config: EngineConfig, mesh, spec: Mapping[str, jax.ShapeDtypeStruct], name: str
) -> jax.stages.Lowered:
    """One of `lower_programs`' programs lowered alone (the engine's deferred replay)."""
    check_config(config)
    program, args = jitted_programs(config, mesh, spec)[name]
    return _lowered(config, mesh, program, args)


def _lowered(config: EngineConfig, mesh, program, args) -> jax.stages.Lowered:
    precision = None if config.matmul_precision == "default" else config.matmul_precision
    with jax.set_mesh(mesh), jax.default_matmul_precision(precision):
        return program.lower(*args)
