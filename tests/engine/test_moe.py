"""MoE routing, buffers, expert compute and the dropless layouts, on small arrays (no engine)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_delta_rule_kernel import mosaic_calls_compiled_for_a_v5e

from rl_trainer_bench.engine.builtin import moe
from rl_trainer_bench.engine.builtin.sharding import make_mesh
from rl_trainer_bench.engine.config import MeshConfig, expert_capacity


def test_slots_are_taken_in_token_order_and_pairs_past_capacity_drop():
    experts = jnp.array([[0, 1], [0, 2], [0, 1], [3, -1]])  # expert 0 wanted by tokens 0, 1, 2
    x = jnp.arange(4.0)[:, None] * jnp.ones((4, 3))
    buffer, placed, overflow = moe.dispatch(x, experts, num_experts=4, slots=2)
    assert bool(overflow)
    np.testing.assert_array_equal(buffer[0, :, 0], [0.0, 1.0])  # tokens 0 and 1 got expert 0
    assert int(placed.of_pair[2, 0]) == 4 * 2  # token 2's pair to expert 0 dropped (spare slot)
    assert int(placed.of_pair[3, 1]) == 4 * 2  # the empty slot takes no buffer slot
    np.testing.assert_array_equal(buffer[1, :, 0], [0.0, 2.0])  # expert 1: tokens 0 and 2
    # Both ways round: slot 0 of expert 1 holds pair (0, 1), an unused slot holds no pair.
    assert int(placed.pair[1 * 2 + 0]) == 0 * 2 + 1 and int(placed.pair[3 * 2 + 1]) == 4 * 2


def test_dropless_capacity_never_overflows():
    experts = jnp.tile(jnp.array([[0, 1]]), (16, 1))  # every token to the same two experts
    slots = expert_capacity(16, top_k=2, num_experts=8, factor=-1)
    _, _, overflow = moe.dispatch(jnp.ones((16, 4)), experts, num_experts=8, slots=slots)
    assert slots == 16 and not bool(overflow)


def test_replay_uses_exactly_the_given_experts_and_empty_slots_weigh_nothing():
    x = jax.random.normal(jax.random.key(0), (5, 8))
    router = jax.random.normal(jax.random.key(1), (8, 6))
    replayed = jnp.array([[5, 2], [0, -1], [3, 4], [1, 0], [2, 5]])
    valid = jnp.array([True, True, True, True, False])
    experts, gates = moe.route(x, router, 2, valid, replayed)
    np.testing.assert_array_equal(experts[:4], replayed[:4])
    np.testing.assert_array_equal(experts[4], [-1, -1])  # padding routes nowhere
    probs = jax.nn.softmax(x @ router)
    np.testing.assert_allclose(gates[1], [1.0, 0.0], rtol=1e-6)
    expected = probs[0, jnp.array([5, 2])] / probs[0, jnp.array([5, 2])].sum()
    np.testing.assert_allclose(gates[0], expected, rtol=1e-5)


@pytest.mark.parametrize("prefuse", [False, True])
def test_einsum_and_ragged_dot_agree_on_the_same_buffers(prefuse):
    """Both buffer layouts, gate and up as two matmuls or joined, against numpy's SwiGLU."""
    buffer = jax.random.normal(jax.random.key(0), (2, 3, 4, 5, 8))  # [Gr, Gc, E, C, D]
    gate, up, down = (
        jax.random.normal(jax.random.key(i), shape)
        for i, shape in ((1, (4, 8, 6)), (2, (4, 8, 6)), (3, (4, 6, 8)))
    )
    weights = moe.expert_weights(
        {"expert_gate": gate, "expert_up": up, "expert_down": down}, prefuse
    )
    assert [w.shape for w in weights.gate_up] == ([(4, 8, 12)] if prefuse else [(4, 8, 6)] * 2)
    b, g, u, d = (np.asarray(a, np.float64) for a in (buffer, gate, up, down))
    hidden = np.einsum("...ecd,edf->...ecf", b, g)
    hidden = hidden / (1 + np.exp(-hidden)) * np.einsum("...ecd,edf->...ecf", b, u)
    want = np.einsum("...ecf,efd->...ecd", hidden, d)
    for method in ("einsum", "ragged_dot"):
        got = moe.experts_ffn(buffer, weights, method)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# The token-sorted dropless layout, on the 2x2x2 mesh of 8 host devices
