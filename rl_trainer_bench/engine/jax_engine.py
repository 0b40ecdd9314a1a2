"""JaxEngine: the built-in trainer engine, four ahead-of-time compiled programs behind the contract.

Programs: `fwd_bwd` (gradient and statistics of one micro-batch), `fwd_bwd_dropless` (the same at
capacity = tokens, run only to replay a micro-batch that dropped pairs), `accumulate` (adds a
micro-batch's gradient into the step's sum) and `update` (divides by the step's token count, clips,
applies AdamW). Gradients are accumulated one micro-batch late when dropless retry is on: the
overflow flag of micro-batch i is read on the host only after i + 1 was dispatched, so the device
stays busy while the host waits (ENGINE.md); with retry off nothing is ever read back.

`lower_programs`, `abstract_state` and `payload_spec` give the AOT check the same programs on
abstract inputs, without allocating anything.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_trainer_bench.engine import mesh as sharding
from rl_trainer_bench.engine import model, moe
from rl_trainer_bench.engine.contract import PAYLOAD_FIELDS, ContractError, Payload
from rl_trainer_bench.engine.engine_config import EngineConfig, MeshConfig, OptimizerConfig
from rl_trainer_bench.engine.loss import micro_batch_loss

log = logging.getLogger(__name__)

STEP_STATS = {  # the step's running statistics on the device, and their dtypes
    "loss_sum": jnp.float32,
    "loss_denominator": jnp.float32,
    "tokens": jnp.int32,
    "overflow_count": jnp.int32,
    "mult_prob_error_max": jnp.float32,
}


# ----------------------------------------------------------------------------------------------
# Shapes and checks
# ----------------------------------------------------------------------------------------------


def check_config(config: EngineConfig) -> None:
    """Raise ContractError naming the field when the shapes cannot be laid out on the mesh."""
    m, mesh, rows, seq = config.model, config.mesh, config.micro_batch_rows, config.seq_len
    checks = [
        (rows % sharding.row_groups(mesh) == 0, "micro_batch_rows", rows,
         f"a multiple of mesh fsdp x expert = {sharding.row_groups(mesh)}"),
        (seq % mesh.context == 0, "seq_len", seq, f"a multiple of mesh context = {mesh.context}"),
        (m.d_model % mesh.fsdp == 0, "d_model", m.d_model, f"a multiple of mesh fsdp = {mesh.fsdp}"),
        (m.num_experts % mesh.expert == 0, "num_experts", m.num_experts,
         f"a multiple of mesh expert = {mesh.expert}"),
        (m.num_heads % m.num_kv_heads == 0, "num_heads", m.num_heads,
         f"a multiple of num_kv_heads = {m.num_kv_heads}"),
        (m.head_dim % 2 == 0, "head_dim", m.head_dim, "even (rotary rotates half-dims)"),
        (0 < m.top_k <= m.num_experts, "top_k", m.top_k, f"in 1..num_experts = {m.num_experts}"),
        (m.remat_policy in (*model.REMAT_POLICIES, "none"), "remat_policy", m.remat_policy,
         f"one of {', '.join((*model.REMAT_POLICIES, 'none'))}"),
        (m.attention in model.ATTENTION_CHOICES, "attention", m.attention,
         f"one of {', '.join(model.ATTENTION_CHOICES)}"),
        (config.moe.expert_compute in ("auto", *moe.EXPERT_COMPUTE_CHOICES), "expert_compute",
         config.moe.expert_compute, f"one of auto, {', '.join(moe.EXPERT_COMPUTE_CHOICES)}"),
        (config.moe.ragged_buffer_factor == -1 or config.moe.ragged_buffer_factor > 0,
         "ragged_buffer_factor", config.moe.ragged_buffer_factor, "positive, or -1 for dropless"),
        (bool(m.layer_types) and set(m.layer_types) <= set(model.LAYER_TYPES), "layer_types",
         m.layer_types, f"a non-empty sequence of {', '.join(model.LAYER_TYPES)}"),
        (m.num_layers % max(len(m.layer_types), 1) == 0, "num_layers", m.num_layers,
         f"a multiple of len(layer_types) = {len(m.layer_types)}"),
    ]  # fmt: skip
    if "linear_attention" in m.layer_types:
        checks += [
            (min(m.linear_num_key_heads, m.linear_key_head_dim, m.linear_value_head_dim,
                 m.linear_conv_kernel_dim, m.linear_chunk_size) > 0, "linear_* shapes",
             (m.linear_num_key_heads, m.linear_key_head_dim, m.linear_value_head_dim,
              m.linear_conv_kernel_dim, m.linear_chunk_size), "positive with linear_attention layers"),
            (m.linear_num_value_heads > 0
             and m.linear_num_value_heads % max(m.linear_num_key_heads, 1) == 0,
             "linear_num_value_heads", m.linear_num_value_heads,
             f"a positive multiple of linear_num_key_heads = {m.linear_num_key_heads}"),
        ]  # fmt: skip
    per_shard = seq // max(mesh.context, 1)
    for name, chunk in (
        ("compute_logps_chunk_size", config.loss.compute_logps_chunk_size),
        ("attention_chunk_size", m.attention_chunk_size),
    ):
        divides = per_shard % min(chunk, per_shard) == 0
        checks.append((divides, name, chunk, f"a divisor of seq_len / mesh context = {per_shard}"))
    for ok, name, value, allowed in checks:
        if not ok:
            raise ContractError(f"engine config {name}={value!r}: must be {allowed}")


def payload_spec(config: EngineConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one micro-batch as the engine's programs take it."""
    b, t = config.micro_batch_rows, config.seq_len
    spec = {
        name: jax.ShapeDtypeStruct((b, t), PAYLOAD_FIELDS[name][0])
        for name in PAYLOAD_FIELDS
        if PAYLOAD_FIELDS[name][1] == 2 and name != "ref_logps"
    }
    if config.loss.beta > 0:
        spec["ref_logps"] = jax.ShapeDtypeStruct((b, t), PAYLOAD_FIELDS["ref_logps"][0])
    if config.moe.router_replay:
        shape = (b, t, config.model.num_layers, config.model.top_k)
        spec["routed_experts"] = jax.ShapeDtypeStruct(shape, PAYLOAD_FIELDS["routed_experts"][0])
    return spec


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
        optax.adamw(schedule, config.b1, config.b2, config.eps, weight_decay=config.weight_decay),
    )


