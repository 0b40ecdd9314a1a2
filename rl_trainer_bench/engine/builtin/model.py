"""The decoder: embeddings, attention over packed segments, RMSNorm, rotary, MoE layers, output head.

Each layer mixes tokens by full attention or Gated DeltaNet (`gated_deltanet.py`) as the repeating
block `layer_types` says. Blocks of it run under `jax.lax.scan` over stacked weights, so compile
time does not grow with depth (`scan_layers`, the default; without it they run one after another),
and each layer is rematerialized by the `remat_policy` knob. Parameters are float32; each layer
casts them to the compute dtype where it uses them. The model returns the final hidden states, not
logits: the head is applied chunk by chunk in `loss.py` so [B, T, V] never exists.

Shape legend (docs/engine.md): B rows of a micro-batch, T tokens per row, D model width, H query
heads, KV key/value heads, hd head width, V vocabulary, L layers, E experts, K experts per token,
F an expert's hidden width, C slots per expert buffer, N tokens per group (a device's tokens, or
1/num_moe_token_chunks of them), A devices on the expert axis.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine.builtin import (
    delta_rule_kernel,
    gated_deltanet,
    moe,
    parameters,
    sharding,
)
from rl_trainer_bench.engine.builtin.norms import rms_norm
from rl_trainer_bench.engine.config import GPU_PLATFORMS, ModelConfig

# What each `RematPolicy` saves; "none" runs the layer without a checkpoint.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# What a layer keeps by name under any policy: the MoE's routing (and with `keep_moe_gate_up`, its
# gate and up outputs), and with `keep_delta_rule_outputs` the delta-rule kernel's forward results.
KEPT_BY_NAME = jax.checkpoint_policies.save_from_both_policies(
    moe.KEPT_FOR_BACKWARD, jax.checkpoint_policies.save_only_these_names(delta_rule_kernel.KEPT)
)
_MASKED = -1e30  # finite, so a row with nothing to attend to (padding) gives zeros, not NaN


def init_params(config: ModelConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Float32 parameters (`parameters.PARAMETERS`): normal(0, 1/sqrt(fan_in)) matrices, unit norms."""
    shapes = parameters.parameter_shapes(config)
    drawn = [name for name in shapes if parameters.PARAMETERS[name].fan_in is not parameters.ONES]
    keys = dict(zip(drawn, jax.random.split(key, len(drawn)), strict=True))
    params = {}
    for name, shape in shapes.items():
        if name in keys:
            scale = jnp.sqrt(float(parameters.fan_in(config, name)))
            params[name] = jax.random.normal(keys[name], shape, jnp.float32) / scale
        else:
            params[name] = jnp.ones(shape, jnp.float32)
    return params


