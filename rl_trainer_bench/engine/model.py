"""The decoder: embeddings, attention over packed segments, RMSNorm, rotary, MoE layers, output head.

Each layer mixes tokens by full attention or Gated DeltaNet (`gated_deltanet.py`) as the repeating
block `layer_types` says. Blocks of it run under `jax.lax.scan` over stacked weights, so compile
time does not grow with depth, and each layer is rematerialized by the `remat_policy` knob. Parameters are float32; each layer
casts them to the compute dtype where it uses them. The model returns the final hidden states, not
logits: the head is applied chunk by chunk in `loss.py` so [B, T, V] never exists.

Shape legend (docs/engine.md): B rows of a micro-batch, T tokens per row, D model width, H query
heads, KV key/value heads, hd head width, V vocabulary, L layers, E experts, K experts per token,
F an expert's hidden width, C slots per expert buffer, Gr x Gc token groups (one per device
holding tokens: row groups x context groups), N tokens per group.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine import gated_deltanet, moe, parameters, sharding
from rl_trainer_bench.engine.config import AttentionImpl, ModelConfig, choices

# What each `RematPolicy` saves; "none" runs the layer without a checkpoint.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
ATTENTION_CHOICES = choices(AttentionImpl)
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


def rms_norm(x, scale, eps):
    """x / rms(x) * scale, computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale).astype(x.dtype)


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


