"""The MoE feed-forward: routing (top-k or replay), capacity buffers with drops, expert compute, combine.

The step time of an MoE trainer depends on how many (token, expert) pairs each expert receives, so
the layer reproduces the production semantics exactly (docs/engine.md): replayed routes take precedence
over the router, slots are handed out in token order per group of device-local tokens, pairs past
the capacity are dropped and raise the overflow flag, and `capacity_factor=DROPLESS` (-1) is the dropless
program that a replay of an overflowing micro-batch runs.

Shape legend (docs/engine.md): B rows of a micro-batch, T tokens per row, D model width, H query
heads, KV key/value heads, hd head width, V vocabulary, L layers, E experts, K experts per token,
F an expert's hidden width, C slots per expert buffer, N tokens per group (a device's tokens, or
1/num_moe_token_chunks of them), A devices on the expert axis.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rl_trainer_bench.engine.builtin import sharding
from rl_trainer_bench.engine.builtin.sharding import EXPERT_AXIS
from rl_trainer_bench.engine.config import (
    DROPLESS,
    SORTED_EXPERT_COMPUTE,
    DroplessCompute,
    ExpertCompute,
    choices,
    expert_capacity,
)

# The layouts themselves; "auto" picks one of them per platform.
EXPERT_COMPUTE_CHOICES = tuple(c for c in choices(ExpertCompute) if c != "auto")
# How a dropless program computes: `capacity` buffers of N slots per expert (E x N per group), or
# the token-sorted layout with a grouped matmul (`ragged_dot`, or the TPU kernel `gmm`).
DROPLESS_COMPUTE_CHOICES = tuple(c for c in choices(DroplessCompute) if c != "auto")
EXPERT_WEIGHTS = ("expert_gate", "expert_up", "expert_down")
# The name the routing's integer results (where each pair goes) carry for the layer's remat
# policy: kept for the backward pass rather than sorted again there (`KEPT_FOR_BACKWARD`).
ROUTING = "moe_routing"
# A sort of a device's pairs is the slowest op to compile here
# (benchmarks/reports/aot-compile-time_tpu7x-v5p_2026-12-02.md) and is not free to run; what it
# yields is a few int32 vectors per layer, so the backward reads them instead of sorting again.
# The name of the expert gate and up outputs a layer keeps with `keep_moe_gate_up` (nothing
# carries it without).
GATE_UP = "moe_gate_up"
KEPT_FOR_BACKWARD = jax.checkpoint_policies.save_only_these_names(ROUTING, GATE_UP)


def _saved(*routing):
    """`routing` named for the remat policy (`KEPT_FOR_BACKWARD`)."""
    return tuple(checkpoint_name(a, ROUTING) for a in routing)


class ExpertWeights(NamedTuple):
    """A layer's expert weights as its matmuls take them: `gate_up` is (gate, up), each [E, D, F],
    or with `prefuse_moe_weights` the two side by side, ([E, D, 2F],), one grouped matmul of twice
    the width as MaxText's prefuse_moe_weights runs them; `down` is [E, F, D]."""

    gate_up: tuple[jax.Array, ...]
    down: jax.Array


def expert_weights(params, prefuse: bool) -> ExpertWeights:
    """The layer's expert parameters (in the compute dtype) as `ExpertWeights`. Joined here rather
    than stored joined: the join is one pass with the cast to the compute dtype, and its gradient
    two slices of the joined one, so the parameters, their optimizer state and every other path
    keep one layout."""
    gate, up, down = (params[name] for name in EXPERT_WEIGHTS)
    return ExpertWeights((jnp.concatenate([gate, up], axis=-1),) if prefuse else (gate, up), down)


def _spec_names(weights: ExpertWeights) -> ExpertWeights:
    """The parameter whose sharding each weight takes: a joined gate|up splits as the gate does."""
    return ExpertWeights(EXPERT_WEIGHTS[: len(weights.gate_up)], EXPERT_WEIGHTS[2])


def _gate_and_up(outputs):
    """(x Wg, x Wu) from the gate|up matmuls' outputs: two, or one of twice the width to split."""
    if len(outputs) == 2:
        return outputs
    (both,) = outputs
    width = both.shape[-1] // 2
    return both[..., :width], both[..., width:]


