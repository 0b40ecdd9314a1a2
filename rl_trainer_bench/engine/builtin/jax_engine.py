"""JaxEngine: the built-in trainer engine, the programs of `programs.py` behind the contract.

The engine holds the training state on the device and calls the compiled programs in the order
the trainer does. Each `fwd_bwd` adds its micro-batch into the step's gradient sum in place, unless
the micro-batch dropped pairs and dropless retry is on: then it counts only the overflow, and the
engine replays that micro-batch dropless, which adds the rest. The overflow flag of micro-batch i
is read on the host only after i + 1 was dispatched, so the device stays busy while the host waits
(docs/engine.md); the replay may come late because sums commute, and no gradient waits in device
memory meanwhile. With retry off nothing is ever read back.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rl_trainer_bench.engine import device_digest, residency
from rl_trainer_bench.engine.background import Background
from rl_trainer_bench.engine.builtin import flops, input_copy, pair_drops, programs, sharding
from rl_trainer_bench.engine.builtin.parameters import parameter_shapes
from rl_trainer_bench.engine.builtin.programs import (
    REPLAY,
    Accumulated,
    TrainState,
    abstract_state,
    check_config,
    check_payload,
    check_routes,
    compile_reservations,  # noqa: F401 (aot finds an engine's abstract-input functions in its module)
    lower_programs,
    lowered_one_by_one,
    payload_spec,
)
from rl_trainer_bench.engine.config import EngineConfig, replays_possible
from rl_trainer_bench.engine.contract import ContractError, Payload, StateMismatch
from rl_trainer_bench.engine.shared_state import StateFamily, first_difference
from rl_trainer_bench.engine.temp_block import compile_reading_block, persistent_cache_off

log = logging.getLogger(__name__)


class CopyInFlight:
    """A micro-batch's copy handed to the engine's copying thread (`InputCopy.start`): its device
    arrays once issued. `block_until_ready` waits for the copy itself, so whoever blocks on a
    PreparedBatch's fields (the driver's copy watcher) waits for the arrays, not for the issue."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    @property
    def arrays(self) -> dict[str, jax.Array]:
        return self._future.result()

    def block_until_ready(self) -> CopyInFlight:
        jax.block_until_ready(self.arrays)
        return self


@dataclasses.dataclass
class PreparedBatch:
    """A micro-batch whose host-to-device copy was started by `prepare_fwd_bwd_input`.

    `issued_at` / `issue_seconds`: perf_counter when the call started and how long it took (the
    copy goes on after it returns); `ready_at`: perf_counter when every array had arrived (set by a
    watcher thread; None until then), so the driver can tell how much of the copy the device work
    hid.
    """

    name: str
    digests: Mapping[str, str]
    copy: CopyInFlight
    issued_at: float
    issue_seconds: float = 0.0
    ready_at: float | None = None
    probe: threading.Thread | None = dataclasses.field(default=None, repr=False)

    @property
    def arrays(self) -> dict[str, jax.Array]:
        return self.copy.arrays


@dataclasses.dataclass
class _Pending:
    """A dispatched micro-batch whose overflow flag the host has not read yet."""

    inputs: dict[str, jax.Array]
    overflow: jax.Array


# Compiled programs shared by engines of the same config on the same devices (A/B arms, tests),
# and the input copy of their micro-batches (its join program compiled beside them).
_COMPILED: dict[tuple, dict[str, Any]] = {}
# Their HBM temporary blocks, where their compile read them (`dump_buffer_assignment`).
_BLOCKS: dict[tuple, dict[str, int | None]] = {}
_COPIES: dict[tuple, input_copy.InputCopy] = {}