# ----------------------------------------------------------------------------------------------

B, T, D, E, K, F = 4, 16, 128, 8, 2, 128  # 128-wide so the TPU kernel's tiles fit in interpret mode


def _layer(seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(keys[0], (B, T, D))
    shapes = ((E, D, F), (E, D, F), (E, F, D))
    weights = tuple(
        jax.random.normal(k, s) / np.sqrt(s[1]) for k, s in zip(keys[2:], shapes, strict=True)
    )
    params = {
        "router": jax.random.normal(keys[1], (D, E)),
        **dict(zip(moe.EXPERT_WEIGHTS, weights, strict=True)),
    }
    return x, params


def _moe(x, params, capacity_factor, methods, chunks=1, prefuse=False):
    """The layer on every token of x, under the ambient mesh."""
    valid = jnp.ones(x.shape[:2], bool)
    return moe.moe_ffn(
        x,
        params,
        valid,
        None,
        top_k=K,
        capacity_factor=capacity_factor,
        token_chunks=chunks,
        methods=methods,
        prefuse=prefuse,
    )


def _float64_reference(x, params):
    """Every routed pair kept, in numpy float64: sum_k gate_k x SwiGLU_k(x)."""
    x64 = np.asarray(x, np.float64).reshape(-1, D)
    probs = np.asarray(jax.nn.softmax(jnp.asarray(x64 @ np.asarray(params["router"], np.float64))))
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
    gates = np.take_along_axis(probs, chosen, -1)
    gates /= gates.sum(-1, keepdims=True)
    gate_w, up_w, down_w = (np.asarray(params[n], np.float64) for n in moe.EXPERT_WEIGHTS)
    out = np.zeros_like(x64)
    for n in range(x64.shape[0]):
        for k in range(K):
            e = chosen[n, k]
            h = x64[n] @ gate_w[e]
            out[n] += gates[n, k] * ((h / (1 + np.exp(-h))) * (x64[n] @ up_w[e])) @ down_w[e]
    return out.reshape(x.shape)


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(fsdp=2, context=2, expert=2))


@pytest.mark.parametrize(
    ("grouped_matmul", "keep_gate_up"),
    [("ragged_dot", False), ("ragged_dot", True), ("gmm", False)],
)
def test_sorted_dropless_equals_the_capacity_layout_in_value_and_gradient(
    mesh, grouped_matmul, keep_gate_up
):
    """The sorted path's hand-written gradient (both grouped matmuls; gate and up formed again in
    the backward pass, or kept from the forward) against autodiff of the capacity layout, for the
    tokens, the router and every expert weight."""
    x, params = _layer()
    valid = jnp.ones((B, T), bool)
    local = functools.partial(
        moe.local_sorted_ffn,
        method=grouped_matmul,
        ranking="count",
        interpret=True,
        keep_gate_up=keep_gate_up,
    )

    def capacity(x, params):
        return _moe(x, params, -1, ("einsum", "capacity", "sort"))

    def sorted_pairs(x, params):
        experts, gates = moe.route(x, params["router"], K, valid)
        weights = moe.expert_weights(params, prefuse=False)
        return moe.expert_parallel(local, x, experts, gates, weights, token_chunks=1)

    def loss(layer):
        def of(x, params):
            out, overflow = layer(x, params)
            return jnp.sum(jnp.sin(out)), overflow

        return jax.jit(jax.value_and_grad(of, argnums=(0, 1), has_aux=True))

    with jax.set_mesh(mesh):
        (want, want_overflow), want_grads = loss(capacity)(x, params)
        (got, got_overflow), got_grads = loss(sorted_pairs)(x, params)
    assert not bool(want_overflow) and not bool(got_overflow)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for got_leaf, want_leaf in zip(
        jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True
    ):
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grouped_matmul", ["ragged_dot", "gmm"])
def test_sorted_dropless_replay_of_a_dropping_batch_equals_the_float64_reference(
    mesh, grouped_matmul
):
    x, params = _layer(seed=1)
    with jax.set_mesh(mesh):
        _, overflow = jax.jit(lambda x, p: _moe(x, p, 0.5, ("einsum", "capacity", "sort")))(
            x, params
        )
        experts, gates = moe.route(x, params["router"], K, jnp.ones((B, T), bool))
        weights = moe.expert_weights(params, prefuse=False)
        local = functools.partial(
            moe.local_sorted_ffn, method=grouped_matmul, ranking="count", interpret=True
        )
        replay, _ = jax.jit(
            lambda x, e, g, w: moe.expert_parallel(local, x, e, g, w, token_chunks=1)
        )(x, experts, gates, weights)
    assert bool(overflow)  # the capacity layout at factor 0.5 drops pairs of this batch
    want = _float64_reference(x, params)
    np.testing.assert_allclose(np.asarray(replay, np.float64), want, rtol=2e-5, atol=2e-5)


