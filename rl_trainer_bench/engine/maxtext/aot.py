"""MaxText's training programs lowered from abstract inputs, for `aot` (contract.AotEngineModule).

MaxText compiles its engine ahead of time through `AbstractMaxTextEngine(config, mesh)`
(`maxtext/training_engine/maxtext_engine_compile.py`): weights and Adam moments are shapes on their
real shardings, nothing is allocated, and the mesh may be a TPU topology this host does not own.
This module builds that engine as the adapter builds the live one, so `aot` compiles the programs
a MaxText trainer runs:

- **Config.** The adapter's words (`maxtext_keys.maxtext_args`) with the keys of the *target's*
  platform (`maxtext_keys.platform_keys`: none for a TPU, the CPU's ring of experts on host
  devices), not the keys of the host that compiles.
- **Mesh.** MaxText's own (`create_device_mesh` over the target mesh's devices, MaxText's axes).
- **Loss and inputs.** MaxText's router-replay loss and input mapping, as the adapter sets them
  on its own path (`maxtext_payload.with_router_replay`), fed the adapter's payload conversion as
  shapes. A run whose `MAXTEXT_DRIVER` resolves to Tunix computes Tunix's GRPO loss over full
  logits instead (`tunix_grpo`); that program is not lowered here, and the docs say so.
- **Programs.** MaxText's three kernels, `fwd_bwd` (a step's first micro-batch), `fwd_bwd_accum`
  (every later one, adding into the donated gradient sum) and `update`, lowered through
  `_lower_kernels`: MaxText's only public entry, `compile_kernels`, returns them compiled, all at
  once and with its options, while `aot` compiles each alone (one that does not fit does not
  hide the others) and `hlo-overlap` reads each one's HLO. The one private name this module calls.
- **Options.** MaxText compiles with `compile_xla_flags` parsed by its own
  `max_utils.parse_libtpu_flags_to_dict` (what its `_xla_options` does); the built-in engine's
  `xla_tpu_user_reserved_hbm_bytes` reservations are not MaxText's and are not passed.

A trainer key MaxText refuses (maxtext 0.2.5 has no `use_gdn_kernel`, for one) would stop the
config; `trainer_keys_refused` names them so `aot` compiles without them and its report says so.
MaxText is imported only inside the functions the adapter's loader returns.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rl_trainer_bench.engine import abstract_inputs
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import ContractError
from rl_trainer_bench.engine.maxtext import config as maxtext_config
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.engine.maxtext import payload as maxtext_payload

# `api` below is the adapter's MaxTextApi (maxtext_adapter imports this module, not the reverse).
MaxTextApi = Any

# Which state parts sit in device memory beside each MaxText program (residency.STATE_PARTS).
# `fwd_bwd` makes the step's gradient sum (an output), `fwd_bwd_accum` adds into it (an argument
# it donates), `update` takes the parameters, the optimizer state and the sum as arguments; the
# micro-batch staged before `update` (STAGE_BEFORE_UPDATE) waits beside it. MaxText has no
# dropless replay program.
BESIDE: Mapping[str, tuple[str, ...]] = {
    "fwd_bwd": ("opt_state",),
    "fwd_bwd_accum": ("opt_state",),
    "update": ("staged_micro_batch",),
}


def maxtext_args(
    api: MaxTextApi, config: EngineConfig, output_dir: str, platform: str, aot: bool = False
) -> maxtext_keys.MaxTextArgs:
    """The adapter's MaxText words for `config` on `platform`; ContractError when a field has no
    MaxText equivalent.

    `aot`: for devices this process does not run on. MaxText sizes its batch from the devices
    it counts (per_device_batch_size x devices), which on a CPU host compiling for a TPU slice
    is this host's one device: `internal_compile_num_devices` (MaxText's key for a compile that
    bypasses its topology names) gives it the mesh's count instead.
    """
    target = {"internal_compile": True, "internal_compile_num_devices": config.mesh.size}
    try:
        model = maxtext_keys.maxtext_model(config)
        return maxtext_keys.maxtext_args(
            config,
            api.model_config(model.name),
            output_dir,
            {**maxtext_keys.platform_keys(config, platform), **(target if aot else {})},
        )
    except maxtext_keys.NotTaken as why:
        raise ContractError(f"ENGINE=...maxtext.adapter:MaxTextEngine: {why}") from why


def refuse_unsplit_batch(api: MaxTextApi, config: EngineConfig, maxtext_config: Any, mesh) -> None:
    """A micro-batch MaxText's mesh cannot split is refused, as the built-in engine refuses it.

    MaxText shards rows over the first entry of its input spec and the sequence over the
    second; an axis that does not divide its dimension would be replicated instead, every
    device of the axis doing the same work (and a layer that splits rows per shard would see
    none: the recipe's `custom_mesh_and_rule=cp-as-ep` puts rows over all 256 devices).
    """
    spec = api.input_spec(maxtext_config, mesh)
    dims = (("micro_batch_rows", config.micro_batch_rows), ("seq_len", config.seq_len))
    for (name, size), axes in zip(dims, spec, strict=False):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        shards = math.prod(mesh.shape[a] for a in names)
        if size % shards:
            raise ContractError(
                f"{name}={size}: MaxText splits it over its mesh axes"
                f" {' x '.join(f'{a}={mesh.shape[a]}' for a in names)} = {shards},"
                f" which does not divide it: make {name} a multiple of {shards}"
            )


@contextlib.contextmanager
def _scratch_folder() -> Iterator[str]:
    """A folder of its own for what MaxText writes while it builds a config or an engine (its
    metrics writer), and stderr for what it prints (its import notices): `aot --json` prints
    the report alone on stdout."""
    with (
        tempfile.TemporaryDirectory(prefix="rl-trainer-bench-maxtext-aot-") as folder,
        contextlib.redirect_stdout(sys.stderr),
    ):
        yield folder


class MaxTextAot:
    """The AOT functions over one MaxText (`load_api`: the real package or a stand-in).

    The lowering of the last (config, mesh) is kept: `aot` asks for the programs, then for the
    state and payload of the same config, and lowering a 397B `fwd_bwd` takes minutes.
    """

    def __init__(self, load_api: Callable[[], MaxTextApi]):
        self._load_api = load_api
        self._last: tuple[tuple[EngineConfig, Any], tuple[Any, dict[str, Any]]] | None = None

    def functions(self) -> tuple[Callable[..., Any], ...]:
        """The module-level AOT functions of an engine module over this MaxText, in the order
        lower_programs, abstract_state, payload_spec, compiler_options, trainer_keys_refused."""
        return (
            self.lower_programs,
            self.abstract_state,
            self.payload_spec,
            self.compiler_options,
            self.trainer_keys_refused,
        )

    def payload_spec(self, config: EngineConfig) -> dict[str, Any]:
        """The bench's micro-batch, which the adapter converts: the built-in engine's spec."""
        return abstract_inputs.payload_spec(config)

    def lower_programs(self, config: EngineConfig, mesh) -> dict[str, Any]:
        """MaxText's `fwd_bwd`, `fwd_bwd_accum` and `update` lowered on `mesh`'s devices."""
        return dict(self._lowering(config, mesh)[1])

    def abstract_state(self, config: EngineConfig, mesh) -> dict[str, Any]:
        """Parameters and optimizer state as the lowered engine holds them (after MaxText placed
        them on its mesh), and the gradient sum as `fwd_bwd` returns it (`grad_dtype`)."""
        engine, lowered = self._lowering(config, mesh)
        params, opt_state = self._load_api().state_avals(engine)
        grads = lowered["fwd_bwd"].out_info[-2]  # (..., gradient sum, its denominator)
        return {"params": params, "opt_state": opt_state, "grad_accum": grads}

    def compiler_options(self, config: EngineConfig, mesh) -> dict[str, dict[str, str]]:
        """Per program, the XLA options MaxText compiles it with (`compile_xla_flags`)."""
        api = self._load_api()
        with _scratch_folder() as folder:
            words = maxtext_args(
                api, config, folder, abstract_inputs.platform_of(mesh), aot=True
            ).words
            options = api.xla_options(api.build_config(words))
        return dict.fromkeys(BESIDE, options)

    def trainer_keys_refused(self, config: EngineConfig, platform: str) -> dict[str, str]:
        """{trainer key=value: MaxText's reason} for each trainer key this MaxText refuses."""
        api = self._load_api()
        with _scratch_folder() as folder:
            args = maxtext_args(api, config, folder, platform, aot=True)
            refused, message = maxtext_config.refused_trainer_keys(
                api.build_config, ValueError, args.words, args.trainer_words
            )
        if message is not None:
            raise ContractError(
                f"maxtext {api.version} refuses the config the bench builds for this cell,"
                f" whichever trainer key is left out ({message}): set the engine keys it names"
                " through ENGINE_FLAGS, or another PRESET"
            )
        return refused

    def _lowering(self, config: EngineConfig, mesh) -> tuple[Any, dict[str, Any]]:
        if self._last is not None and self._last[0] == (config, mesh):
            return self._last[1]
        api = self._load_api()
        devices = list(mesh.devices.flat)
        # MaxText's engine opens its metrics writer where the config says: a folder of its own.
        with _scratch_folder() as folder:
            args = maxtext_args(api, config, folder, abstract_inputs.platform_of(mesh), aot=True)
            mt_config = api.build_config(args.words)
            mt_mesh = api.build_mesh(mt_config, devices)
            refuse_unsplit_batch(api, config, mt_config, mt_mesh)
            inputs = maxtext_payload.abstract_model_input(
                self.payload_spec(config),
                maxtext_payload.replay_payload_type(api.payload_type),
                api.gen_model_input_fn,
            )
            engine, lowered = _lowered_engine(api, mt_config, mt_mesh, inputs)
        self._last = ((config, mesh), (engine, lowered))
        return engine, lowered


def _lowered_engine(api: MaxTextApi, mt_config: Any, mt_mesh, inputs) -> tuple[Any, dict]:
    """MaxText's abstract engine with the adapter's loss, and its kernels lowered on `inputs`.

    A failure inside MaxText (a decoder that cannot trace these shapes, a flax it does not
    support) is said as MaxText's, in one line, not as a bug of the bench.
    """
    try:
        engine = maxtext_payload.with_router_replay(
            api.abstract_engine_type(mt_config, mt_mesh),
            api,
            mt_config,
            input_fn=lambda mapped: mapped,  # `inputs` is mapped already
        )
        return engine, engine._lower_kernels(inputs)  # module docstring: why the private name
    except ContractError:
        raise
    except Exception as error:  # MaxText's own failures, of any type
        text = " ".join(str(error).split())[:300]
        raise ContractError(
            f"maxtext {api.version} could not lower its programs for this cell"
            f" ({type(error).__name__}: {text})"
        ) from error