class JaxEngine:
    """The built-in MoE GRPO engine; satisfies `contract.Engine` and its optional methods."""

    def __init__(
        self,
        config: EngineConfig,
        devices: Sequence[jax.Device] | None = None,
        *,
        family: StateFamily | None = None,
    ):
        """`family`: the engines whose training state this one shares (`share_state` passes it);
        without one the engine allocates its own, from the config's seed."""
        check_config(config)
        self.config = config
        self.mesh = sharding.make_mesh(config.mesh, devices)
        self.platform = programs.platform_of(self.mesh)
        self.methods = programs.resolved_methods(config, self.platform)
        self._initial: Background[TrainState] | None = None
        if family is None:
            shardings = programs.state_shardings(config, self.mesh)
            initial = jax.jit(programs.initial_state, static_argnums=0, out_shardings=shardings)
            # Compiled and run beside the programs' compile; the first use of the state waits, and
            # an error of its own (a state the devices cannot hold) surfaces there, at the latest
            # when `compile` ends.
            self._initial = Background(lambda: initial(config), "engine-initial-state")
            self._held: TrainState | None = None
            self._train_step = 0
            self._family = StateFamily(self)
        else:  # no state of its own until it takes the family's (`take_shared_state`)
            self._family = family
            self._held = None
            self._train_step = family.holder._train_step
        self._spec: dict[str, jax.ShapeDtypeStruct] | None = None
        self._compiled: dict[str, Any] = {}
        self._pending: _Pending | None = None
        self._replays = 0
        self._metrics: dict[str, Any] | None = None
        self._marker: jax.Array | None = None
        self._routes_checked: set[str] = set()
        self._drops: dict[tuple[str | None, ...], bool] = {}  # by the routes' and segments' digests
        self._program_config = config  # `config` as the compiled programs take it (`_config_for`)
        self._key: tuple = ()  # the programs' entry in _COMPILED and _BLOCKS
        # `will_run`'s count: the first of its micro-batches that drops a pair, or None
        self._dropping: Background[str | None] | None = None
        self._prepared: list[PreparedBatch] = []
        self._copy: input_copy.InputCopy | None = None

    # -- contract ------------------------------------------------------------------------------

    @property
    def train_step(self) -> int:
        return self._train_step

    @property
    def _state(self) -> TrainState | None:
        """The training state this engine holds (None: another engine of its family holds it);
        the initial state is waited for here, on its first use."""
        self._wait_for_initial_state()
        return self._held

    @_state.setter
    def _state(self, state: TrainState | None) -> None:
        self._initial, self._held = None, state

    def _wait_for_initial_state(self) -> None:
        """The initial state, once its background compile and run are done (their error, if any,
        raised here)."""
        if self._initial is not None:
            self._held, self._initial = self._initial.result(), None

    def compile(self, example: Payload) -> dict[str, float]:
        """Compile every program for micro-batches shaped like `example`; seconds per program.

        The programs compile side by side, one thread each (XLA's compile releases the GIL), so
        where the host has cores to spare the wall time is about the longest program's, not their
        sum: 84 s against 122 s for tpu-v5e-1 on a 13-core v5e host. On 2 cores it gains nothing
        (the compiler keeps both busy) and the host memory of the compile grows by about a third
        (benchmarks/reports/aot-compile-time_tpu7x-v5p_2026-12-02.md). Each program starts
        compiling as soon as it is lowered, while the next is traced and lowered; its seconds are
        its own lowering and compile, overlapping the others'.
        With router replay the dropless replay compiles beside the others only when a micro-batch
        `will_run` named drops a pair (counted on the host, `pair_drops`, while the first program
        compiles); without `will_run` the first such micro-batch compiles it. Programs already
        compiled in this process for the same config (its output folder aside), devices and
        shapes are reused (their entry is 0).
        """
        spec = {
            name: jax.ShapeDtypeStruct(array.shape, array.dtype)
            for name, array in example.arrays().items()
        }
        config = self._config_for(spec)
        check_payload(example, payload_spec(config))
        # the results folder an engine may write into changes none of the programs
        programs_of = dataclasses.replace(self.config, output_dir="", dump_buffer_assignment=False)
        key = (programs_of, tuple(d.id for d in self.mesh.devices.flat), tuple(sorted(spec)))
        cached = _COMPILED.get(key)
        digest = self._digest_compile()
        self._program_config, self._key = config, key
        if cached is None:
            cached, seconds = self._compiled_side_by_side(config, spec, self._wanted(config))
            _COMPILED[key] = cached
        else:
            seconds = dict.fromkeys(cached, 0.0)
            log.info("reused compiled programs %s", ", ".join(cached))
        start = time.perf_counter()
        digest.result()
        self._wait_for_initial_state()
        waited = time.perf_counter() - start
        if waited > 0.05:
            log.info("waited %.2f s for the initial state and the digest program", waited)
        self._compiled, self._spec, self._copy = cached, spec, self._input_copy(key, spec)
        if self._replay_missing() and self._wanted(config)(REPLAY):  # reused: an earlier
            # engine's run needed no replay, a micro-batch of this one does
            seconds[REPLAY] = self._compile_replay("a micro-batch of the run drops pairs")
        return seconds

    def will_run(self, payloads: Sequence[Payload]) -> None:
        """Before `compile`: the micro-batches the run will feed. With router replay their pairs
        are counted on a thread of their own (`pair_drops`) while `compile` lowers and compiles
        `fwd_bwd`, and the dropless replay compiles beside it only if one of them drops a pair."""
        if self._replay_deferred(self.config):
            # a micro-batch without routes: the router routes it, and its programs defer nothing
            routed = [p for p in payloads if p.routed_experts is not None]
            self._dropping = Background(
                lambda: next((p.name for p in routed if self._drops_pairs(p)), None),
                "engine-pair-count",
            )

    def fwd_bwd(self, batch: Payload | PreparedBatch) -> None:
        """Dispatch one micro-batch; settle the previous one (its overflow flag is read now)."""
        if self._spec is None:
            if isinstance(batch, PreparedBatch):
                raise ContractError(
                    "fwd_bwd(prepared input) before compile(example): compile first"
                )
            self.compile(batch)
        self._family.check_holds(self)
        inputs = self._device_inputs(batch)
        overflow = self._run("fwd_bwd", inputs)
        previous = self._pending
        self._pending = _Pending(inputs, overflow) if self._replays_possible else None
        if previous is not None:
            self._settle(previous)

    def update(self) -> int:
        """Settle the last micro-batch (a host read of its overflow flag), then apply the step."""
        self._family.check_holds(self)
        if self._pending is not None:
            self._settle(self._pending)
            self._pending = None
        self._state, metrics = self._compiled["update"](self._state)
        self._marker = metrics["grad_norm"]
        self._train_step += 1
        self._metrics = {"device": metrics, "replay_count": self._replays, "step": self._train_step}
        self._replays = 0
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

    # -- one state for several engines ---------------------------------------------------------

    def share_state(self, config: EngineConfig) -> JaxEngine:
        """An engine running `config`'s programs on this engine's training state, allocating none.

        Refused (StateMismatch) unless `config`'s abstract state, laid out on its mesh over these
        devices, is this engine's leaf for leaf: shape, dtype and sharding.
        """
        check_config(config)
        mesh = sharding.make_mesh(config.mesh, list(self.mesh.devices.flat))
        difference = first_difference(
            abstract_state(self.config, self.mesh), abstract_state(config, mesh)
        )
        if difference is not None:
            raise StateMismatch(difference)
        return JaxEngine(config, list(self.mesh.devices.flat), family=self._family)

    def take_shared_state(self) -> None:
        """Take the training state (and its update count) from the engine of the family that
        stepped last: its arrays are the live ones, this engine's own were donated since."""
        holder = self._family.holder
        if holder is not self:
            self._state, self._train_step = holder._state, holder._train_step
            holder._state = None  # one reference to the state: the holder's
            self._family.holder = self

    # -- staging -------------------------------------------------------------------------------

    def prepare_fwd_bwd_input(self, payload: Payload) -> PreparedBatch:
        """Start the host-to-device copy of `payload` into the input shardings on the engine's
        copying thread (`input_copy.py`) and return at once: the copy runs beside the device's
        work, and the next call that needs the arrays waits for them."""
        start = time.perf_counter()
        if self._spec is None:
            raise ContractError("prepare_fwd_bwd_input before compile(example): compile first")
        prepared = PreparedBatch(
            name=payload.name,
            digests=dict(payload.digests),
            copy=CopyInFlight(self._copy.start(self._host_arrays(payload))),
            issued_at=start,
        )
        prepared.probe = threading.Thread(target=_record_ready, args=(prepared,), daemon=True)
        prepared.probe.start()
        prepared.issue_seconds = time.perf_counter() - start
        self._prepared.append(prepared)
        return prepared

    def copy_input(self, payload: Payload) -> dict[str, jax.Array]:
        """`payload` copied as `fwd_bwd` copies an unstaged input (`input_copy.InputCopy.copy`);
        the bench times it after the compile."""
        if self._spec is None:
            raise ContractError("copy_input before compile(example): compile first")
        return self._copy.copy(self._host_arrays(payload))

    def wait_for_device(self) -> float:
        """Block until every dispatched program and issued copy is done; seconds blocked."""
        start = time.perf_counter()
        jax.block_until_ready((self._marker, [p.arrays for p in self._prepared]))
        for prepared in self._prepared:
            prepared.probe.join()  # ready_at is set once wait_for_device returns
        self._prepared.clear()  # all arrived: the caller holds what it will pass to fwd_bwd
        return time.perf_counter() - start

    # -- timeline, identity, accounting ------------------------------------------------------

    def completion_marker(self) -> jax.Array | None:
        """A scalar output of the most recently dispatched program (None before the first)."""
        return self._marker

    def parameter_digest(self) -> str:
        """A digest of every parameter's bits, computed on the device (`device_digest`: two
        words an array reach the host): equal digests mean identical weights."""
        self._family.check_holds(self)
        return device_digest.hex_digest(self._state.params)

    def accumulated_gradient(self) -> dict[str, np.ndarray]:
        """The step's gradient so far as `update` would apply it (sum / token count), on the host."""
        if self._pending is not None:
            self._settle(self._pending)
            self._pending = None
        grad_sum, stats = jax.device_get((self._state.grad_sum, self._state.step_stats))
        denominator = max(float(stats["loss_denominator"]), 1.0)
        return {name: np.asarray(g) / denominator for name, g in grad_sum.items()}

    def program_memory(self) -> dict[str, dict[str, int]]:
        """Each compiled program's device bytes as XLA gives them and the state beside it, the
        figures `aot` sums into a program's peak (the reservation it was compiled with).

        On TPU a program's temporaries are its buffer assignment's block (engine/temp_block.py),
        which the run's own compile read where `dump_buffer_assignment` was set (MEASURE_PEAK=on);
        otherwise the program is compiled once more, with XLA's dump, so a production run pays
        nothing for what only the measured peak reads.
        """
        if self._spec is None:
            raise ContractError("program_memory before compile(example): compile first")
        reserved = programs.compile_reservations(self.config, self.mesh)
        blocks = _BLOCKS.get(self._key, {})
        unread = [name for name in self._compiled if name not in blocks]
        lowered = {}
        if self.platform == "tpu" and unread:
            lowered = lower_programs(self._program_config, self.mesh, self._spec)
        figures = {}
        for name, compiled in self._compiled.items():
            block = blocks.get(name)
            if name in unread and name in lowered:
                options = residency.compile_options(self.platform, reserved[name])
                _, block = compile_reading_block(lowered[name], options, self.platform)
            analysis = compiled.memory_analysis()
            figures[name] = residency.compiled_footprint(analysis, reserved[name], block)
        return figures

    def model_flops(self, payload: Payload, count_remat: bool = False) -> float:
        """Model FLOPs of one micro-batch (docs/engine.md): real tokens only, padding excluded.

        count_remat=True adds the recomputation: layers x 4/3 under full remat, and the chunked
        head x 4/3 always (its logits are recomputed in the backward pass).
        """
        return flops.micro_batch_flops(self.config, payload.segment_ids, count_remat)

    def info(self) -> dict[str, Any]:
        """Platform, devices, mesh and program choices, for the run's header."""
        device = self.mesh.devices.flat[0]
        return {
            # as ENGINE names it (module:Class), so a run's output calls the engine one name
            "engine": f"{type(self).__module__}:{type(self).__qualname__}",
            "platform": self.platform,
            "device_kind": device.device_kind,
            "devices": int(self.mesh.devices.size),
            "mesh": dict(zip(self.mesh.axis_names, self.mesh.devices.shape, strict=True)),
            "attention": self.methods.attention,
            "expert_compute": self.methods.expert_compute,
            "dropless_compute": self.methods.dropless_compute,
            "pair_ranking": self.methods.pair_ranking,
            "linear_chunk_inverse": self.methods.linear_chunk_inverse,
            "linear_chunk_kernel": self.methods.linear_chunk_kernel,
            "linear_chunk_kernel_heads": self.config.model.linear_chunk_kernel_heads,
            "keep_delta_rule_outputs": self.config.model.keep_delta_rule_outputs,
            "linear_conv_kernel": self.methods.linear_conv_kernel,
            "prefuse_moe_weights": self.methods.prefuse_moe_weights,
            "keep_moe_gate_up": self.methods.keep_moe_gate_up,
            "remat_policy": self.config.model.remat_policy,
            "dtype": self.config.model.dtype,
            "parameters": sum(math.prod(s) for s in parameter_shapes(self.config.model).values()),
            "active_parameters_per_token": flops.active_parameters(self.config),
            "ragged_buffer_factor": self.config.moe.ragged_buffer_factor,
            "retry_when_tokens_dropped": self.config.moe.retry_when_tokens_dropped,
            "dropless_replay": _replay_policy(self._program_config),
            "input_copy": self._copy.describe()
            if self._copy is not None
            else input_copy.describe_policy(input_copy.piece_bytes_for(self.platform)),
        }

    # -- internals -----------------------------------------------------------------------------

    @property
    def _replays_possible(self) -> bool:
        return replays_possible(self.config)

    def _wanted(self, config: EngineConfig) -> Callable[[str], bool]:
        """Which programs `compile` lowers: all, but the dropless replay only where it is not
        deferred or a micro-batch `will_run` named drops a pair (the count waited for here)."""

        def wanted(name: str) -> bool:
            if name != REPLAY or not self._replay_deferred(config):
                return True
            return self._dropping is not None and self._dropping.result() is not None

        return wanted

    def _replay_deferred(self, config: EngineConfig) -> bool:
        """Whether the dropless replay waits for a micro-batch that needs it: with router replay,
        whose routes say before any program runs whether a micro-batch drops pairs."""
        return replays_possible(config) and config.moe.router_replay

    def _compiled_side_by_side(
        self, config: EngineConfig, spec, wanted: Callable[[str], bool]
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """Every `wanted` program lowered one by one, each compiling on a thread of its own as
        soon as it is lowered; the executables and each one's lowering and compile seconds."""
        start = time.perf_counter()
        reserved = programs.compile_reservations(self.config, self.mesh)
        compiling: dict[str, tuple[Background[tuple[Any, int | None, float]], float]] = {}
        lowering_from = start
        with self._reading_blocks():
            for name, program in lowered_one_by_one(config, self.mesh, spec, wanted):
                options = residency.compile_options(self.platform, reserved[name])
                job = Background(self._timed_compile(program, options), f"engine-compile-{name}")
                compiling[name] = job, time.perf_counter() - lowering_from
                lowering_from = time.perf_counter()
            compiled, seconds = {}, {}
            for name, (job, lowering) in compiling.items():
                compiled[name], block, own = job.result()
                seconds[name] = lowering + own
                self._keep_block(name, block)
                log.info("compiled %s in %.2f s", name, seconds[name])
        log.info(
            "compiled %d programs side by side in %.2f s",
            len(compiled),
            time.perf_counter() - start,
        )
        return compiled, seconds

    @property
    def _dumping(self) -> bool:
        """Whether this engine's compiles read their buffer assignment's block (TPU only)."""
        return self.config.dump_buffer_assignment and self.platform == "tpu"

    def _reading_blocks(self) -> contextlib.AbstractContextManager:
        """JAX's persistent cache off while the programs compile dumping: a program loaded from
        it dumps nothing (engine/temp_block.py); one switch for all, as they compile side by side."""
        return persistent_cache_off() if self._dumping else contextlib.nullcontext()

    def _timed_compile(
        self, lowered: Any, options: dict[str, str]
    ) -> Callable[[], tuple[Any, int | None, float]]:
        """A call that compiles `lowered`: the executable, its HBM temporary block where this
        engine reads it (else None) and its own compile seconds."""
        reading = self._dumping

        def compile_now() -> tuple[Any, int | None, float]:
            start = time.perf_counter()
            if reading:
                compiled, block = compile_reading_block(lowered, options, "tpu")
            else:
                compiled, block = _compile(lowered, options), None
            return compiled, block, time.perf_counter() - start

        return compile_now

    def _keep_block(self, name: str, block: int | None) -> None:
        if self._dumping:
            _BLOCKS.setdefault(self._key, {})[name] = block

    def _drops_pairs(self, payload: Payload) -> bool:
        """Whether `payload`'s replayed routes drop a pair in `fwd_bwd` (`pair_drops`), once per
        micro-batch's content; a field of the wrong shape or an expert id out of range is
        refused first, naming the field (`will_run` counts before any program checks it)."""
        key = tuple(payload.digests.get(n) for n in ("routed_experts", "segment_ids"))
        if None in key or key not in self._drops:
            check_payload(payload, payload_spec(self._config_for(payload.arrays())))
            self._check_routes(payload)
            drops = pair_drops.drops_pairs(payload.routed_experts, payload.segment_ids, self.config)
            if None in key:
                return drops
            self._drops[key] = drops
        return self._drops[key]

    def _compile_replay(self, reason: str) -> float:
        """The dropless replay lowered and compiled now, into the programs engines of this config
        share; its seconds."""
        start = time.perf_counter()
        reserved = programs.compile_reservations(self.config, self.mesh)[REPLAY]
        with self._reading_blocks():
            lowered = programs.lowered_program(self._program_config, self.mesh, self._spec, REPLAY)
            options = residency.compile_options(self.platform, reserved)
            self._compiled[REPLAY], block, _ = self._timed_compile(lowered, options)()
        self._keep_block(REPLAY, block)
        seconds = time.perf_counter() - start
        log.info("compiled %s in %.2f s: %s", REPLAY, seconds, reason)
        return seconds

    def _config_for(self, spec) -> EngineConfig:
        """The config whose payload_spec matches the example's optional fields."""
        moe_config = dataclasses.replace(self.config.moe, router_replay="routed_experts" in spec)
        filler = self.config.extra_host_bytes if "extra_host_bytes" in spec else 0
        return dataclasses.replace(self.config, moe=moe_config, extra_host_bytes=filler)

    def _host_arrays(self, payload: Payload) -> dict[str, np.ndarray]:
        check_payload(payload, self._spec)
        if payload.routed_experts is not None:
            self._check_routes(payload)
            if self._replay_missing() and self._drops_pairs(payload):  # not one `will_run` named
                self._compile_replay(f"micro-batch {payload.name} drops pairs")
        return payload.arrays()

    def _check_routes(self, payload: Payload) -> None:
        """ContractError for an expert id out of range, once per routes' content."""
        digest = payload.digests.get("routed_experts")
        if digest is None or digest not in self._routes_checked:
            check_routes(payload.routed_experts, self.config.model.num_experts, payload.name)
            if digest is not None:
                self._routes_checked.add(digest)

    def _replay_missing(self) -> bool:
        return REPLAY not in self._compiled and self._replay_deferred(self._program_config)

    def _input_copy(self, key: tuple, spec) -> input_copy.InputCopy:
        """The copy of micro-batches of `spec` (`input_copy.py`), its join compiled with the
        programs, shared as they are by engines of the same config on the same devices."""
        if key not in _COPIES:
            pieces = input_copy.piece_bytes_for(self.platform)
            _COPIES[key] = input_copy.InputCopy(self.mesh, spec, pieces)
        return _COPIES[key]

    def _device_inputs(self, batch: Payload | PreparedBatch) -> dict[str, jax.Array]:
        if isinstance(batch, PreparedBatch):
            if batch in self._prepared:
                self._prepared.remove(batch)
            return batch.arrays
        return self._copy.copy(self._host_arrays(batch))

    def _run(self, program: str, inputs: dict[str, jax.Array]) -> jax.Array:
        """One forward-backward program into the step's sums; its overflow flag (not yet read)."""
        state = self._state
        accumulated: Accumulated = self._compiled[program](
            state.params, state.grad_sum, state.step_stats, inputs
        )
        self._state = state._replace(
            grad_sum=accumulated.grad_sum, step_stats=accumulated.step_stats
        )
        self._marker = accumulated.overflow
        return accumulated.overflow

    def _digest_compile(self) -> Background[Any]:
        """The parameter digest's program compiling beside the programs (for the parameters'
        shapes and shardings: every engine of a family shares it)."""
        shapes = programs.state_shapes(self.config)
        shardings = programs.state_shardings(self.config, self.mesh, shapes)
        abstract = {
            name: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=shardings.params[name])
            for name, leaf in shapes.params.items()
        }
        return Background(lambda: device_digest.compiled_for(abstract), "engine-digest")

    def _settle(self, pending: _Pending) -> None:
        """Replay a micro-batch dropless if it dropped pairs (the host reads its flag here)."""
        if int(jax.device_get(pending.overflow)):
            if REPLAY not in self._compiled:
                log.warning("the device dropped pairs of a micro-batch the host counted as none")
                self._compile_replay("a micro-batch the host's count missed dropped pairs")
            self._run(REPLAY, pending.inputs)
            self._replays += 1


def _replay_policy(config: EngineConfig) -> str:
    """When the dropless replay's program is compiled, as the run's header says it."""
    if not replays_possible(config):
        return "none (retry off or a dropless buffer factor)"
    if config.moe.router_replay:
        return "compiled once a micro-batch of the run drops pairs (its routes counted on the host)"
    return "compiled with the others (the router's own routes: drops known only when it runs)"


def _record_ready(prepared: PreparedBatch) -> None:
    jax.block_until_ready(prepared.arrays)
    prepared.ready_at = time.perf_counter()


def _compile(lowered: Any, options: dict[str, str]) -> Any:
    """XLA's compile of `lowered` with `options` (a seam the compile tests wrap)."""
    return lowered.compile(compiler_options=options)