def _platform_of(mesh) -> str:
    devices = getattr(mesh, "devices", None)
    if isinstance(devices, np.ndarray):
        return devices.flat[0].platform
    return jax.default_backend()


def resolved_methods(config: EngineConfig, platform: str) -> tuple[str, str]:
    """(attention, expert compute) after resolving `auto` for `platform`."""
    return (
        model.attention_method(config.model.attention, platform),
        moe.expert_compute_for(config.moe.expert_compute, platform),
    )


def _programs(config: EngineConfig, mesh_config: MeshConfig, methods: tuple[str, str]):
    """The four programs as pure functions of arrays."""
    optimizer = make_optimizer(config.optimizer)

    def fwd_bwd(params, batch, capacity_factor):
        def objective(p):
            hidden, overflow = model.decoder(
                p,
                batch,
                config.model,
                capacity_factor=capacity_factor,
                mesh_config=mesh_config,
                methods=methods,
            )
            loss_sum, stats = micro_batch_loss(
                hidden, p["head"], batch, config.loss, mesh_config.context
            )
            return loss_sum, (stats, overflow)

        (loss_sum, (stats, overflow)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        tokens = jnp.sum(batch["segment_ids"] != 0, dtype=jnp.int32)
        return grads, {"loss_sum": loss_sum, "overflow": overflow, "tokens": tokens, **stats}

    def accumulate(grad_sum, step_stats, grads, stats):
        grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
        step_stats = {
            "loss_sum": step_stats["loss_sum"] + stats["loss_sum"],
            "loss_denominator": step_stats["loss_denominator"] + stats["loss_denominator"],
            "tokens": step_stats["tokens"] + stats["tokens"],
            "overflow_count": step_stats["overflow_count"] + stats["overflow"].astype(jnp.int32),
            "mult_prob_error_max": jnp.maximum(
                step_stats["mult_prob_error_max"], stats["mult_prob_error_max"]
            ),
        }
        # A scalar of its own for the completion marker: the other outputs are donated to the next
        # program, so a watcher could find them deleted before it has waited on them.
        return grad_sum, step_stats, step_stats["loss_sum"]

    def update(params, opt_state, grad_sum, step_stats):
        denominator = jnp.maximum(step_stats["loss_denominator"], 1.0)
        grads = jax.tree.map(lambda g: g / denominator, grad_sum)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {
            **step_stats,
            "loss": step_stats["loss_sum"] / denominator,
            "grad_norm": grad_norm,
        }
        zeros = jax.tree.map(jnp.zeros_like, grad_sum)
        return params, opt_state, zeros, zero_stats(), metrics

    return optimizer, fwd_bwd, accumulate, update


def zero_stats() -> dict[str, jax.Array]:
    return {name: jnp.zeros((), dtype) for name, dtype in STEP_STATS.items()}


# ----------------------------------------------------------------------------------------------
# Abstract state and lowering (no allocation)
# ----------------------------------------------------------------------------------------------


def _abstract_params(config: EngineConfig):
    return jax.eval_shape(functools.partial(model.init_params, config.model), jax.random.key(0))


def _state_shardings(config: EngineConfig, mesh):
    """Shardings of params, optimizer state, gradient sum and step stats."""
    params = _abstract_params(config)
    param_shardings = sharding.parameter_shardings(mesh, params)
    replicated = sharding.named(mesh, sharding.REPLICATED)
    optimizer = make_optimizer(config.optimizer)
    opt_shapes = jax.eval_shape(optimizer.init, params)
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, s: s,
        opt_shapes,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    stats = jax.tree.map(lambda _: replicated, zero_stats())
    return params, opt_shapes, param_shardings, opt_shardings, stats


def abstract_state(config: EngineConfig, mesh) -> dict[str, Any]:
    """What stays in device memory between programs, as sharded ShapeDtypeStructs."""
    params, opt_shapes, param_shardings, opt_shardings, _ = _state_shardings(config, mesh)

    def attach(shape, s):
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=s)

    abstract_params = jax.tree.map(attach, params, param_shardings)
    return {
        "params": abstract_params,
        "opt_state": jax.tree.map(attach, opt_shapes, opt_shardings),
        "grad_accum": abstract_params,
    }