def test_pairs_sort_by_local_expert_in_token_order_and_the_rest_go_last():
    experts = jnp.array([[3, 0], [2, 3], [-1, 2], [0, 1]])  # this device holds experts 2 and 3
    placed, sizes = moe.sort_pairs(experts, first_expert=2, num_local=2)
    np.testing.assert_array_equal(sizes, [2, 2])
    np.testing.assert_array_equal(placed.order[:4], [2, 5, 0, 3])  # expert 2: 2, 5; expert 3: 0, 3
    np.testing.assert_array_equal(placed.order[placed.position], np.arange(8))  # the inverse


def _stable_ranks_reference(keys, num_keys):
    """Rank among earlier equal keys and counts, by a plain loop."""
    seen = [0] * num_keys
    ranks = []
    for key in keys.tolist():
        ranks.append(seen[key])
        seen[key] += 1
    return np.array(ranks), np.array(seen)


@pytest.mark.parametrize("ranking", ["sort", "count"])
@pytest.mark.parametrize(
    ("size", "num_keys", "crowded"), [(1000, 17, False), (300, 5, True), (128, 3, False)]
)
def test_ranks_by_sort_and_by_counting_equal_a_loops(ranking, size, num_keys, crowded):
    """Counting spans blocks of 128 (300 pairs of one key cross two block boundaries) and a
    size that is not a whole number of blocks; both rankings equal the loop exactly."""
    keys = np.random.default_rng(size).integers(0, num_keys, size)
    if crowded:
        keys[:290] = 1
    rank, counts = jax.jit(moe.stable_ranks, static_argnums=(1, 2))(
        jnp.asarray(keys, jnp.int32), num_keys, ranking
    )
    want_rank, want_counts = _stable_ranks_reference(keys, num_keys)
    np.testing.assert_array_equal(rank, want_rank)
    np.testing.assert_array_equal(counts, want_counts)


def test_counted_pairs_sort_and_queue_as_the_sorted_ones():
    """The two rankings give the same permutation, group sizes and queue positions, so every
    layer output and gradient built on them is the same (bit for bit)."""
    experts = jnp.asarray(np.random.default_rng(0).integers(-1, 16, (700, 4)), jnp.int32)
    got, want = (moe.sort_pairs(experts, 4, 8, ranking) for ranking in ("count", "sort"))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(
        moe.slot_positions(experts, 16, "count"), moe.slot_positions(experts, 16, "sort")
    )


def test_auto_counts_pairs_below_128_experts_and_sorts_from_there():
    assert moe.pair_ranking_for("auto", 16) == "count"
    assert moe.pair_ranking_for("auto", 512) == "sort"
    assert moe.pair_ranking_for("sort", 16) == "sort"


def test_auto_picks_the_tpu_kernel_on_a_tpu_only():
    assert moe.dropless_compute_for("auto", "tpu") == "gmm"
    assert moe.dropless_compute_for("auto", "cpu") == "ragged_dot"