def gate_and_up(matmul, rows, gate_up):
    """(rows Wg, rows Wu) by `matmul`, as one matmul where `gate_up` holds the two joined."""
    return _gate_and_up(tuple(matmul(rows, w) for w in gate_up))


def gate_and_up_vjp(matmul, rows, gate_up):
    """`gate_and_up` and its pull-back: (d a, d b) -> (d rows, the gradient of each of `gate_up`)."""
    outputs, pulls = zip(*(jax.vjp(matmul, rows, w) for w in gate_up), strict=True)

    def pull(da, db):
        cotangents = (da, db) if len(pulls) == 2 else (jnp.concatenate([da, db], axis=-1),)
        d_rows, d_weights = zip(
            *(back(ct) for back, ct in zip(pulls, cotangents, strict=True)), strict=True
        )
        return sum(d_rows[1:], d_rows[0]), d_weights

    return (*_gate_and_up(outputs), pull)


# The faster expert-compute path per platform: gpu and cpu as measured
# (benchmarks/reports/engine-step_cpu_2026-11-30.md; `benchmarks/driver/engine_step.py
# --compare-expert-compute`, over the buffers); tpu the padded einsum until a chip times it against
# sorted_gmm, which runs a third of its matmul work at factor 2.75
# (benchmarks/reports/aot-one-chip-cost_v5e-v6e_2026-12-06.md; the one-chip presets name
# sorted_gmm); override with expert_compute.
FASTEST_EXPERT_COMPUTE = {"gpu": "einsum", "cuda": "einsum", "tpu": "einsum", "cpu": "einsum"}


# The layouts over E x C slot buffers (`experts_ffn`).
BUFFER_EXPERT_COMPUTE = tuple(c for c in EXPERT_COMPUTE_CHOICES if c not in SORTED_EXPERT_COMPUTE)


def expert_compute_for(choice: str, platform: str) -> str:
    """Resolve `auto` to the measured choice for `platform`."""
    if choice == "auto":
        return FASTEST_EXPERT_COMPUTE.get(platform, "einsum")
    return choice


# The grouped matmul of the dropless layout per platform: the Pallas kernel on TPU (it compiles for
# tpu7x and v5p from this host, benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md), XLA's
# ragged_dot elsewhere.
DROPLESS_COMPUTE = {"tpu": "gmm"}


def dropless_compute_for(choice: str, platform: str) -> str:
    """Resolve `auto` for `platform`."""
    if choice == "auto":
        return DROPLESS_COMPUTE.get(platform, "ragged_dot")
    return choice


def route(x, router_weights, top_k, valid, replayed=None):
    """Choose experts and gate weights per token.

    x: [..., D]; router_weights: [D, E] float32; valid: [...] bool (padding routes nowhere);
    replayed: [..., K] int expert ids (-1: empty slot) or None for the router's own top-k.
    Returns experts [..., K] int32 (-1 where no expert) and gates [..., K] float32, renormalized
    over the chosen experts.
    """
    logits = jnp.einsum("...d,de->...e", x.astype(jnp.float32), router_weights)
    probs = jax.nn.softmax(logits, axis=-1)
    if replayed is None:
        gates, experts = jax.lax.top_k(probs, top_k)
    else:
        experts = replayed.astype(jnp.int32)
        gates = jnp.take_along_axis(probs, jnp.maximum(experts, 0), axis=-1)
    keep = (experts >= 0) & valid[..., None]
    gates = jnp.where(keep, gates, 0.0)
    gates = gates / jnp.maximum(gates.sum(axis=-1, keepdims=True), 1e-9)
    return jnp.where(keep, experts, -1), gates


# Below this many experts `pair_ranking=auto` counts: the one-hot of a pair's expert (and the
# sentinel) is then at most one 128-lane row wide, and the count is a few matmuls of that width,
# where a sort of the N x K pairs takes log-squared passes over them.
COUNT_BELOW_EXPERTS = 128
# Pairs counted per block by one matmul with a lower-triangular matrix of ones.
COUNT_BLOCK = 128


def pair_ranking_for(choice: str, num_experts: int) -> str:
    """Resolve `auto` for a model of `num_experts` experts."""
    if choice == "auto":
        return "count" if num_experts < COUNT_BELOW_EXPERTS else "sort"
    return choice