def _input_shardings(mesh, spec: Mapping[str, jax.ShapeDtypeStruct], memory_kind=None):
    return {
        name: sharding.payload_sharding(mesh, len(s.shape), memory_kind) for name, s in spec.items()
    }


def lower_programs(
    config: EngineConfig,
    mesh,
    spec: Mapping[str, jax.ShapeDtypeStruct] | None = None,
) -> dict[str, jax.stages.Lowered]:
    """Lower every program on abstract inputs sharded over `mesh`; nothing is allocated.

    Returns `fwd_bwd`, `accumulate`, `update`, and `fwd_bwd_dropless` when a replay can happen
    (retry on and a finite buffer factor). `spec` defaults to `payload_spec(config)`.
    """
    check_config(config)
    spec = payload_spec(config) if spec is None else spec
    methods = resolved_methods(config, _platform_of(mesh))
    _, fwd_bwd, accumulate, update = _programs(config, sharding.mesh_config_of(mesh), methods)
    params, opt_shapes, param_shardings, opt_shardings, stat_shardings = _state_shardings(
        config, mesh
    )
    inputs = _input_shardings(mesh, spec)
    replicated = sharding.named(mesh, sharding.REPLICATED)
    grad_out = (param_shardings, replicated)  # grads, per-micro-batch stats
    stats_shapes = jax.eval_shape(zero_stats)
    micro_stats_shapes = {
        "loss_sum": jax.ShapeDtypeStruct((), jnp.float32),
        "overflow": jax.ShapeDtypeStruct((), jnp.bool_),
        "tokens": jax.ShapeDtypeStruct((), jnp.int32),
        "loss_denominator": jax.ShapeDtypeStruct((), jnp.float32),
        "mult_prob_error_max": jax.ShapeDtypeStruct((), jnp.float32),
    }

    def jit_fwd_bwd(factor):
        return jax.jit(
            lambda p, b: fwd_bwd(p, b, factor),
            in_shardings=(param_shardings, inputs),
            out_shardings=(param_shardings, replicated),
        )

    programs = {"fwd_bwd": (jit_fwd_bwd(config.moe.ragged_buffer_factor), (params, spec))}
    if config.moe.retry_when_tokens_dropped and config.moe.ragged_buffer_factor != -1:
        programs["fwd_bwd_dropless"] = (jit_fwd_bwd(-1), (params, spec))
    programs["accumulate"] = (
        jax.jit(
            accumulate,
            in_shardings=(param_shardings, stat_shardings, *grad_out),
            out_shardings=(param_shardings, stat_shardings, replicated),
            donate_argnums=(0, 1),
        ),
        (params, stats_shapes, params, micro_stats_shapes),
    )
    programs["update"] = (
        jax.jit(
            update,
            in_shardings=(param_shardings, opt_shardings, param_shardings, stat_shardings),
            out_shardings=(
                param_shardings,
                opt_shardings,
                param_shardings,
                stat_shardings,
                replicated,
            ),
            donate_argnums=(0, 1, 2, 3),
        ),
        (params, opt_shapes, params, stats_shapes),
    )
    precision = None if config.matmul_precision == "default" else config.matmul_precision
    lowered = {}
    with jax.set_mesh(mesh), jax.default_matmul_precision(precision):
        for name, (program, args) in programs.items():
            lowered[name] = program.lower(*args)
    return lowered


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PreparedBatch:
    """A micro-batch whose host-to-device copy was issued by `prepare_fwd_bwd_input`.

    `issued_at` / `issue_seconds`: perf_counter when the call started and how long it took;
    `ready_at`: perf_counter when every array had arrived (set by a watcher thread; None until
    then), so the driver can tell how much of the copy the device work hid.
    """

    name: str
    digests: Mapping[str, str]
    arrays: dict[str, jax.Array]
    issued_at: float
    issue_seconds: float = 0.0
    ready_at: float | None = None
    memory_path: str = "device"  # "pinned_host->device" where the platform has pinned host memory
    probe: threading.Thread | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass
