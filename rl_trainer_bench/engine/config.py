"""The built-in engine's configuration: model shapes, mesh, loss, MoE buffers and optimizer.

Plain frozen data so it can be built from presets, a trainer argv or `key=value` engine flags at the
edge (`rl_trainer_bench.config`) and trusted everywhere past it. It lives inside `engine/` because
the engine imports nothing from the rest of the package.

Each choice is a `Literal` type, written here once: the engine, the engine keys
(`rl_trainer_bench.config.engine_keys`, derived from these fields) and `config_problems` all read
it. A field whose metadata is `engine_key(...)` is one the trainer argv or ENGINE_FLAGS may set;
the metadata carries its help and, for counts, its minimum.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal

from rl_trainer_bench.engine import extra_work

RematPolicy = Literal["full", "minimal", "none"]
AttentionImpl = Literal["auto", "xla", "cudnn", "splash"]
ExpertCompute = Literal["auto", "einsum", "ragged_dot", "sorted_ragged_dot", "sorted_gmm"]
DroplessCompute = Literal["auto", "capacity", "ragged_dot", "gmm"]
PairRanking = Literal["auto", "sort", "count"]
LogpsGradient = Literal["autodiff", "saved_lse", "in_forward"]
LinearChunkInverse = Literal["xla", "pallas"]
LinearChunkKernel = Literal["xla", "pallas"]
LinearConvKernel = Literal["xla", "pallas"]
# The capacity program's token-sorted layouts and the grouped matmul each runs: the pairs that
# keep a slot, sorted by expert, through the dropless program's code (`moe.local_sorted_ffn`), so
# the matmuls run the kept pairs rather than every slot of E x C buffers (1/factor of the work
# when nothing drops). MaxText's sparse_matmul path is of this kind (megablox on TPU).
SORTED_EXPERT_COMPUTE = {"sorted_ragged_dot": "ragged_dot", "sorted_gmm": "gmm"}
ComputeDtype = Literal["bfloat16", "float32"]
MatmulPrecision = Literal["default", "high", "highest"]
MomentDtype = Literal["float32", "bfloat16"]
Schedule = Literal["constant", "warmup_cosine_decay_schedule"]
LAYER_TYPES = ("full_attention", "linear_attention")  # the mixers `layer_types` may name
# The ragged_buffer_factor of a dropless MoE layer: every routed pair gets a slot.
DROPLESS = -1
# The Pallas TPU kernels a key may name, (dotted field, value, what runs elsewhere). They are
# refused off a TPU (`tpu_kernel_refusal`): by the plan where the run's platform is known before
# JAX starts (a host preset on the host's CPU), else by the engine as it resolves its methods.
TPU_KERNELS = (
    (
        "moe.expert_compute",
        "sorted_gmm",
        "sorted_ragged_dot (the same layout), einsum or ragged_dot",
    ),
    ("moe.dropless_compute", "gmm", "ragged_dot or capacity"),
    ("model.attention", "splash", "xla"),
    ("model.linear_chunk_inverse", "pallas", "xla"),
    ("model.linear_chunk_kernel", "pallas", "xla"),
    ("model.linear_conv_kernel", "pallas", "xla"),
)
# Platform names JAX gives a GPU backend (`jax.default_backend()`, a device's `platform`).
GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def engine_key(help: str, *, key: str | None = None, minimum: int | None = None) -> dict:
    """Field metadata marking an engine key: `key` names it when the trainer spells it differently."""
    return {"help": help, "key": key, "minimum": minimum}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder shapes. Each layer mixes tokens by grouped-query full attention or Gated DeltaNet
    (`layer_types`) and feeds forward through a routed MoE."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    expert_ffn_dim: int
    shared_expert_ffn_dim: int = 0  # 0: no shared expert
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    dtype: ComputeDtype = dataclasses.field(
        default="bfloat16",
        metadata=engine_key("activations and matmul inputs; parameters are kept in float32"),
    )
    remat_policy: RematPolicy = dataclasses.field(
        default="full",
        metadata=engine_key(
            "what each layer keeps for the backward pass (full: nothing; minimal: matmuls)"
        ),
    )
    scan_layers: bool = dataclasses.field(
        default=True,
        metadata=engine_key(
            "the layers run as scans (true: over the blocks, and inside a block over each run of"
            " one mixer; compile time flat in depth; what each layer keeps for the backward pass"
            " stacked across the scan's trips) or one after another in the program (false: each"
            " layer compiled on its own), as MaxText's scan_layers"
        ),
    )
    attention: AttentionImpl = dataclasses.field(
        default="auto",
        metadata=engine_key(
            "attention kernel (auto: cudnn on GPU, query-chunked XLA elsewhere; splash: the Pallas"
            " splash kernel, TPU only, mesh context 1)"
        ),
    )
    attention_chunk_size: int = dataclasses.field(
        default=1024,
        metadata=engine_key("query tokens per chunk on the XLA attention path", minimum=1),
    )
    attention_output_gate: bool = False  # full attention's output times sigmoid(x W_gate)
    # The mixer of each layer of a block that repeats num_layers / len(layer_types) times.
    layer_types: tuple[str, ...] = ("full_attention",)  # full_attention | linear_attention
    # Gated DeltaNet shapes (linear_attention layers; docs/gated-deltanet.md).
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    linear_chunk_size: int = dataclasses.field(
        default=64,
        metadata=engine_key("tokens per chunk of the chunked gated delta rule", minimum=1),
    )
    linear_chunk_inverse: LinearChunkInverse = dataclasses.field(
        default="xla",
        metadata=engine_key(
            "how the chunked gated delta rule inverts each chunk's triangular system (xla: batched"
            " matmuls a level at a time; pallas: a Pallas kernel that keeps each matrix in VMEM"
            " through every level, TPU only)"
        ),
    )
    linear_chunk_kernel: LinearChunkKernel = dataclasses.field(
        default="xla",
        metadata=engine_key(
            "how the chunked gated delta rule runs (xla: every chunk's terms at once, then a scan"
            " over the chunks; pallas: one Pallas kernel program a chunk that keeps its terms and"
            " the state in VMEM, forward and backward, with q and k normalised inside; TPU only,"
            " mesh context 1; linear_chunk_inverse then does not apply)"
        ),
    )
    linear_chunk_kernel_heads: int = dataclasses.field(
        default=2,
        metadata=engine_key(
            "value heads one program of the pallas chunk kernels takes, cut to the most that"
            " divides linear_num_value_heads and holds whole groups of heads sharing a key head or"
            " lies inside one (more: more independent matmul chains a program overlapped, fewer"
            " and larger programs, more of a core's VMEM; linear_chunk_kernel=pallas only)",
            minimum=1,
        ),
    )
    keep_delta_rule_outputs: bool = dataclasses.field(
        default=False,
        metadata=engine_key(
            "each Gated DeltaNet layer keeps what the pallas chunk kernels' forward pass writes"
            " (the outputs, tokens x Hv x Dv values, and each chunk's incoming state and inverse,"
            " Hv x (Dk x Dv + C x C) a chunk, in bfloat16 on a TPU) for the backward pass, which"
            " otherwise runs the forward kernel again; linear_chunk_kernel=pallas and a"
            " remat_policy other than none only"
        ),
    )
    linear_conv_kernel: LinearConvKernel = dataclasses.field(
        default="xla",
        metadata=engine_key(
            "how the Gated DeltaNet's short convolutions and their SiLU run (xla: a masked,"
            " shifted copy of the projection a tap; pallas: one Pallas kernel program a block of"
            " tokens and channels that reads it once, forward and backward; TPU only, mesh"
            " context 1)"
        ),
    )

    def layers_of(self, kind: str) -> int:
        """How many of the num_layers layers are of mixer `kind`."""
        return self.num_layers // len(self.layer_types) * self.layer_types.count(kind)

    @property
    def linear_qkv_width(self) -> int:
        """The channels of a Gated DeltaNet layer's q, k and v side by side, as its short
        convolutions take them."""
        return (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh axes (fsdp, context, expert); their product must equal the device count."""

    fsdp: int = dataclasses.field(
        default=1, metadata=engine_key("parameter and row shards", key="mesh_fsdp", minimum=1)
    )
    context: int = dataclasses.field(
        default=1, metadata=engine_key("sequence shards", key="mesh_context", minimum=1)
    )
    expert: int = dataclasses.field(
        default=1,
        metadata=engine_key("expert shards (also row shards)", key="mesh_expert", minimum=1),
    )

    @property
    def size(self) -> int:
        return self.fsdp * self.context * self.expert

    @property
    def row_groups(self) -> int:
        """How many row shards a micro-batch has (fsdp x expert)."""
        return self.fsdp * self.expert


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """GRPO clipped surrogate and k3 KL (docs/engine.md)."""

    epsilon: float = dataclasses.field(
        default=0.2, metadata=engine_key("lower clip of the probability ratio (1 - epsilon)")
    )
    epsilon_high: float = dataclasses.field(
        default=0.28, metadata=engine_key("upper clip of the probability ratio (1 + epsilon_high)")
    )
    beta: float = dataclasses.field(
        default=0.0, metadata=engine_key("weight of the k3 KL term against the reference policy")
    )
    compute_logps_chunk_size: int = dataclasses.field(
        default=512,
        metadata=engine_key("sequence positions per chunk of the output head", minimum=1),
    )
    logps_gradient: LogpsGradient = dataclasses.field(
        default="saved_lse",
        metadata=engine_key(
            "the output head's gradient: autodiff of each rematerialized chunk, saved_lse (a"
            " rule by hand that keeps each token's log-sum-exp and forms the logits once in the"
            " backward pass), or in_forward (the loss's gradient formed from each chunk's logits"
            " in the forward pass, so the backward forms none)"
        ),
    )
    logits_dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Expert buffers, drops, replay and the expert-compute layout."""

    ragged_buffer_factor: float = dataclasses.field(
        default=1.25,
        metadata=engine_key(
            "expert buffer size over an even share of tokens; -1: local tokens, never drops"
        ),
    )
    retry_when_tokens_dropped: bool = dataclasses.field(
        default=True, metadata=engine_key("re-run a micro-batch dropless when a buffer overflowed")
    )
    expert_compute: ExpertCompute = dataclasses.field(
        default="auto",
        metadata=engine_key(
            "the capacity program's expert layout: einsum or ragged_dot over E x C slot buffers,"
            " or sorted_ragged_dot / sorted_gmm (the kept pairs sorted by expert and a grouped"
            " matmul, the same drops; sorted_gmm on TPU only); auto picks per chip"
        ),
    )
    dropless_compute: DroplessCompute = dataclasses.field(
        default="auto",
        metadata=engine_key(
            "the dropless program's layout: capacity (E x N slots), ragged_dot or gmm (token-sorted"
            " pairs and a grouped matmul; gmm on TPU only); auto: gmm on TPU, ragged_dot elsewhere"
        ),
    )
    pair_ranking: PairRanking = dataclasses.field(
        default="auto",
        metadata=engine_key(
            "how each (token, expert) pair finds its place in its expert's queue: a stable sort of"
            " the pairs by expert, or counting them (a one-hot prefix sum by matmul, no sort; the"
            " same places); auto counts below 128 experts and sorts from there"
        ),
    )
    router_replay: bool = dataclasses.field(
        default=True,
        metadata=engine_key("micro-batches carry routed_experts (what AOT lowering assumes)"),
    )
    token_chunks: int = dataclasses.field(
        default=1,
        metadata=engine_key(
            "groups a device's tokens form in the MoE layer, run one after another, each with"
            " buffers of its own (1/chunks of the buffer memory; capacity is per group)",
            key="num_moe_token_chunks",
            minimum=1,
        ),
    )
    prefuse_moe_weights: bool = dataclasses.field(
        default=False,
        metadata=engine_key(
            "gate and up as one expert matmul of twice the width, as MaxText's"
            " prefuse_moe_weights runs them (the parameters stay two, joined as each layer casts"
            " them)"
        ),
    )
    keep_moe_gate_up: bool = dataclasses.field(
        default=False,
        metadata=engine_key(
            "a token-sorted layout (sorted_gmm, sorted_ragged_dot, a dropless gmm or ragged_dot)"
            " keeps each layer's expert gate and up outputs for the backward pass, 2 x pairs x F"
            " values a layer, where it otherwise gathers the rows and runs both matmuls again"
        ),
    )


def tokens_per_group(config: EngineConfig) -> int:
    """Tokens whose routed pairs share one set of expert buffers (N in docs/engine.md's capacity).

    A device holds B / (fsdp x expert) rows of T / context tokens; the MoE layer splits them into
    `token_chunks` groups. The payload's overflow prediction reads this same figure.
    """
    return math.ceil(device_tokens(config) / config.moe.token_chunks)


def device_tokens(config: EngineConfig) -> int:
    """Tokens one device holds in the MoE layer: B / (fsdp x expert) rows of T / context tokens
    (MaxText's expert-parallel buffer is sized from this figure too: payload/maxtext_buffer.py)."""
    mesh = config.mesh
    rows = math.ceil(config.micro_batch_rows / (mesh.fsdp * mesh.expert))
    return rows * math.ceil(config.seq_len / mesh.context)


def replays_possible(config: EngineConfig) -> bool:
    """Whether a micro-batch can be replayed dropless (retry on, and a finite buffer factor)."""
    return config.moe.retry_when_tokens_dropped and config.moe.ragged_buffer_factor != DROPLESS


def expert_capacity(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Slots per expert for a group of `tokens` tokens: ceil(factor x N x K / E), at least one.

    Factor DROPLESS (-1): every token fits. The payload builder's overflow prediction uses this
    same formula, which is why it lives here, free of JAX (docs/engine.md, capacity and drops).
    """
    if factor == DROPLESS:
        return tokens
    return max(1, math.ceil(factor * tokens * top_k / num_experts))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and a schedule, as the trainer argv's `--optimizer_*` sets it."""

    learning_rate: float = dataclasses.field(
        default=1e-6, metadata=engine_key("constant schedule's rate", key="optimizer_learning_rate")
    )
    schedule: Schedule = dataclasses.field(
        default="constant",
        metadata=engine_key("learning-rate schedule", key="optimizer_schedule_type"),
    )
    init_value: float = dataclasses.field(
        default=0.0, metadata=engine_key("warm-up start rate", key="optimizer_init_value")
    )
    peak_value: float = dataclasses.field(
        default=1e-6, metadata=engine_key("rate after warm-up", key="optimizer_peak_value")
    )
    end_value: float = dataclasses.field(
        default=0.0, metadata=engine_key("rate at the end of decay", key="optimizer_end_value")
    )
    warmup_steps: int = dataclasses.field(
        default=0, metadata=engine_key("warm-up steps", key="optimizer_warmup_steps", minimum=0)
    )
    decay_steps: int = dataclasses.field(
        default=1, metadata=engine_key("decay steps", key="optimizer_decay_steps", minimum=1)
    )
    b1: float = dataclasses.field(
        default=0.9, metadata=engine_key("Adam first-moment decay", key="optimizer_b1")
    )
    b2: float = dataclasses.field(
        default=0.999, metadata=engine_key("Adam second-moment decay", key="optimizer_b2")
    )
    eps: float = dataclasses.field(
        default=1e-8, metadata=engine_key("Adam epsilon", key="optimizer_eps")
    )
    mu_dtype: MomentDtype = dataclasses.field(
        default="float32",
        metadata=engine_key(
            "dtype of Adam's first moment (bfloat16 halves its memory; the second moment and the"
            " parameters stay float32), as MaxText's mu_dtype"
        ),
    )
    weight_decay: float = dataclasses.field(
        default=0.0, metadata=engine_key("AdamW weight decay", key="optimizer_weight_decay")
    )
    max_grad_norm: float = dataclasses.field(
        default=1.0, metadata=engine_key("global-norm clip of the gradients")
    )
    memory_host_offload: bool = dataclasses.field(
        default=False,
        metadata=engine_key(
            "keep the optimizer state in pinned host memory between updates; update() moves it"
            " in and back, so it takes no device memory beside fwd_bwd",
            key="optimizer_memory_host_offload",
        ),
    )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the built-in engine needs to build, shard and train its programs."""

    model: ModelConfig
    mesh: MeshConfig = MeshConfig()
    loss: LossConfig = LossConfig()
    moe: MoeConfig = MoeConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    micro_batch_rows: int = 8  # B
    seq_len: int = 128  # T
    # A folder an engine may write files of its own into (MaxText's TensorBoard events); the
    # driver sets one inside RESULTS_DIR. Empty: the engine writes none, or a temporary one.
    output_dir: str = ""
    # Set by the driver under MEASURE_PEAK=on: the engine's own compile dumps each program's buffer
    # assignment for `program_memory` (engine/temp_block.py), where reading it later would compile
    # every program a second time. It changes no program.
    dump_buffer_assignment: bool = False
    matmul_precision: MatmulPrecision = dataclasses.field(
        default="default", metadata=engine_key("XLA matmul precision")
    )
    seed: int = dataclasses.field(default=0, metadata=engine_key("parameter initialisation seed"))
    extra_device_work: float = dataclasses.field(
        default=0.0,
        metadata=engine_key(
            "FLOPs of extra matmul work in every fwd_bwd call on every device, none of it in the"
            " loss or the gradient: an A/B's known effect (engine/extra_work.py; 0: none)"
        ),
    )
    extra_host_bytes: int = dataclasses.field(
        default=0,
        metadata=engine_key(
            "bytes added to every micro-batch's host-to-device copy, read by the programs into a"
            " returned sum and never into the loss: a larger copy at the step boundary"
            " (engine/payload_shapes.py; 0: none)",
            minimum=0,
        ),
    )
    # The trainer's MaxText keys as its command sets them (MAXTEXT_EXTRA_FLAGS words in order, then
    # variables such as REMAT_POLICY under their MaxText names), values as text, in the order Tunix
    # applies them (last wins). The built-in engine maps those it has an equivalent for; an engine
    # built on MaxText passes them all to MaxText, last.
    trainer_maxtext_keys: tuple[tuple[str, str], ...] = ()
    # What drives MaxText's engine (MAXTEXT_DRIVER, engine/maxtext/tunix_grpo.py): Tunix's TrainerWorker
    # and GRPO loss, the MaxText adapter's own calls, or `auto` (Tunix's where importable). Read
    # by the MaxText adapter only; the driver sets it from the knob.
    maxtext_driver: str = "auto"
    # Fields whose MaxText keys an engine built on MaxText leaves to its MaxText's own defaults:
    # training policy (optimizer, MoE buffers, remat, precision) the trainer's command does not
    # set, so the trainer's program runs the default of the MaxText in its image, and a preset's
    # value must not stand in for it (`maxtext_keys.DEFAULTED_IN_MAXTEXT`). Empty for other engines.
    maxtext_defaults: tuple[str, ...] = ()


def choices(annotation: Any) -> tuple[str, ...] | None:
    """The allowed values of a `Literal` field type, or None for any other type."""
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else None


def leaf_fields(
    cls: type = EngineConfig, prefix: str = ""
) -> list[tuple[str, dataclasses.Field, Any]]:
    """Every non-dataclass field below `cls`: (dotted path, field, resolved type)."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            leaves += leaf_fields(kind, f"{prefix}{field.name}.")
        else:
            leaves.append((prefix + field.name, field, kind))
    return leaves


def value_at(config: EngineConfig, path: str) -> Any:
    """The value of the dotted field `path` (e.g. `optimizer.mu_dtype`) of `config`."""
    for part in path.split("."):
        config = getattr(config, part)
    return config


def tpu_kernel_refusal(config: EngineConfig, platform: str) -> str | None:
    """One line naming the first key of `config` whose TPU kernel cannot run on `platform`, and
    what runs there instead (None: every key can)."""
    if platform == "tpu":
        return None
    for path, value, elsewhere in TPU_KERNELS:
        if value_at(config, path) == value:
            return (
                f"engine config {path.rsplit('.', 1)[-1]}={value}: a Pallas TPU kernel, and this"
                f" run is on {platform}; use {elsewhere}, or a chip's preset on a TPU host"
            )
    return None


def with_value_at(config: Any, path: str, value: Any) -> Any:
    """A copy of the nested frozen dataclass `config` with the dotted field `path` set to `value`."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: with_value_at(getattr(config, head), rest, value)})


def config_problems(config: EngineConfig) -> list[str]:
    """Everything that keeps `config` from being laid out and run, one line each ([]: none).

    The one place an engine config is judged: choices against their `Literal` types, counts
    against their minimums, then (when those hold) the shapes against the mesh.
    """
    problems = []
    for path, field, kind in leaf_fields():
        value, allowed = value_at(config, path), choices(kind)
        if allowed is not None and value not in allowed:
            problems.append(f"{path}={value!r}: must be one of {', '.join(allowed)}")
        minimum = field.metadata.get("minimum")
        if minimum is not None and value < minimum:
            problems.append(f"{path}={value!r}: must be >= {minimum}")
    work = extra_work.refusal(config.extra_device_work)
    if work:
        problems.append(work)
    return problems or _shape_problems(config)  # shapes are judged on valid counts only


def _shape_problems(config: EngineConfig) -> list[str]:
    m, mesh, rows, seq = config.model, config.mesh, config.micro_batch_rows, config.seq_len
    checks = [
        (rows >= 1 and rows % mesh.row_groups == 0, "micro_batch_rows", rows,
         f"a positive multiple of mesh fsdp x expert = {mesh.row_groups}"),
        (seq >= 1 and seq % mesh.context == 0, "seq_len", seq,
         f"a positive multiple of mesh context = {mesh.context}"),
        (m.d_model % mesh.fsdp == 0, "d_model", m.d_model, f"a multiple of mesh fsdp = {mesh.fsdp}"),
        (m.num_experts % mesh.expert == 0, "num_experts", m.num_experts,
         f"a multiple of mesh expert = {mesh.expert}"),
        (m.num_heads % m.num_kv_heads == 0, "num_heads", m.num_heads,
         f"a multiple of num_kv_heads = {m.num_kv_heads}"),
        (m.head_dim % 2 == 0, "head_dim", m.head_dim, "even (rotary rotates half-dims)"),
        (0 < m.top_k <= m.num_experts, "top_k", m.top_k, f"in 1..num_experts = {m.num_experts}"),
        (config.moe.ragged_buffer_factor == DROPLESS or config.moe.ragged_buffer_factor > 0,
         "ragged_buffer_factor", config.moe.ragged_buffer_factor, "positive, or -1 for dropless"),
        (bool(m.layer_types) and set(m.layer_types) <= set(LAYER_TYPES), "layer_types",
         m.layer_types, f"a non-empty sequence of {', '.join(LAYER_TYPES)}"),
        (m.num_layers % max(len(m.layer_types), 1) == 0, "num_layers", m.num_layers,
         f"a multiple of len(layer_types) = {len(m.layer_types)}"),
    ]  # fmt: skip
    if m.attention == "splash":  # causal over the whole row, in the kernel's 128-token blocks
        checks += [
            (mesh.context == 1, "attention", m.attention,
             f"xla or auto with mesh context = {mesh.context} (splash needs whole rows: context 1)"),
            (seq % 128 == 0, "seq_len", seq, "a multiple of 128 for attention=splash"),
        ]  # fmt: skip
    if "linear_attention" in m.layer_types:
        checks += _linear_attention_checks(m, mesh, seq)
    per_shard = seq // max(mesh.context, 1)
    local = rows // max(mesh.row_groups, 1) * per_shard
    chunks = config.moe.token_chunks
    checks.append((local % chunks == 0, "num_moe_token_chunks", chunks,
                   f"a divisor of the tokens one device holds = {local}"))  # fmt: skip
    for name, chunk in (
        ("compute_logps_chunk_size", config.loss.compute_logps_chunk_size),
        ("attention_chunk_size", m.attention_chunk_size),
    ):
        divides = per_shard >= 1 and chunk >= 1 and per_shard % min(chunk, per_shard) == 0
        checks.append((divides, name, chunk, f"a divisor of seq_len / mesh context = {per_shard}"))
    return [f"{name}={value!r}: must be {allowed}" for ok, name, value, allowed in checks if not ok]


def _linear_attention_checks(m: ModelConfig, mesh: MeshConfig, seq: int) -> list[tuple]:
    """`_shape_problems`' checks of the Gated DeltaNet layers: (ok, field, value, what it must be)."""
    conv_width = m.linear_qkv_width
    return [
        (min(m.linear_num_key_heads, m.linear_key_head_dim, m.linear_value_head_dim,
             m.linear_conv_kernel_dim, m.linear_chunk_size) > 0, "linear_* shapes",
         (m.linear_num_key_heads, m.linear_key_head_dim, m.linear_value_head_dim,
          m.linear_conv_kernel_dim, m.linear_chunk_size), "positive with linear_attention layers"),
        (m.linear_num_value_heads > 0
         and m.linear_num_value_heads % max(m.linear_num_key_heads, 1) == 0,
         "linear_num_value_heads", m.linear_num_value_heads,
         f"a positive multiple of linear_num_key_heads = {m.linear_num_key_heads}"),
        # the kernel runs whole rows: it has no way to take a span's state from its peers
        (m.linear_chunk_kernel == "xla" or mesh.context == 1, "linear_chunk_kernel",
         m.linear_chunk_kernel,
         f"xla with mesh context = {mesh.context} (the pallas kernel needs whole rows: context 1)"),
        # its blocks: a head's [C, D] as TPU tiles of 8 rows and 128 lanes
        (m.linear_chunk_kernel == "xla" or (m.linear_key_head_dim % 128 == 0
         and m.linear_value_head_dim % 128 == 0 and m.linear_chunk_size % 8 == 0),
         "linear_chunk_kernel", m.linear_chunk_kernel,
         f"xla with linear_key_head_dim={m.linear_key_head_dim}, linear_value_head_dim="
         f"{m.linear_value_head_dim}, linear_chunk_size={m.linear_chunk_size} (the pallas"
         " kernel's blocks need head dims that are multiples of 128 and a multiple of 8 tokens"
         " a chunk)"),
        # the convolution kernel runs whole rows, its channels in blocks of 128 lanes, and keeps a
        # float32 tile's 8 rows between blocks
        (m.linear_conv_kernel == "xla" or (mesh.context == 1 and m.linear_conv_kernel_dim <= 8
         and conv_width % 128 == 0), "linear_conv_kernel", m.linear_conv_kernel,
         f"xla with mesh context = {mesh.context}, linear_conv_kernel_dim ="
         f" {m.linear_conv_kernel_dim} and q, k and v {conv_width} channels wide (the pallas"
         " kernel needs whole rows: context 1, at most 8 taps, and a multiple of 128 channels)"),
        # a convolution reads its taps - 1 earlier tokens from the previous context shard only
        (seq // max(mesh.context, 1) >= m.linear_conv_kernel_dim - 1, "linear_conv_kernel_dim",
         m.linear_conv_kernel_dim, f"at most seq_len / mesh context + 1 = {seq // max(mesh.context, 1) + 1}"),
    ]  # fmt: skip