def test_capacity_is_at_least_one_slot_and_the_payload_predicts_with_the_same_formula():
    from rl_trainer_bench.payload import expert_load

    assert expert_capacity(4, top_k=2, num_experts=8, factor=1.0) == 1
    assert expert_capacity(0, top_k=1, num_experts=8, factor=1.0) == 1  # ceil(0) = 0: at least one
    assert expert_capacity(16, top_k=2, num_experts=8, factor=-1) == 16  # dropless
    prediction = expert_load.predict_overflow(
        np.full(8, 1 / 8), tokens=0, real_fraction=1.0, top_k=1, factor=1.0
    )
    assert prediction.capacity == 1


@pytest.mark.parametrize(
    ("tokens", "top_k", "num_experts", "factor", "slots"),
    [
        (100, 2, 8, 1.25, 32),  # 31.25 slots' worth of pairs: the last quarter needs a slot
        (10, 3, 4, 1.0, 8),  # 7.5
        (7, 1, 8, 2.0, 2),  # 1.75
        (4096, 10, 512, 1.5, 120),  # 120.0 exactly: no extra slot
    ],
)
def test_capacity_rounds_a_fractional_slot_count_up(tokens, top_k, num_experts, factor, slots):
    assert expert_capacity(tokens, top_k=top_k, num_experts=num_experts, factor=factor) == slots


def _dense_reference(x, params, keep):
    """sum_k keep x gate_k x SwiGLU_k(x), every expert computed densely on one device (no mesh).

    keep [B, T, K] says which routed pairs count (all of them for a dropless layer).
    """
    experts, gates = moe.route(x, params["router"], K, jnp.ones(x.shape[:2], bool))
    gate_w, up_w, down_w = (params[n] for n in moe.EXPERT_WEIGHTS)
    hidden = jax.nn.silu(jnp.einsum("btd,edf->btef", x, gate_w))
    hidden = hidden * jnp.einsum("btd,edf->btef", x, up_w)
    every = jnp.einsum("btef,efd->bted", hidden, down_w)  # [B, T, E, D]
    chosen = jnp.take_along_axis(every, experts[..., None], axis=2)  # [B, T, K, D]
    return jnp.einsum("btkd,btk->btd", chosen, gates * keep)


@jax.jit
def _dense_value_and_grad(x, params, keep):
    """The dense reference's sum(sin(out)) and its gradient, and out: `keep` an argument, so the
    reference compiles once for every test that compares against it."""

    def dense(x, params):
        out = _dense_reference(x, params, keep)
        return jnp.sum(jnp.sin(out)), out

    return jax.value_and_grad(dense, argnums=(0, 1), has_aux=True)(x, params)