def rotary(x, positions, theta):
    """Rotate half-dims of x [B, T, heads, hd] by angles positions x theta^(-2i/hd)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, hd/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def segment_mask(q_segments, kv_segments, q_index, kv_index):
    """[B, q, s] bool: same non-padding segment and key not after query."""
    same = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] != 0)
    return same & (kv_index[None, None, :] <= q_index[None, :, None])


def split_chunks(x, chunk):
    """[B, T, ...] -> [T / chunk, B, chunk, ...]: a device's tokens in chunks to scan over."""
    b, t, *rest = x.shape
    return jnp.moveaxis(x.reshape(b, t // chunk, chunk, *rest), 1, 0)


def merge_chunks(x):
    """Inverse of `split_chunks`."""
    n, b, chunk, *rest = x.shape
    return jnp.moveaxis(x, 0, 1).reshape(b, n * chunk, *rest)


def context_attention(q, k, v, segments, chunk):
    """Masked attention over packed segments with the sequence split over `context`.

    q: [B, T, H, hd]; k, v: [B, T, KV, hd] (grouped-query: H = KV x G), all split like the tokens.
    Each device gathers every key and value of its rows over the context axis (what
    `context_parallel_strategy=all_gather` does) and attends its own queries to them, `chunk`
    queries at a time, so its logits peak at [B, H, chunk, T] (docs/engine.md, "Attention").
    """
    return jax.shard_map(
        functools.partial(local_attention, chunk=chunk),
        in_specs=(sharding.HEADS, sharding.HEADS, sharding.HEADS, sharding.TOKENS),
        out_specs=sharding.HEADS,
        check_vma=False,
    )(q, k, v, segments)


def local_attention(q, k, v, segments, *, chunk):
    """One device's queries against its rows' gathered keys (inside `context_attention`)."""
    b, t, h, hd = q.shape
    k, v, kv_segments = (
        jax.lax.all_gather(a, "context", axis=1, tiled=True) for a in (k, v, segments)
    )
    kv = k.shape[2]
    chunk = min(chunk, t)
    first = jax.lax.axis_index("context") * t  # this shard's first position in the row
    q_index = jnp.broadcast_to(first + jnp.arange(t), (b, t))
    scale = hd**-0.5

    @jax.checkpoint
    def one_chunk(_, inputs):
        q_c, seg_c, idx_c = inputs  # [B, c, H, hd], [B, c], [B, c]
        q_c = q_c.reshape(b, -1, kv, h // kv, hd)
        logits = jnp.einsum("bqkgd,bskd->bkgqs", q_c, k, preferred_element_type=jnp.float32)
        mask = segment_mask(seg_c, kv_segments, idx_c[0], jnp.arange(k.shape[1]))
        logits = jnp.where(mask[:, None, None], logits * scale, _MASKED)
        weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v)
        return None, out.reshape(b, -1, h, hd)

    xs = tuple(split_chunks(a, chunk) for a in (q, segments, q_index))
    _, out = jax.lax.scan(one_chunk, None, xs)
    return merge_chunks(out)


def attention_cudnn(q, k, v, segments):
    """cuDNN flash attention, causal, with the segment boundaries as a mask."""
    t = q.shape[1]
    mask = segment_mask(segments, segments, jnp.arange(t), jnp.arange(t))[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation="cudnn")


def splash_attention(q, k, v, segments, interpret=False):
    """Pallas' splash attention kernel for TPUs, causal within each packed segment, on each
    device's rows (mesh context 1: the kernel's causal mask is static, so queries and keys are the
    same whole rows). `interpret` runs the kernel in Pallas's interpreter, to check it off a TPU."""
    return jax.shard_map(
        functools.partial(local_splash_attention, interpret=interpret),
        in_specs=(sharding.HEADS, sharding.HEADS, sharding.HEADS, sharding.TOKENS),
        out_specs=sharding.HEADS,
        check_vma=False,
    )(q, k, v, segments)


def local_splash_attention(q, k, v, segments, *, interpret=False):
    """One device's rows through the kernel: grouped-query attention as one multi-query kernel per
    key/value head, over its G query heads; the scores stay in the core's memory, where the XLA
    path writes [B, KV, G, chunk, T] of them to HBM per query chunk."""
    # Pallas' TPU kernels: imported for attention=splash alone, as moe's gmm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    b, t, h, hd = q.shape
    kv = k.shape[2]
    block = math.gcd(t, 512)
    sizes = {f"block_{n}": block for n in ("q", "kv", "kv_compute", "q_dkv", "kv_dkv")}
    sizes |= {"block_kv_dkv_compute": block, "block_q_dq": block, "block_kv_dq": block}
    kernel = kernels.make_splash_mqa_single_device(
        masks.MultiHeadMask([masks.CausalMask((t, t))] * (h // kv)),
        block_sizes=kernels.BlockSizes(**sizes),
        interpret=interpret,
    )

    def one_head(queries, keys, values, row_segments):
        return kernel(
            queries, keys, values, segment_ids=kernels.SegmentIds(row_segments, row_segments)
        )

    queries = jnp.moveaxis(q.reshape(b, t, kv, h // kv, hd), 1, 3) * hd**-0.5  # [B, KV, G, T, hd]
    keys, values = (jnp.moveaxis(a, 1, 2) for a in (k, v))  # [B, KV, T, hd]
    per_row = jax.vmap(one_head, in_axes=(0, 0, 0, None))
    out = jax.vmap(per_row)(queries, keys, values, segments)  # [B, KV, G, T, hd]
    return jnp.moveaxis(out, 3, 1).reshape(b, t, h, hd).astype(q.dtype)


def attention_method(choice: str, platform: str) -> str:
    """Resolve `auto`: cuDNN flash attention on GPUs, query-chunked XLA elsewhere."""
    if choice != "auto":
        return choice
    return "cudnn" if platform in GPU_PLATFORMS else "xla"


def attention(x, layer, positions, segments, config: ModelConfig, method: str):
    """Self-attention of one layer over packed segments: x [B, T, D] -> [B, T, D].

    With `attention_output_gate`, each head's output is scaled by sigmoid(x W_gate) before the
    output projection, as in Qwen3.5's full-attention layers.
    """
    dtype = x.dtype
    q = jnp.einsum("btd,dhk->bthk", x, layer["wq"].astype(dtype))
    k = jnp.einsum("btd,dhk->bthk", x, layer["wk"].astype(dtype))
    v = jnp.einsum("btd,dhk->bthk", x, layer["wv"].astype(dtype))
    q, k = rotary(q, positions, config.rope_theta), rotary(k, positions, config.rope_theta)
    if method == "cudnn":
        out = attention_cudnn(q, k, v, segments)
    elif method == "splash":
        out = splash_attention(q, k, v, segments)
    else:
        out = context_attention(q, k, v, segments, config.attention_chunk_size)
    out = out * (segments != 0)[:, :, None, None].astype(dtype)  # padding contributes nothing
    if "wq_gate" in layer:
        out = out * jax.nn.sigmoid(jnp.einsum("btd,dhk->bthk", x, layer["wq_gate"].astype(dtype)))
    return jnp.einsum("bthk,hkd->btd", out, layer["wo"].astype(dtype))


def shared_expert(x, layer):
    """The dense SwiGLU every token also passes through (when the model has one)."""
    dtype = x.dtype
    hidden = jax.nn.silu(x @ layer["shared_gate"].astype(dtype)) * (
        x @ layer["shared_up"].astype(dtype)
    )
    return hidden @ layer["shared_down"].astype(dtype)


def compute_weight(name: str, weight: jax.Array, dtype) -> jax.Array:
    """A weight as a layer uses it: in the compute dtype (unless kept in float32); dense weights
    gathered, expert weights left split (the MoE layer gathers them over their model dim)."""
    parameter = parameters.PARAMETERS[name]
    if not parameter.float32:
        weight = weight.astype(dtype)
    return weight if parameter.expert_dim else sharding.gathered(weight)


def embed_tokens(table, ids):
    """table[ids] for the split table (compute dtype) and ids [B, T]: [B, T, D].

    Each device gathers the table and looks up its own tokens; the gradient is summed into a
    table of that dtype per device and reduce-scattered back to the table's split, where the
    partitioner would sum a float32 table over every device (docs/engine.md, "Mesh").
    """
    spec = sharding.parameter_spec("embed", table.shape, sharding.ambient_mesh_shape())
    return jax.shard_map(
        lambda t, i: jnp.take(sharding.gather_dims(t, spec), i, axis=0),
        in_specs=(spec, sharding.TOKENS),
        out_specs=sharding.ACTIVATIONS,
        check_vma=False,
    )(table, ids)


class MixerRun(NamedTuple):
    """Consecutive layers of one mixer kind inside a block: one scan of their own."""

    kind: str
    first_layer: int  # in the block
    first_slot: int  # in the kind's parameter stacks
    length: int


def mixer_runs(pattern: tuple[str, ...]) -> list[MixerRun]:
    """The runs of one mixer in a block. Qwen3.5's (linear x 3, full) is
    [MixerRun(linear, 0, 0, 3), MixerRun(full, 3, 0, 1)]."""
    runs: list[MixerRun] = []
    for index, kind in enumerate(pattern):
        last = runs[-1] if runs else None
        if last is not None and last.kind == kind and last.first_layer + last.length == index:
            runs[-1] = last._replace(length=last.length + 1)
        else:
            runs.append(MixerRun(kind, index, pattern[:index].count(kind), 1))
    return runs


def layer_functions(batch, config: ModelConfig, *, capacity_factor, token_chunks, methods):
    """One layer per mixer kind, (x, weights, routes) -> (x, overflow), rematerialized by policy."""
    dtype = jnp.dtype(config.dtype)
    segments, positions = batch["segment_ids"], batch["positions"]

    def mix(kind, h, layer):
        if kind == "linear_attention":
            return gated_deltanet.gated_deltanet(
                h,
                layer,
                segments,
                config,
                methods.linear_chunk_inverse,
                methods.linear_chunk_kernel,
                methods.linear_conv_kernel,
            )
        return attention(h, layer, positions, segments, config, methods.attention)

    def layer_fn(kind, x, layer, routes):
        layer = {name: compute_weight(name, w, dtype) for name, w in layer.items()}
        h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
        x = x + mix(kind, h, layer)
        h = rms_norm(x, layer["mlp_norm"], config.rms_norm_eps)
        ffn, overflow = moe.moe_ffn(
            h,
            layer,
            segments != 0,
            routes,
            top_k=config.top_k,
            capacity_factor=capacity_factor,
            token_chunks=token_chunks,
            methods=(methods.expert_compute, methods.dropless_compute, methods.pair_ranking),
            prefuse=methods.prefuse_moe_weights,
            keep_gate_up=methods.keep_moe_gate_up,
        )
        if "shared_gate" in layer:
            ffn = ffn + shared_expert(h, layer)
        return sharding.constrain(x + ffn, sharding.ACTIVATIONS), overflow

    layer_fns = {kind: functools.partial(layer_fn, kind) for kind in set(config.layer_types)}
    if config.remat_policy == "none":
        return layer_fns
    policy = jax.checkpoint_policies.save_from_both_policies(
        REMAT_POLICIES[config.remat_policy], KEPT_BY_NAME
    )
    return {kind: jax.checkpoint(fn, policy=policy) for kind, fn in layer_fns.items()}


@jax.custom_vjp
def _summed_into(sums, weights, rows):
    """`sums` and `weights` as they are. Backward, each weight's cotangent is added into row
    `rows[name]` of `sums`'s cotangent, in place, and the weights get none: the way `decoder`
    sums a micro-batch's gradient into the step's as the backward pass reaches each layer."""
    return sums, weights


def _summed_into_forward(sums, weights, rows):
    return (sums, weights), rows


def _summed_into_backward(rows, cotangents):
    sums, grads = cotangents
    summed = dict(sums)
    for name, grad in grads.items():
        row = jax.lax.dynamic_index_in_dim(sums[name], rows[name], keepdims=False)
        summed[name] = jax.lax.dynamic_update_index_in_dim(
            sums[name], (row + grad).astype(row.dtype), rows[name], 0
        )
    return summed, None, None


_summed_into.defvjp(_summed_into_forward, _summed_into_backward)


def run_offsets(pattern: tuple[str, ...], run: MixerRun) -> dict[str, tuple[int, int]]:
    """Per weight a run's layers use, (the row of its first layer in a block, rows per block) in
    the weight's stack: `LAYER_WEIGHTS` are stacked on every layer, a mixer's weights on that
    mixer's layers alone."""
    offsets = {n: (run.first_layer, len(pattern)) for n in parameters.LAYER_WEIGHTS}
    mixer_rows = pattern.count(run.kind)
    return offsets | {n: (run.first_slot, mixer_rows) for n in parameters.MIXER_WEIGHTS[run.kind]}


def decoder(params, batch, config: ModelConfig, *, capacity_factor, token_chunks, methods, sums):
    """Hidden states after the final norm, [B, T, D], whether any layer dropped a pair, and `sums`.

    batch: device arrays of the payload (`routed_experts` [B, T, L, K] replays the routes);
    methods: resolved choices (`programs.Methods`). The scan runs over blocks of `layer_types`;
    inside a block each run of one mixer (`mixer_runs`) is a scan of its own over its layers'
    slices of the per-layer and per-mixer stacks, so the compiled body holds one layer per mixer
    kind however long the block is; with `scan_layers` false both loops run their trips one after
    another (`layer_loop`).

    sums: None, or the step's gradient sum of every layer weight (stacked as its parameter),
    returned as it is. Its cotangent is the backward scans' carry: each layer adds its weights'
    gradient into its rows there (`_summed_into`), so `programs.fwd_bwd`, seeding that cotangent
    with the running sum, gets the sum with the micro-batch in and never holds the micro-batch's
    gradient of every layer beside it (docs/engine.md, "The gradient sum").
    """
    pattern = config.layer_types
    blocks = config.num_layers // len(pattern)
    x = embed_tokens(params["embed"].astype(config.dtype), batch["input_ids"])
    stacked = {  # [blocks, layers of the block (of the mixer), ...]
        name: weight.reshape(blocks, -1, *weight.shape[1:])
        for name, weight in params.items()
        if parameters.PARAMETERS[name].layered
    }
    replayed = batch.get("routed_experts")
    if replayed is not None:  # [blocks, layers per block, B, T, K]: scanned with the weights
        replayed = jnp.moveaxis(replayed, 2, 0).reshape(blocks, len(pattern), *x.shape[:2], -1)
    layers = layer_functions(
        batch, config, capacity_factor=capacity_factor, token_chunks=token_chunks, methods=methods
    )

    def one_layer(kind, carry, scanned):
        x, sums = carry
        weights, routes, rows = scanned
        if sums is not None:
            sums, weights = _summed_into(sums, weights, rows)
        x, overflow = layers[kind](x, weights, routes)
        return (x, sums), overflow

    def block_fn(carry, scanned):
        weights, routes, block = scanned
        overflow = jnp.zeros((), bool)
        for run in mixer_runs(pattern):
            offsets = {n: o for n, o in run_offsets(pattern, run).items() if n in weights}
            steps = jnp.arange(run.length, dtype=jnp.int32)
            run_weights = {n: weights[n][f : f + run.length] for n, (f, _) in offsets.items()}
            rows = {n: block * per_block + f + steps for n, (f, per_block) in offsets.items()}
            run_routes = None
            if routes is not None:
                run_routes = routes[run.first_layer : run.first_layer + run.length]
            carry, flags = layer_loop(
                functools.partial(one_layer, run.kind), carry, (run_weights, run_routes, rows),
                config.scan_layers,
            )  # fmt: skip
            overflow = overflow | jnp.any(flags)
        return carry, overflow

    blocks_in = (stacked, replayed, jnp.arange(blocks, dtype=jnp.int32))
    (x, sums), overflow = layer_loop(block_fn, (x, sums), blocks_in, config.scan_layers)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), jnp.any(overflow), sums


def layer_loop(fn, carry, xs, scan):
    """`jax.lax.scan(fn, carry, xs)`, or with `scan` false (`scan_layers`) the same trips one after
    another in the program: each trip's code of its own, and what the backward pass reads of a
    trip its own buffers, not a slice of arrays stacked across the trips."""
    if scan:
        return jax.lax.scan(fn, carry, xs)
    outs = []
    for trip in range(len(jax.tree.leaves(xs)[0])):
        carry, out = fn(carry, jax.tree.map(lambda a, t=trip: a[t], xs))
        outs.append(out)
    return carry, jnp.stack(outs)