def split_chunks(x, chunk, shards):
    """[B, T, ...] -> [T / (chunk * shards), B, shards, chunk, ...]: chunks to scan over.

    The `shards` axis stays where the context axis splits T, so each scan iteration works on one
    chunk per context shard and nothing moves between devices to form a chunk.
    """
    b, t, *rest = x.shape
    x = x.reshape(b, shards, t // (shards * chunk), chunk, *rest)
    return jnp.moveaxis(x, 2, 0)


def merge_chunks(x):
    """Inverse of `split_chunks`."""
    n, b, shards, chunk, *rest = x.shape
    return jnp.moveaxis(x, 0, 2).reshape(b, shards * n * chunk, *rest)


def attention_xla(q, k, v, segments, chunk, shards):
    """Masked attention in plain XLA, one chunk of queries at a time: peak [B, H, chunk, T] logits.

    q: [B, T, H, hd]; k, v: [B, T, KV, hd] (grouped-query: H = KV x G).
    """
    b, t, h, hd = q.shape
    kv = k.shape[2]
    chunk = min(chunk, t // shards)
    q_chunks = split_chunks(q.reshape(b, t, kv, h // kv, hd), chunk, shards)
    seg_chunks = split_chunks(segments, chunk, shards)
    index_chunks = split_chunks(jnp.broadcast_to(jnp.arange(t), (b, t)), chunk, shards)
    scale = hd**-0.5

    @jax.checkpoint
    def one_chunk(_, inputs):
        q_c, seg_c, idx_c = inputs  # [B, S, c, KV, G, hd], [B, S, c], [B, S, c]
        q_c = q_c.reshape(b, -1, kv, h // kv, hd)
        logits = jnp.einsum("bqkgd,bskd->bkgqs", q_c, k, preferred_element_type=jnp.float32)
        mask = segment_mask(seg_c.reshape(b, -1), segments, idx_c[0].reshape(-1), jnp.arange(t))
        logits = jnp.where(mask[:, None, None], logits * scale, _MASKED)
        weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v)
        return None, out.reshape(b, shards, -1, h, hd)

    _, out = jax.lax.scan(one_chunk, None, (q_chunks, seg_chunks, index_chunks))
    return merge_chunks(out)


def attention_cudnn(q, k, v, segments):
    """cuDNN flash attention, causal, with the segment boundaries as a mask."""
    t = q.shape[1]
    mask = segment_mask(segments, segments, jnp.arange(t), jnp.arange(t))[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation="cudnn")


def attention_method(choice: str, platform: str) -> str:
    """Resolve `auto`: cuDNN flash attention on GPUs, query-chunked XLA elsewhere."""
    if choice != "auto":
        return choice
    return "cudnn" if platform in ("gpu", "cuda") else "xla"


def attention(x, layer, positions, segments, config: ModelConfig, method: str, shards: int):
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
    else:
        out = attention_xla(q, k, v, segments, config.attention_chunk_size, shards)
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
    """A weight as a layer uses it: in the compute dtype (unless kept in float32), gathered."""
    if not parameters.PARAMETERS[name].float32:
        weight = weight.astype(dtype)
    return sharding.gathered(name, weight)


def decoder(params, batch, config: ModelConfig, *, capacity_factor, mesh_config, methods):
    """Hidden states after the final norm, [B, T, D], and whether any layer dropped a pair.

    batch: device arrays of the payload (`routed_experts` [B, T, L, K] replays the routes);
    methods: resolved choices (`programs.Methods`). The scan runs over blocks of `layer_types`;
    inside a block each layer takes its slice of the per-layer and per-mixer stacks.
    """
    dtype = jnp.dtype(config.dtype)
    pattern = config.layer_types
    blocks = config.num_layers // len(pattern)
    segments, positions = batch["segment_ids"], batch["positions"]
    valid = segments != 0
    groups = (sharding.row_groups(mesh_config), mesh_config.context)
    x = sharding.constrain(params["embed"][batch["input_ids"]].astype(dtype), sharding.ACTIVATIONS)
    stacked = {  # [blocks, layers of the block (of the mixer), ...]
        name: weight.reshape(blocks, -1, *weight.shape[1:])
        for name, weight in params.items()
        if parameters.PARAMETERS[name].layered
    }
    replayed = batch.get("routed_experts")
    if replayed is not None:  # [blocks, layers per block, B, T, K]: scanned with the weights
        replayed = jnp.moveaxis(replayed, 2, 0).reshape(blocks, len(pattern), *segments.shape, -1)

    def mix(kind, h, layer):
        if kind == "linear_attention":
            return gated_deltanet.gated_deltanet(h, layer, segments, config, mesh_config.context)
        return attention(
            h, layer, positions, segments, config, methods.attention, mesh_config.context
        )

    def layer_fn(kind, x, layer, routes):
        layer = {name: compute_weight(name, w, dtype) for name, w in layer.items()}
        h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
        x = x + mix(kind, h, layer)
        h = rms_norm(x, layer["mlp_norm"], config.rms_norm_eps)
        ffn, overflow = moe.moe_ffn(
            h,
            layer,
            valid,
            routes,
            top_k=config.top_k,
            capacity_factor=capacity_factor,
            groups=groups,
            methods=(methods.expert_compute, methods.dropless_compute),
        )
        if "shared_gate" in layer:
            ffn = ffn + shared_expert(h, layer)
        return sharding.constrain(x + ffn, sharding.ACTIVATIONS), overflow

    layer_fns = {kind: functools.partial(layer_fn, kind) for kind in set(pattern)}
    if config.remat_policy != "none":
        policy = REMAT_POLICIES[config.remat_policy]
        layer_fns = {kind: jax.checkpoint(fn, policy=policy) for kind, fn in layer_fns.items()}

    def block_fn(x, scanned):
        weights, routes = scanned
        overflows = []
        for index, kind in enumerate(pattern):
            of_kind = pattern[:index].count(kind)  # this layer's slot in its mixer's stacks
            layer = {n: weights[n][index] for n in parameters.LAYER_WEIGHTS if n in weights}
            layer |= {
                n: weights[n][of_kind] for n in parameters.MIXER_WEIGHTS[kind] if n in weights
            }
            x, overflow = layer_fns[kind](x, layer, None if routes is None else routes[index])
            overflows.append(overflow)
        return x, jnp.any(jnp.stack(overflows))

    x, overflow = jax.lax.scan(block_fn, x, (stacked, replayed))
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), jnp.any(overflow)