class _Pending:
    """A dispatched micro-batch whose gradient is not yet in the step's sum."""

    inputs: dict[str, jax.Array]
    grads: Any
    stats: dict[str, jax.Array]


# Compiled programs shared by engines of the same config on the same devices (A/B arms, tests).
_COMPILED: dict[tuple, dict[str, Any]] = {}


class JaxEngine:
    """The built-in MoE GRPO engine; satisfies `contract.Engine` and its optional methods."""

    def __init__(self, config: EngineConfig, devices: Sequence[jax.Device] | None = None):
        check_config(config)
        self.config = config
        self.mesh = sharding.make_mesh(config.mesh, devices)
        self.platform = _platform_of(self.mesh)
        self.methods = resolved_methods(config, self.platform)
        _, _, param_shardings, opt_shardings, stat_shardings = _state_shardings(config, self.mesh)
        initial = jax.jit(
            _initial_state,
            static_argnums=0,
            out_shardings=(param_shardings, opt_shardings, param_shardings, stat_shardings),
        )
        self._params, self._opt_state, self._grad_sum, self._step_stats = initial(config)
        self._train_step = 0
        self._spec: dict[str, jax.ShapeDtypeStruct] | None = None
        self._compiled: dict[str, Any] = {}
        self._pending: _Pending | None = None
        self._replays = 0
        self._metrics: dict[str, Any] | None = None
        self._marker: jax.Array | None = None
        self._routes_checked: set[str] = set()
        self._prepared: list[PreparedBatch] = []
        memory_kinds = {m.kind for m in self.mesh.devices.flat[0].addressable_memories()}
        self._pinned = self.platform != "cpu" and "pinned_host" in memory_kinds

    # -- contract ------------------------------------------------------------------------------

    @property
    def train_step(self) -> int:
        return self._train_step

    def compile(self, example: Payload) -> dict[str, float]:
        """Compile every program for micro-batches shaped like `example`; seconds per program.

        Programs already compiled in this process for the same config, devices and shapes are
        reused (their entry is the seconds spent looking them up, near zero).
        """
        spec = {
            name: jax.ShapeDtypeStruct(array.shape, array.dtype)
            for name, array in example.arrays().items()
        }
        check_payload(example, payload_spec(self._config_for(spec)))
        key = (self.config, tuple(d.id for d in self.mesh.devices.flat), tuple(sorted(spec)))
        seconds: dict[str, float] = {}
        cached = _COMPILED.get(key)
        if cached is None:
            start = time.perf_counter()
            lowered = lower_programs(self.config, self.mesh, spec)
            lowering = time.perf_counter() - start
            cached = {}
            for name, program in lowered.items():
                start = time.perf_counter()
                cached[name] = program.compile()
                seconds[name] = time.perf_counter() - start + lowering / len(lowered)
                log.info("compiled %s in %.2f s", name, seconds[name])
            _COMPILED[key] = cached
        else:
            seconds = dict.fromkeys(cached, 0.0)
            log.info("reused compiled programs %s", ", ".join(cached))
        self._compiled, self._spec = cached, spec
        return seconds

    def fwd_bwd(self, batch: Payload | PreparedBatch) -> None:
        """Dispatch one micro-batch; settle the previous one (its overflow flag is read now)."""
        if self._spec is None:
            if isinstance(batch, PreparedBatch):
                raise ContractError(
                    "fwd_bwd(prepared input) before compile(example): compile first"
                )
            self.compile(batch)
        inputs = self._device_inputs(batch)
        grads, stats = self._compiled["fwd_bwd"](self._params, inputs)
        self._marker = stats["loss_sum"]
        previous, self._pending = self._pending, _Pending(inputs, grads, stats)
        if previous is not None:
            self._settle(previous)
        if not self._replays_possible:
            self._settle(self._pending)
            self._pending = None

    def update(self) -> int:
        """Settle the last micro-batch (a host read of its overflow flag), then apply the step."""
        if self._pending is not None:
            self._settle(self._pending)
            self._pending = None
        self._params, self._opt_state, self._grad_sum, self._step_stats, metrics = self._compiled[
            "update"
        ](self._params, self._opt_state, self._grad_sum, self._step_stats)
        self._marker = metrics["grad_norm"]
        self._train_step += 1
        self._metrics = {"device": metrics, "replay_count": self._replays, "step": self._train_step}
        self._replays = 0
        self._prepared = [p for p in self._prepared if p.ready_at is None]
        return self._train_step

    def get_metrics(self, clear_cache: bool = True) -> dict[str, Any]:
        """Host values of the last update (empty before the first); clear_cache forgets them."""
        if self._metrics is None:
            return {}
        device = jax.device_get(self._metrics["device"])
        out = {name: float(value) for name, value in device.items()}
        for name in ("tokens", "overflow_count"):
            out[name] = int(device[name])
        out["replay_count"] = self._metrics["replay_count"]
        out["train_step"] = self._metrics["step"]
        if clear_cache:
            self._metrics = None
        return out

    # -- staging -------------------------------------------------------------------------------

    def prepare_fwd_bwd_input(self, payload: Payload) -> PreparedBatch:
        """Issue the host-to-device copy of `payload` into the input shardings; returns at once."""
        start = time.perf_counter()
        if self._spec is None:
            raise ContractError("prepare_fwd_bwd_input before compile(example): compile first")
        arrays = self._host_arrays(payload)
        shardings = _input_shardings(self.mesh, self._spec)
        if self._pinned:
            pinned = _input_shardings(self.mesh, self._spec, "pinned_host")
            arrays = jax.device_put(jax.device_put(arrays, pinned), shardings)
        else:
            arrays = jax.device_put(arrays, shardings)
        prepared = PreparedBatch(
            name=payload.name,
            digests=dict(payload.digests),
            arrays=arrays,
            issued_at=start,
            memory_path="pinned_host->device" if self._pinned else "device",
        )
        prepared.probe = threading.Thread(target=_record_ready, args=(prepared,), daemon=True)
        prepared.probe.start()
        prepared.issue_seconds = time.perf_counter() - start
        self._prepared.append(prepared)
        return prepared

    def wait_for_device(self) -> float:
        """Block until every dispatched program and issued copy is done; seconds blocked."""
        start = time.perf_counter()
        jax.block_until_ready((self._marker, [p.arrays for p in self._prepared]))
        for prepared in self._prepared:
            prepared.probe.join()  # ready_at is set once wait_for_device returns
        return time.perf_counter() - start

    # -- timeline, identity, accounting ------------------------------------------------------

    def completion_marker(self) -> jax.Array | None:
        """A scalar output of the most recently dispatched program (None before the first)."""
        return self._marker

    def parameter_digest(self) -> str:
        """sha256 over every parameter's bytes, in name order: equal digests mean identical weights."""
        digest = hashlib.sha256()
        for name in sorted(self._params):
            digest.update(name.encode())
            digest.update(_host_copy(self._params[name]).tobytes())
        return digest.hexdigest()

    def accumulated_gradient(self) -> dict[str, np.ndarray]:
        """The step's gradient so far as `update` would apply it (sum / token count), on the host."""
        if self._pending is not None:
            self._settle(self._pending)
            self._pending = None
        grad_sum, stats = jax.device_get((self._grad_sum, self._step_stats))
        denominator = max(float(stats["loss_denominator"]), 1.0)
        return {name: np.asarray(g) / denominator for name, g in grad_sum.items()}

    def model_flops(self, payload: Payload, count_remat: bool = False) -> float:
        """Model FLOPs of one micro-batch (ENGINE.md): real tokens only, padding excluded.

        count_remat=True adds the recomputation: layers x 4/3 under full remat, and the chunked
        head x 4/3 always (its logits are recomputed in the backward pass).
        """
        return micro_batch_flops(self.config, payload.segment_ids, count_remat)

    def info(self) -> dict[str, Any]:
        """Platform, devices, mesh and program choices, for the run's header."""
        device = self.mesh.devices.flat[0]
        return {
            "engine": "rl_trainer_bench.JaxEngine",
            "platform": self.platform,
            "device_kind": device.device_kind,
            "devices": int(self.mesh.devices.size),
            "mesh": dict(zip(self.mesh.axis_names, self.mesh.devices.shape, strict=True)),
            "attention": self.methods[0],
            "expert_compute": self.methods[1],
            "remat_policy": self.config.model.remat_policy,
            "dtype": self.config.model.dtype,
            "parameters": int(sum(p.size for p in jax.tree.leaves(self._params))),
            "active_parameters_per_token": active_parameters(self.config),
            "ragged_buffer_factor": self.config.moe.ragged_buffer_factor,
            "retry_when_tokens_dropped": self.config.moe.retry_when_tokens_dropped,
            "input_copy": "pinned_host->device" if self._pinned else "device",
        }

    # -- internals -----------------------------------------------------------------------------

    @property
    def _replays_possible(self) -> bool:
        return "fwd_bwd_dropless" in self._compiled

    def _config_for(self, spec) -> EngineConfig:
        """The config whose payload_spec matches the example's optional fields."""
        moe_config = dataclasses.replace(self.config.moe, router_replay="routed_experts" in spec)
        return dataclasses.replace(self.config, moe=moe_config)

    def _host_arrays(self, payload: Payload) -> dict[str, np.ndarray]:
        check_payload(payload, self._spec)
        routes = payload.routed_experts
        if routes is not None:
            digest = payload.digests.get("routed_experts")
            if digest is None or digest not in self._routes_checked:
                check_routes(routes, self.config.model.num_experts, payload.name)
                if digest is not None:
                    self._routes_checked.add(digest)
        return payload.arrays()

    def _device_inputs(self, batch: Payload | PreparedBatch) -> dict[str, jax.Array]:
        if isinstance(batch, PreparedBatch):
            if batch in self._prepared:
                self._prepared.remove(batch)
            return batch.arrays
        return jax.device_put(self._host_arrays(batch), _input_shardings(self.mesh, self._spec))

    def _settle(self, pending: _Pending) -> None:
        """Add a micro-batch's gradient to the step's sum, replaying it dropless if it overflowed."""
        grads, stats = pending.grads, pending.stats
        if self._replays_possible and bool(jax.device_get(stats["overflow"])):
            grads, replay_stats = self._compiled["fwd_bwd_dropless"](self._params, pending.inputs)
            stats = {**replay_stats, "overflow": stats["overflow"]}  # count the original drop
            self._replays += 1
        self._grad_sum, self._step_stats, self._marker = self._compiled["accumulate"](
            self._grad_sum, self._step_stats, grads, stats
        )


