"""The decoder: embeddings, attention over packed segments, RMSNorm, rotary, MoE layers, output head.

Each layer mixes tokens by full attention or Gated DeltaNet (`gated_deltanet.py`) as the repeating
block `layer_types` says. Blocks run under `jax.lax.scan` over stacked weights, so compile time does
not grow with depth, and each layer is rematerialized by the `remat_policy` knob. Parameters are float32; each layer
casts them to the compute dtype where it uses them. The model returns the final hidden states, not
logits: the head is applied chunk by chunk in `loss.py` so [B, T, V] never exists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rl_trainer_bench.engine import gated_deltanet, moe
from rl_trainer_bench.engine import mesh as sharding
from rl_trainer_bench.engine.engine_config import ModelConfig

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
ATTENTION_CHOICES = ("auto", "xla", "cudnn")
LAYER_TYPES = ("full_attention", "linear_attention")
_MASKED = -1e30  # finite, so a row with nothing to attend to (padding) gives zeros, not NaN


def init_params(config: ModelConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Float32 parameters: normal(0, 1/sqrt(fan_in)) matrices, unit norms; layer weights stacked on
    their layers (L, or the full- / linear-attention layers for those mixers' weights)."""
    c = config
    L, D, E = c.num_layers, c.d_model, c.num_experts
    full, linear = c.layers_of("full_attention"), c.layers_of("linear_attention")
    shapes = {
        "embed": ((c.vocab_size, D), 1.0),
        "head": ((D, c.vocab_size), D),
        "wq": ((full, D, c.num_heads, c.head_dim), D),
        "wk": ((full, D, c.num_kv_heads, c.head_dim), D),
        "wv": ((full, D, c.num_kv_heads, c.head_dim), D),
        "wo": ((full, c.num_heads, c.head_dim, D), c.num_heads * c.head_dim),
        "router": ((L, D, E), D),
        "expert_gate": ((L, E, D, c.expert_ffn_dim), D),
        "expert_up": ((L, E, D, c.expert_ffn_dim), D),
        "expert_down": ((L, E, c.expert_ffn_dim, D), c.expert_ffn_dim),
    }
    if c.shared_expert_ffn_dim:
        shapes["shared_gate"] = ((L, D, c.shared_expert_ffn_dim), D)
        shapes["shared_up"] = ((L, D, c.shared_expert_ffn_dim), D)
        shapes["shared_down"] = ((L, c.shared_expert_ffn_dim, D), c.shared_expert_ffn_dim)
    if c.attention_output_gate:
        shapes["wq_gate"] = ((full, D, c.num_heads, c.head_dim), D)
    if linear:
        shapes.update(gated_deltanet.random_weight_shapes(c, linear))
    if not full:
        shapes = {name: spec for name, spec in shapes.items() if name not in FULL_ATTENTION_WEIGHTS}
    keys = jax.random.split(key, len(shapes))
    params = {
        name: jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(float(fan_in))
        for k, (name, (shape, fan_in)) in zip(keys, shapes.items(), strict=True)
    }
    params["attn_norm"] = jnp.ones((L, D), jnp.float32)
    params["mlp_norm"] = jnp.ones((L, D), jnp.float32)
    params["final_norm"] = jnp.ones((D,), jnp.float32)
    if linear:
        params.update(gated_deltanet.fixed_weights(c, linear))
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


FULL_ATTENTION_WEIGHTS = ("wq", "wk", "wv", "wo", "wq_gate")
MIXER_WEIGHTS = {
    "full_attention": FULL_ATTENTION_WEIGHTS,
    "linear_attention": gated_deltanet.WEIGHTS,
}
LAYER_WEIGHTS = (  # every layer's, stacked on L
    "attn_norm",
    "mlp_norm",
    "router",
    "expert_gate",
    "expert_up",
    "expert_down",
    "shared_gate",
    "shared_up",
    "shared_down",
)


def decoder(params, batch, config: ModelConfig, *, capacity_factor, mesh_config, methods):
    """Hidden states after the final norm, [B, T, D], and whether any layer dropped a pair.

    batch: device arrays of the payload (`routed_experts` [B, T, L, K] replays the routes);
    methods: resolved (attention, expert compute) choices. The scan runs over blocks of
    `layer_types`; inside a block each layer takes its slice of the per-layer and per-mixer stacks.
    """
    attention_impl, expert_impl = methods
    dtype = jnp.dtype(config.dtype)
    pattern = config.layer_types
    blocks = config.num_layers // len(pattern)
    segments, positions = batch["segment_ids"], batch["positions"]
    valid = segments != 0
    groups = (sharding.row_groups(mesh_config), mesh_config.context)
    x = sharding.constrain(params["embed"][batch["input_ids"]].astype(dtype), sharding.ACTIVATIONS)
    stacked = {
        name: weight.reshape(blocks, -1, *weight.shape[1:])
        for name, weight in params.items()
        if name in LAYER_WEIGHTS or any(name in names for names in MIXER_WEIGHTS.values())
    }
    replayed = batch.get("routed_experts")
    if replayed is not None:  # [blocks, layers per block, B, T, K]: scanned with the weights
        replayed = jnp.moveaxis(replayed, 2, 0).reshape(blocks, len(pattern), *segments.shape, -1)

    def mix(kind, h, layer):
        if kind == "linear_attention":
            return gated_deltanet.gated_deltanet(h, layer, segments, config, mesh_config.context)
        return attention(h, layer, positions, segments, config, attention_impl, mesh_config.context)

    def layer_fn(kind, x, layer, routes):
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
            method=expert_impl,
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
            layer = {name: weights[name][index] for name in LAYER_WEIGHTS if name in weights}
            layer |= {
                name: weights[name][of_kind] for name in MIXER_WEIGHTS[kind] if name in weights
            }
            x, overflow = layer_fns[kind](x, layer, None if routes is None else routes[index])
            overflows.append(overflow)
        return x, jnp.any(jnp.stack(overflows))

    x, overflow = jax.lax.scan(block_fn, x, (stacked, replayed))
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), jnp.any(overflow)