def stable_ranks(keys, num_keys, ranking):
    """Each entry's rank among the earlier entries of the same key, and how many entries each key
    has: what a stable sort of `keys` by key gives (ranking `sort`), or by counting (`count`).

    keys: [P] int in [0, num_keys). Counting: the one-hot rows of the keys are summed in blocks of
    COUNT_BLOCK entries by one matmul with a strictly lower-triangular matrix of ones, and the
    blocks' totals are prefix-summed over the blocks. Exact: the inputs are 0 or 1 and every sum
    is an integer of at most COUNT_BLOCK in float32. Returns rank [P] and counts [num_keys] int32.
    """
    if ranking == "sort":
        order = jnp.argsort(keys, stable=True)
        counts = jnp.bincount(keys, length=num_keys).astype(jnp.int32)
        starts = jnp.cumsum(counts) - counts
        rank = jnp.arange(keys.shape[0], dtype=jnp.int32) - starts[keys[order]]
        return jnp.zeros_like(rank).at[order].set(rank), counts
    p = keys.shape[0]
    blocks = -(-p // COUNT_BLOCK)
    # padding entries take no key (a one-hot of num_keys is all zeros) and come after every entry
    padded = jnp.pad(keys, (0, blocks * COUNT_BLOCK - p), constant_values=num_keys)
    one_hot = jax.nn.one_hot(padded.reshape(blocks, COUNT_BLOCK), num_keys, dtype=jnp.bfloat16)
    earlier = jnp.tril(jnp.ones((COUNT_BLOCK, COUNT_BLOCK), jnp.bfloat16), -1)
    inside = jnp.einsum("ij,bjk->bik", earlier, one_hot, preferred_element_type=jnp.float32).astype(
        jnp.int32
    )  # [blocks, COUNT_BLOCK, keys]: same-key entries before it in its block
    totals = jnp.sum(one_hot, axis=1, dtype=jnp.int32)  # [blocks, keys]
    before = inside + (jnp.cumsum(totals, axis=0) - totals)[:, None, :]
    rank = jnp.sum(before * one_hot.astype(jnp.int32), axis=-1).reshape(-1)[:p]
    return rank, jnp.sum(totals, axis=0)


def slot_positions(experts, num_experts, ranking="sort"):
    """Each (token, k) pair's position in its expert's queue, counting in token-major order.

    experts: [N, K] (-1: no expert). A pair's position is its rank among the earlier pairs of its
    expert (`stable_ranks`, by a sort or by counting): a sort costs O(NK log NK) where counting
    needs a [NK, E] one-hot, which is small for few experts.
    """
    flat = jnp.where(experts < 0, num_experts, experts).reshape(-1)  # [NK], empty -> sentinel E
    rank, _ = stable_ranks(flat, num_experts + 1, ranking)
    return rank.reshape(experts.shape)


class Slots(NamedTuple):
    """Where one group's routed pairs sit in the expert buffers, both ways round.

    `of_pair` [N, K]: each pair's flat slot (E x C for a dropped or empty pair); `pair` [E x C]: the
    pair in each slot (N x K for an empty slot). Kept slots are unique, so filling the buffers and
    reading them back are both gathers, in the forward pass and in the backward pass: no scatter-add
    of [N x K, D] rows anywhere, which is what XLA's TPU backend compiles slowest here.
    """

    of_pair: jax.Array
    pair: jax.Array


def dispatch(x, experts, num_experts, slots, ranking="sort"):
    """One group's tokens into expert buffers.

    x: [N, D]; experts: [N, K]; ranking: how the queue positions are found (`stable_ranks`).
    Returns buffer [E, C, D], the `Slots` of the pairs and whether any pair overflowed.
    """
    n, k = experts.shape
    position = slot_positions(experts, num_experts, ranking)
    routed = experts >= 0
    kept = routed & (position < slots)
    of_pair = jnp.where(kept, experts * slots + position, num_experts * slots)  # [N, K]
    # A spare slot takes every dropped or empty pair and is cut off.
    pair = jnp.full((num_experts * slots + 1,), n * k, jnp.int32)
    pair = pair.at[of_pair.reshape(-1)].set(jnp.arange(n * k, dtype=jnp.int32))[:-1]
    placed = Slots(*_saved(of_pair, pair))
    buffer = _fill(x, placed)
    return buffer.reshape(num_experts, slots, -1), placed, jnp.any(routed & ~kept)


def _with_zero_row(rows):
    """rows [R, D] and a zero row after them, which sentinel indices read."""
    return jnp.concatenate([rows, jnp.zeros((1, rows.shape[-1]), rows.dtype)])


@jax.custom_vjp
def _fill(x, placed: Slots):
    """buffer[s] = x[token of the pair in slot s] (zero for an empty slot): [E x C, D]."""
    k = placed.of_pair.shape[-1]
    return _with_zero_row(x)[placed.pair // k]


def _fill_forward(x, placed):
    return _fill(x, placed), placed


def _fill_backward(placed, grad):
    """A token's gradient is the sum over its kept pairs' slots: a gather slot by slot ([K, N, D],
    see `_slot_major`), then a sum over K."""
    token_grad = _with_zero_row(grad)[placed.of_pair.T].sum(axis=0)
    return token_grad, None


_fill.defvjp(_fill_forward, _fill_backward)


@jax.custom_vjp
def combine(expert_out, placed: Slots, gates):
    """Gather each pair's expert output back to its token, weighted by its gate: [N, D]."""
    e, c, d = expert_out.shape
    pairs = _with_zero_row(expert_out.reshape(e * c, d))[placed.of_pair.T]  # [K, N, D]
    return jnp.einsum("knd,nk->nd", pairs, gates.astype(expert_out.dtype))


def _combine_forward(expert_out, placed, gates):
    return combine(expert_out, placed, gates), (expert_out, placed, gates)


def _combine_backward(saved, grad):
    """d expert_out[slot] = gate x d out[token] of the slot's pair, d gate = out of the pair's slot
    . d out[token]: gathers both (every kept slot holds exactly one pair)."""
    expert_out, placed, gates = saved
    e, c, d = expert_out.shape
    k = placed.of_pair.shape[-1]
    slot_gate = jnp.concatenate([gates.reshape(-1), jnp.zeros((1,), gates.dtype)])[placed.pair]
    slot_grad = _with_zero_row(grad)[placed.pair // k] * slot_gate[:, None].astype(grad.dtype)
    pairs = _with_zero_row(expert_out.reshape(e * c, d))[placed.of_pair.T]
    gate_grad = jnp.einsum("knd,nd->nk", pairs, grad, preferred_element_type=jnp.float32)
    return slot_grad.reshape(e, c, d).astype(expert_out.dtype), None, gate_grad.astype(gates.dtype)


combine.defvjp(_combine_forward, _combine_backward)


def expert_matmul(buffer, weights, method):
    """buffer [..., E, C, D] x weights [E, D, F] -> [..., E, C, F], by a padded einsum or ragged_dot.

    Both see the same buffers: ragged_dot gets the buffer regrouped expert-major with every group
    C slots long per leading index, so the two paths compute the same products.
    """
    if method == "einsum":
        return jnp.einsum("...ecd,edf->...ecf", buffer, weights)
    *lead, e, c, d = buffer.shape
    rows = jnp.moveaxis(buffer.reshape(-1, e, c, d), 1, 0)  # [E, G, C, D]
    groups = rows.shape[1] * c
    group_sizes = jnp.full((e,), groups, dtype=jnp.int32)
    out = jax.lax.ragged_dot(rows.reshape(e * groups, d), weights, group_sizes)
    out = jnp.moveaxis(out.reshape(e, -1, c, out.shape[-1]), 0, 1)
    return out.reshape(*lead, e, c, out.shape[-1])


def experts_ffn(buffer, weights: ExpertWeights, method):
    """SwiGLU of every expert on its buffer: [..., E, C, D] -> [..., E, C, D]."""
    a, b = gate_and_up(functools.partial(expert_matmul, method=method), buffer, weights.gate_up)
    return expert_matmul(jax.nn.silu(a) * b, weights.down, method)


def moe_ffn(
    x,
    params,
    valid,
    replayed,
    *,
    top_k,
    capacity_factor,
    token_chunks,
    methods,
    prefuse=False,
    keep_gate_up=False,
):
    """The routed feed-forward of one layer: x [B, T, D] -> ([B, T, D], overflow flag).

    params: this layer's router [D, E] and expert weights [E, D, F] / [E, F, D] in the compute dtype,
    still split as parameters (`sharding.parameter_spec`); valid: [B, T]; replayed: [B, T, K] or
    None; token_chunks: how many groups a device's tokens form, each with buffers of its own;
    methods: (expert compute, dropless compute, pair ranking) resolved. Dropless (capacity_factor
    DROPLESS) runs the token-sorted layout unless the dropless compute is `capacity`, which runs
    the capacity program's layout at C = N; a sorted expert compute runs the capacity program
    token-sorted. prefuse: gate and up as one matmul (`ExpertWeights`); keep_gate_up: a
    token-sorted layout keeps their outputs for the backward pass (`_sorted_experts`).
    """
    expert_compute, dropless_compute, ranking = methods
    experts, gates = route(x, params["router"], top_k, valid, replayed)
    weights = expert_weights(params, prefuse)
    if capacity_factor == DROPLESS and dropless_compute != "capacity":
        local = functools.partial(
            local_sorted_ffn, method=dropless_compute, ranking=ranking, keep_gate_up=keep_gate_up
        )
    elif expert_compute in SORTED_EXPERT_COMPUTE:
        local = functools.partial(
            local_sorted_ffn,
            method=SORTED_EXPERT_COMPUTE[expert_compute],
            factor=capacity_factor,
            ranking=ranking,
            keep_gate_up=keep_gate_up,
        )
    else:
        local = functools.partial(
            local_capacity_ffn, factor=capacity_factor, method=expert_compute, ranking=ranking
        )
    return expert_parallel(local, x, experts, gates, weights, token_chunks)


def expert_parallel(local, x, experts, gates, weights, token_chunks):
    """Run `local` on each device's tokens in `token_chunks` groups, under `shard_map`.

    Each group gathers its device's experts' weights over the axes that split their model dim
    (the FSDP gather, whose transpose reduce-scatters the gradient) and runs; the groups run one
    after the other, each rematerialized on its own, so the backward pass holds one group's buffers
    and one copy of the whole weights and their gradient at a time. Gathering once for all groups
    would instead carry the whole weights' gradient across the groups beside each group's own
    (MEASURED on the Qwen3.5 cell: more memory with two groups than with one,
    benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md). The
    overflow flag is the OR over every group of every device.
    """
    mesh_shape = sharding.ambient_mesh_shape()
    weight_specs = jax.tree.map(
        lambda name, w: sharding.parameter_spec(name, w.shape, mesh_shape),
        _spec_names(weights),
        weights,
    )

    def group(tokens, experts, gates, split_weights):
        whole = jax.tree.map(
            lambda w, spec: sharding.gather_dims(w, spec, keep=(EXPERT_AXIS,)),
            split_weights,
            weight_specs,
        )
        return local(tokens, experts, gates, whole)

    def per_device(x, experts, gates, weights):
        b, t, d = x.shape
        groups = tuple(
            a.reshape(token_chunks, -1, a.shape[-1]) for a in (x, experts, gates)
        )  # [chunks, N, ...]
        if token_chunks == 1:
            out, overflow = group(*(a[0] for a in groups), weights)
            out, overflow = out[None], overflow[None]
        else:
            step = jax.checkpoint(lambda _, g: (None, group(*g, weights)), policy=KEPT_FOR_BACKWARD)
            _, (out, overflow) = jax.lax.scan(step, None, groups)
        flag = jax.lax.pmax(jnp.any(overflow).astype(jnp.int32), sharding.AXES)
        return out.reshape(b, t, d), flag > 0

    tokens = sharding.ACTIVATIONS
    return jax.shard_map(
        per_device,
        in_specs=(tokens, tokens, tokens, weight_specs),
        out_specs=(tokens, sharding.REPLICATED),
        check_vma=False,
    )(x, experts, gates, weights)


def local_capacity_ffn(tokens, experts, gates, weights, *, factor, method, ranking="sort"):
    """One group's pairs in per-expert buffers of C slots; pairs past C drop (the overflow flag).

    tokens [N, D], experts and gates [N, K]: one group of a device's tokens; weights: this
    device's experts, whole. The buffers of all E experts are filled locally, then one all-to-all
    over the expert axis brings each device the slots of its own experts from every peer, and a
    second one brings the results back.
    """
    num_local = weights.down.shape[0]
    peers = jax.lax.axis_size(EXPERT_AXIS)
    num_experts, (n, d) = num_local * peers, tokens.shape
    slots = expert_capacity(n, experts.shape[-1], num_experts, factor)
    buffer, placed, overflow = dispatch(tokens, experts, num_experts, slots, ranking)  # [E, C, D]
    buffer = buffer.reshape(peers, num_local, slots, d)
    buffer = jax.lax.all_to_all(buffer, EXPERT_AXIS, 0, 0, tiled=True)  # [peers, local E, C, D]
    out = experts_ffn(buffer, weights, method)
    out = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0, tiled=True).reshape(num_experts, slots, d)
    return combine(out, placed, gates), overflow


# ----------------------------------------------------------------------------------------------
# Dropless in a token-sorted layout: buffers of the routed pairs (N x K), not of E x N slots
# ----------------------------------------------------------------------------------------------


class Sorted(NamedTuple):
    """A permutation of the (token, k) pairs and its inverse: `order[i]` is the pair at sorted
    position i, `position[p]` the sorted position of pair p. With both, sorting rows and putting
    them back are gathers in both passes (no scatter of [A N K, D] rows)."""

    order: jax.Array
    position: jax.Array


def sort_pairs(experts, first_expert, num_local, ranking="sort"):
    """The (token, k) pairs ordered by local expert, and how many pairs each local expert has.

    experts: [N, K] global ids (-1: empty). Pairs of experts outside [first_expert, first_expert +
    num_local) and empty ones sort after every local group. The order is stable (token order
    inside each expert, as the capacity path's queues): a pair's sorted position is its expert's
    start plus its rank among that expert's earlier pairs (`stable_ranks`). Returns the `Sorted`
    permutation of the N K flat pair indices and group sizes [num_local] int32.
    """
    local = experts.reshape(-1) - first_expert
    key = jnp.where((local >= 0) & (local < num_local), local, num_local)
    rank, counts = stable_ranks(key, num_local + 1, ranking)
    position = (jnp.cumsum(counts) - counts)[key] + rank
    order = jnp.zeros_like(position).at[position].set(jnp.arange(key.shape[0], dtype=jnp.int32))
    order, position, sizes = _saved(order, position, counts[:num_local])
    return Sorted(order, position), sizes


def gmm_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """Tiles (rows, depth, width) for the TPU grouped matmul, rows the largest power of two up to
    the tile's that divides m. Chosen on a v5e chip at the one-chip preset's shapes
    (benchmarks/chip/gmm_tiling_on_chip.py, forward and backward): 512 x 1024 x 1024 for gate, up
    and down of 2048 x 1024 apiece; for gate and up joined (2048 deep and wide) 256 x 2048 x 512,
    a row tile that reads the whole depth once, where 512 x 1024 x 1024 came 7% slower."""
    tile_m, tile_k, tile_n = (256, 2048, 512) if min(k, n) >= 2048 else (512, 1024, 1024)
    while m % tile_m:
        tile_m //= 2
    # the backward pass's kernels run the depth tile along the width and the width tile along the
    # depth, so a tile cut to a dimension must still be whole lanes (a multiple of 128) for both
    return tile_m, min(_lanes(k), tile_k), min(_lanes(n), tile_n)


def _lanes(size: int) -> int:
    """`size` rounded up to whole 128-lane vector registers."""
    return -(-size // 128) * 128


def grouped_matmul(rows, weights, group_sizes, method, interpret=False):
    """rows [P, D] (sorted by group) x weights [G, D, F] -> [P, F]; rows past the groups are
    left undefined (the kernel does not write them): callers mask what they read.

    `ragged_dot` is XLA's grouped matmul; `gmm` is the Pallas TPU kernel that ships with JAX
    (`interpret` runs it in Pallas's interpreter, to check it off a TPU). Both carry their own
    gradient rule, which `_sorted_experts_backward` pulls back through.
    """
    if method == "gmm":
        # Pallas' TPU kernels: a third of a second more to import, for method=gmm alone
        from jax.experimental.pallas.ops.tpu.megablox import gmm

        tiling = gmm_tiling(rows.shape[0], rows.shape[1], weights.shape[2])
        return gmm(rows, weights, group_sizes, rows.dtype, tiling, interpret=interpret)
    return jax.lax.ragged_dot(rows, weights, group_sizes)


def _live(rows, sizes):
    """[R, 1] bool: sorted row rows[r] belongs to one of this device's experts (the live rows are
    the first sum(sizes)). A compare of the positions themselves, never a mask gathered by them:
    on a TPU, XLA made the mask a [P, 1] array padded to 128 lanes and gathered it element by
    element for the rows read slot by slot, where a compare fuses into the pass that reads it."""
    return (rows < jnp.sum(sizes))[:, None]


def _sorted_rows(placed: Sorted):
    """The sorted rows' positions in sorted order, [P]."""
    return jnp.arange(placed.order.shape[0], dtype=placed.position.dtype)


def _slot_major(position, k):
    """The sorted positions of the (token, slot) pairs listed slot by slot, [K N]: the pairs' rows
    gathered in this order reshape to [K, N, D] for free, where token by token [N, K, D] puts K in
    the tiled minor dims of a TPU layout and costs a padded copy of every row."""
    return position.reshape(-1, k).T.reshape(-1)


def _expert_pass(tokens, gates, weights, placed: Sorted, sizes, method, interpret):
    """This device's experts on every pair of the gathered tokens, summed per token by gate, and
    the gate and up matmuls' outputs (undefined past the live rows), [A N K, F] each."""
    k = gates.shape[-1]
    live = _live(_sorted_rows(placed), sizes)
    rows = tokens[placed.order // k]  # [A N K, D]: every pair's token row, sorted by expert

    def matmul(lhs, w):
        return grouped_matmul(lhs, w, sizes, method, interpret)

    a, b = gate_and_up(matmul, rows, weights.gate_up)
    hidden = jnp.where(live, jax.nn.silu(a) * b, 0)
    out = matmul(hidden, weights.down)  # undefined past the live rows: masked as it is gathered
    # back in token order; the mask rides on the gather rather than a pass over all of `out`
    by_slot = _slot_major(placed.position, k)
    pairs = jnp.where(_live(by_slot, sizes), out[by_slot], 0).reshape(k, -1, out.shape[-1])
    summed = jnp.einsum(
        "knd,nk->nd", pairs, gates.astype(out.dtype), preferred_element_type=jnp.float32
    )
    return summed, a, b


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _sorted_experts(tokens, gates, weights, placed: Sorted, sizes, method, interpret, keep):
    """This device's experts on every pair of the gathered tokens, summed per token by gate.

    tokens [A N, D]; gates [A N, K]; weights: `ExpertWeights` of the local experts, whole;
    keep: the gate and up outputs are kept for the backward pass (named `GATE_UP` for the remat
    policy), not formed again there. Returns [A N, D] float32: sum over a token's pairs routed
    here of gate x SwiGLU(token).
    """
    return _expert_pass(tokens, gates, weights, placed, sizes, method, interpret)[0]


def _sorted_experts_forward(tokens, gates, weights, placed, sizes, method, interpret, keep):
    out, a, b = _expert_pass(tokens, gates, weights, placed, sizes, method, interpret)
    kept = tuple(checkpoint_name(v, GATE_UP) for v in (a, b)) if keep else None
    return out, (tokens, gates, weights, placed, sizes, kept)


def _sorted_experts_backward(method, interpret, keep, saved, grad):
    """The gradient by hand, so one layer's backward holds few [A N K, D] pair buffers.

    Autodiff keeps about twice as many alive at once (sorted rows, each matmul's output and input
    gradient, masks, the unsorted output); the production cell's replay fits only without them
    (benchmarks/reports/aot-397b-memory_tpu7x-v5p_2026-12-03.md). Live here: the recomputed rows and
    their transpose for the weight gradients, each pair's output gradient `g` (its token's gradient,
    ungated), and the rows' gradient from the two matmuls, summed in place. With
    h = silu(x Wg) * (x Wu), the pair output o = h Wd and its token's gradient g:
    d Wd = (gate h)^T g; u = g Wd^T gives d h = gate u and d gate = <o, g> = <h, u>, so neither o
    nor gate x g is ever formed.
    """
    tokens, gates, weights, placed, sizes, kept = saved
    k, d = gates.shape[-1], tokens.shape[-1]
    live = _live(_sorted_rows(placed), sizes)
    token_of = placed.order // k
    gate = gates.reshape(-1)[placed.order][:, None].astype(jnp.float32)  # [A N K, 1]

    def matmul(lhs, w):
        return grouped_matmul(lhs, w, sizes, method, interpret)

    rows = tokens[token_of]
    a, b, pull_gate_up = gate_and_up_vjp(matmul, rows, weights.gate_up)
    if keep:  # the forward's: XLA drops the matmuls above, whose outputs nothing reads
        a, b = kept
    a, b = (jnp.where(live, v, 0).astype(jnp.float32) for v in (a, b))
    sig = jax.nn.sigmoid(a)
    h = a * sig * b
    _, pull_down = jax.vjp(matmul, (gate * h).astype(rows.dtype), weights.down)
    u, d_down = pull_down(grad[token_of].astype(rows.dtype))
    u = jnp.where(live, u, 0).astype(jnp.float32)
    d_gate = jnp.sum(h * u, axis=-1)  # [A N K], zero past the live rows
    dh = gate * u
    d_rows, d_gate_up = pull_gate_up(
        (dh * b * sig * (1 + a * (1 - sig))).astype(rows.dtype), (dh * a * sig).astype(rows.dtype)
    )  # d_rows undefined past the live rows: masked as it is read
    by_slot = _slot_major(placed.position, k)
    d_pairs = jnp.where(_live(by_slot, sizes), d_rows[by_slot], 0).reshape(k, -1, d)
    d_tokens = d_pairs.sum(axis=0, dtype=jnp.float32).astype(tokens.dtype)
    d_gates = d_gate[placed.position].reshape(gates.shape).astype(gates.dtype)
    return d_tokens, d_gates, ExpertWeights(d_gate_up, d_down), None, None


_sorted_experts.defvjp(_sorted_experts_forward, _sorted_experts_backward)


def local_sorted_ffn(
    tokens,
    experts,
    gates,
    weights,
    *,
    method,
    factor=DROPLESS,
    ranking="sort",
    interpret=False,
    keep_gate_up=False,
):
    """One group of a device's tokens through the token-sorted layer (see `expert_parallel`).

    Each device gathers the group's tokens from its expert-axis peers (A x N tokens, A the expert
    axis size), sorts their A x N x K pairs by its own experts, runs a grouped matmul, and sums the
    results back to the tokens' devices with one reduce-scatter over the expert axis. Its buffers
    are A x N x K rows, where the capacity layout at capacity N needs E x N slots.
    tokens [N, D], experts and gates [N, K]; weights: this device's experts, whole.

    A `factor` other than DROPLESS applies the capacity layout's rule before the gather: in this
    group, a pair past its expert's C slots (`expert_capacity`, slots taken in token order) drops
    and raises the overflow flag, exactly as `local_capacity_ffn` drops it; the kept pairs run.
    """
    overflow = jnp.zeros((), bool)
    if factor != DROPLESS:
        num_experts = weights.down.shape[0] * jax.lax.axis_size(EXPERT_AXIS)
        slots = expert_capacity(tokens.shape[0], experts.shape[-1], num_experts, factor)
        routed = experts >= 0
        kept = routed & (slot_positions(experts, num_experts, ranking) < slots)
        overflow = jnp.any(routed & ~kept)
        experts = jnp.where(kept, experts, -1)
    tokens = jax.lax.all_gather(tokens, EXPERT_AXIS, axis=0, tiled=True)
    experts = jax.lax.all_gather(experts, EXPERT_AXIS, axis=0, tiled=True)
    gates = jax.lax.all_gather(gates, EXPERT_AXIS, axis=0, tiled=True)
    num_local = weights.down.shape[0]
    first = jax.lax.axis_index(EXPERT_AXIS) * num_local
    placed, sizes = sort_pairs(experts, first, num_local, ranking)
    partial = _sorted_experts(
        tokens, gates, weights, placed, sizes, method, interpret, keep_gate_up
    )
    mine = jax.lax.psum_scatter(partial, EXPERT_AXIS, scatter_dimension=0, tiled=True)
    return mine.astype(tokens.dtype), overflow