def _kept_pairs(x, params, factor, chunks):
    """Which pairs the capacity rule keeps (1.0) on the 2x2x2 mesh: a device holds one row of 8
    tokens, split into `chunks` groups; each group's slots go in token order, then k order."""
    experts = np.asarray(moe.route(x, params["router"], K, jnp.ones(x.shape[:2], bool))[0])
    keep = np.zeros(experts.shape, np.float32)
    for row in range(B):
        for start in (0, T // 2):
            block = experts[row, start : start + T // 2]  # one device's tokens [8, K]
            for group in np.arange(len(block)).reshape(chunks, -1):
                slots, used = expert_capacity(len(group), K, E, factor), np.zeros(E, int)
                for n in group:
                    for k in range(K):
                        keep[row, start + n, k] = used[block[n, k]] < slots
                        used[block[n, k]] += 1
    return jnp.asarray(keep)


def _against_dense(mesh, factor, chunks, layer):
    """`layer(x, params)` -> (out, overflow) on the 2x2x2 mesh against every expert computed
    densely on one device with the capacity rule's drops (`_kept_pairs`), value and gradient."""
    x, params = _layer(seed=2)
    keep = _kept_pairs(x, params, factor, chunks)

    def sharded(x, params):
        out, overflow = layer(x, params)
        return jnp.sum(jnp.sin(out)), (out, overflow)

    with jax.set_mesh(mesh):
        (_, (got, overflow)), got_grads = jax.jit(
            jax.value_and_grad(sharded, argnums=(0, 1), has_aux=True)
        )(x, params)
    (_, want), want_grads = _dense_value_and_grad(x, params, keep)
    assert bool(overflow) == (factor != -1) == bool(jnp.any(keep == 0))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got_grads[0], want_grads[0], rtol=1e-4, atol=1e-5, err_msg="x")
    for name, want_leaf in want_grads[1].items():
        np.testing.assert_allclose(
            got_grads[1][name], want_leaf, rtol=1e-4, atol=1e-5, err_msg=name
        )


# Half of the 16 combinations of dropless or dropping, one or two token chunks, the two expert
# computes and the two rankings: the ranking is the parity of the other three, so every pair of
# settings of any two of the four runs (a half fraction of resolution IV). The rankings give the
# same slots bit for bit (test_counted_pairs_sort_and_queue_as_the_sorted_ones).
@pytest.mark.parametrize(
    ("factor", "chunks", "expert_compute", "ranking"),
    [
        (-1, 1, "einsum", "sort"),
        (-1, 1, "sorted_ragged_dot", "count"),
        (-1, 2, "einsum", "count"),
        (-1, 2, "sorted_ragged_dot", "sort"),
        (0.75, 1, "einsum", "count"),
        (0.75, 1, "sorted_ragged_dot", "sort"),
        (0.75, 2, "einsum", "sort"),
        (0.75, 2, "sorted_ragged_dot", "count"),
    ],
)
def test_expert_parallel_capacity_layer_equals_a_dense_reference_in_value_and_gradient(
    mesh, factor, chunks, expert_compute, ranking
):
    """The shard_map layer (experts gathered over their model dim, buffers moved by all-to-all or
    tokens gathered and sorted, token chunks) against every expert computed densely on one
    device, drops included: the token-sorted capacity program drops what the buffers drop."""

    def sharded(x, params):
        return _moe(x, params, factor, (expert_compute, "capacity", ranking), chunks)

    _against_dense(mesh, factor, chunks, sharded)


@pytest.mark.parametrize(
    ("factor", "chunks", "methods"),
    [
        (-1, 2, ("einsum", "ragged_dot", "count")),
        (0.75, 1, ("einsum", "capacity", "sort")),
        (0.75, 2, ("sorted_ragged_dot", "capacity", "count")),
        (-1, 1, "gmm"),  # the TPU kernel in Pallas's interpreter, at the joined width
    ],
)
def test_gate_and_up_joined_equal_the_dense_reference(mesh, factor, chunks, methods):
    """prefuse_moe_weights: gate and up as one matmul of twice the width, on the sharded mesh,
    against the dense reference of two, value and gradient: each half of the joined weight's
    gradient lands on its own parameter."""

    def joined(x, params):
        if methods != "gmm":
            return _moe(x, params, factor, methods, chunks, prefuse=True)
        experts, gates = moe.route(x, params["router"], K, jnp.ones(x.shape[:2], bool))
        local = functools.partial(moe.local_sorted_ffn, method="gmm", interpret=True)
        weights = moe.expert_weights(params, prefuse=True)
        return moe.expert_parallel(local, x, experts, gates, weights, token_chunks=chunks)

    _against_dense(mesh, factor, chunks, joined)


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside its equations."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a closed jaxpr's own
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def test_the_sorted_layers_live_rows_are_compared_never_gathered(mesh):
    """The live-row masks of the sorted layer, forward and backward, come from comparing row
    positions with the live count: no gather reads a boolean array (a TPU gathered such a mask
    element by element, from a copy padded to 128 lanes), while the rows themselves are gathered."""
    x, params = _layer()
    local = functools.partial(moe.local_sorted_ffn, method="gmm", interpret=True)

    def loss(x, params):
        experts, gates = moe.route(x, params["router"], K, jnp.ones((B, T), bool))
        weights = moe.expert_weights(params, prefuse=False)
        out, _ = moe.expert_parallel(local, x, experts, gates, weights, token_chunks=2)
        return jnp.sum(out)

    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, params)
    gathered = [
        eqn.invars[0].aval.dtype
        for eqn in _equations(jaxpr.jaxpr)
        if eqn.primitive.name == "gather"
    ]
    assert jnp.bfloat16 in gathered or jnp.float32 in gathered
    assert jnp.bool_ not in gathered