def _initial_state(config: EngineConfig):
    """Parameters from the seed, a fresh optimizer state, a zero gradient sum and zero stats."""
    params = model.init_params(config.model, jax.random.key(config.seed))
    opt_state = make_optimizer(config.optimizer).init(params)
    return params, opt_state, jax.tree.map(jnp.zeros_like, params), zero_stats()


def _record_ready(prepared: PreparedBatch) -> None:
    jax.block_until_ready(prepared.arrays)
    prepared.ready_at = time.perf_counter()


def active_parameters(config: EngineConfig) -> int:
    """Parameters one token passes through: its layers' mixers, router, K experts, shared expert,
    and the head (docs/engine.md, "Gated DeltaNet")."""
    m = config.model
    q_width, kv_width = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = (
        3 if m.attention_output_gate else 2
    ) * m.d_model * q_width + 2 * m.d_model * kv_width
    key_width = m.linear_num_key_heads * m.linear_key_head_dim
    value_width = m.linear_num_value_heads * m.linear_value_head_dim
    linear = m.d_model * (
        2 * key_width + 3 * value_width + 2 * m.linear_num_value_heads
    ) + m.linear_conv_kernel_dim * (2 * key_width + value_width)
    ffn = m.top_k * 3 * m.d_model * m.expert_ffn_dim + 3 * m.d_model * m.shared_expert_ffn_dim
    router = m.d_model * m.num_experts
    mixers = m.layers_of("full_attention") * attention + m.layers_of("linear_attention") * linear
    return mixers + m.num_layers * (ffn + router) + m.d_model * m.vocab_size