def test_grouped_matmul_tiles_follow_the_chips_choice():
    """The tiles gmm_tiling_on_chip.py chose on a v5e chip at the one-chip preset's shapes; rows
    shrink to a power of two that divides them."""
    assert moe.gmm_tiling(32768, 2048, 1024) == (512, 1024, 1024)  # gate, up
    assert moe.gmm_tiling(32768, 1024, 2048) == (512, 1024, 1024)  # down
    assert moe.gmm_tiling(32768, 2048, 2048) == (256, 2048, 512)  # gate and up joined
    assert moe.gmm_tiling(32768, 4096, 2048) == (256, 2048, 512)
    assert moe.gmm_tiling(384, 2048, 2048) == (128, 2048, 512)
    assert moe.gmm_tiling(96, 128, 256) == (32, 128, 256)


def test_a_dimension_narrower_than_a_lane_row_gets_whole_lanes():
    """The backward pass's kernels run the depth tile along the width and the width tile along
    the depth, so a 64-wide tile of a 64-deep matmul lands on a 128-wide dimension: no block Mosaic
    lowers (cpu-tiny-dense's d_model 64 and experts 128 wide, aot on a v5e slice)."""
    assert moe.gmm_tiling(256, 64, 128) == (256, 128, 128)
    assert moe.gmm_tiling(256, 128, 64) == (256, 128, 128)
    assert moe.gmm_tiling(256, 192, 320) == (256, 256, 384)


def test_the_kernel_at_a_dimension_narrower_than_a_lane_row_compiles_for_a_v5e():
    """cpu-tiny-dense's expert matmuls (64 deep, 128 wide, and back) forward and backward through
    the TPU kernel, compiled for one v5e chip from this host: the first forward kernel (the
    second's value goes unread by the gradient) and two kernels each backward."""
    sizes = jnp.array([128, 128], jnp.int32)

    def matmuls_and_gradient(rows, gate, down):
        def loss(rows, gate, down):
            hidden = moe.grouped_matmul(rows, gate, sizes, "gmm")
            return jnp.sum(moe.grouped_matmul(hidden, down, sizes, "gmm").astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(rows, gate, down)

    specs = [((256, 64), jnp.bfloat16), ((2, 64, 128), jnp.bfloat16), ((2, 128, 64), jnp.bfloat16)]
    assert mosaic_calls_compiled_for_a_v5e(matmuls_and_gradient, specs) == 5


@pytest.mark.parametrize("depth, width", [(64, 128), (128, 64)])
def test_the_kernel_with_a_tile_wider_than_its_dimension_gives_ragged_dots_value_and_gradient(
    depth, width
):
    """The grouped matmul at whole-lane tiles over a 64-wide dimension (Pallas's interpreter),
    value and both gradients, against XLA's ragged_dot."""
    keys = jax.random.split(jax.random.key(3), 3)
    rows = jax.random.normal(keys[0], (256, depth), jnp.float32)
    weights = jax.random.normal(keys[1], (4, depth, width), jnp.float32)
    sizes = jnp.array([64, 32, 96, 64], jnp.int32)
    cotangent = jax.random.normal(keys[2], (256, width), jnp.float32)

    @functools.partial(jax.jit, static_argnums=0)  # compiled: Pallas's interpreter op by op is slow
    def pulled(method):
        out, pull = jax.vjp(
            lambda r, w: moe.grouped_matmul(r, w, sizes, method, interpret=True), rows, weights
        )
        return out, *pull(cotangent)

    for got, want in zip(pulled("gmm"), pulled("ragged_dot"), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("chunks", [1, 2])
def test_tpu_kernel_capacity_layer_drops_what_the_buffers_drop(mesh, chunks):
    """The capacity program through the TPU grouped-matmul kernel (Pallas's interpreter), at a
    factor that drops pairs of this batch, against the dense reference."""
    local = functools.partial(moe.local_sorted_ffn, method="gmm", factor=0.75, interpret=True)

    def sharded(x, params):
        experts, gates = moe.route(x, params["router"], K, jnp.ones(x.shape[:2], bool))
        weights = moe.expert_weights(params, prefuse=False)
        return moe.expert_parallel(local, x, experts, gates, weights, token_chunks=chunks)

    _against_dense(mesh, 0.75, chunks, sharded)