def linear_attention_macs_per_token(config: EngineConfig) -> float:
    """Multiply-adds of the chunked gated delta rule per token and value head, forward.

    Per chunk of C tokens: k k^T and q k^T (C Dk each per token), the triangular solve for
    [U | W] (C (Dv + Dk) / 2), the decayed q k^T times the deltas (C Dv), and W H, (G q) H and the
    state update (Dk Dv each). The second pass of context parallelism is not counted, like remat.
    """
    m = config.model
    chunk = min(m.linear_chunk_size, config.seq_len // max(config.mesh.context, 1))
    dk, dv = m.linear_key_head_dim, m.linear_value_head_dim
    return 2 * chunk * dk + chunk * (dk + dv) / 2 + chunk * dv + 3 * dk * dv


def micro_batch_flops(config: EngineConfig, segment_ids: np.ndarray, count_remat: bool) -> float:
    """6 x real tokens x active parameters + 12 x full-attention layers x (H x hd) x
    sum(segment length^2 / 2) + 6 x real tokens x linear-attention layers x value heads x the
    chunked rule's multiply-adds per token (docs/engine.md, "Gated DeltaNet")."""
    m = config.model
    tokens = int(np.count_nonzero(segment_ids))
    squares = 0.0
    for row in np.asarray(segment_ids):
        _, lengths = np.unique(row[row != 0], return_counts=True)
        squares += float(np.sum(lengths.astype(np.float64) ** 2) / 2)
    head = 6.0 * tokens * m.d_model * m.vocab_size
    layers = 6.0 * tokens * (active_parameters(config) - m.d_model * m.vocab_size)
    layers += 12.0 * m.layers_of("full_attention") * m.num_heads * m.head_dim * squares
    layers += (
        6.0
        * tokens
        * m.layers_of("linear_attention")
        * m.linear_num_value_heads
        * linear_attention_macs_per_token(config)
    )
    if count_remat:
        head *= 4 / 3
        if m.remat_policy == "full":
            layers *= 4 / 3
    return head + layers


__all__ = [
    "JaxEngine",
    "PreparedBatch",
    "abstract_state",
    "check_config",
    "lower_programs",
    "payload_spec",
]


def _host_copy(array: jax.Array) -> np.ndarray:
    """The whole array on this host, also when it spans other processes' devices (multi-host)."""
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
