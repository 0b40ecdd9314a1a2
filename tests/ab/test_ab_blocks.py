"""The default A/B order, balanced blocks scored block by block, on synthetic step times: the blocks
and their order, the interval, and what a load heavier at the ends of the run does to it and to the
mirrored order it replaces."""

import numpy as np
import pytest
from ab_synthetic import loaded_arms, u_shaped_load

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import score as ab_score

BASE_S = 0.150  # a cpu-tiny step on the development machine
CLAIMS = (ab_score.FASTER, ab_score.SLOWER)
DEFAULT_ORDER = run_orders.run_order(["off", "on"], run_orders.BLOCKS)


def test_blocks_are_there_and_back_turned_around_in_the_thue_morse_pattern():
    assert "".join(run_orders.run_order(["A", "B"], run_orders.BLOCKS, 4)) == "ABBABAABBAABABBA"
    assert "".join(run_orders.run_order(["A", "B", "C"], run_orders.BLOCKS, 2)) == "ABCCBACBAABC"
    assert len(DEFAULT_ORDER) == 4 * run_orders.DEFAULT_BLOCKS


@pytest.mark.parametrize(
    ("order", "blocks"),
    [
        (DEFAULT_ORDER, [range(i, i + 4) for i in range(0, 24, 4)]),
        ("ABBA", None),  # the mirrored order is one block: no interval over blocks
        ("ABAB", None),  # the block order is never balanced
        ("ABBAABBA", None),  # two blocks: fewer than MIN_BLOCKS
        ("ABBAABBAABBA", [range(0, 4), range(4, 8), range(8, 12)]),  # written out
        ("ABCCBAABCCBACBAABC", [range(0, 6), range(6, 12), range(12, 18)]),
        ("ABBAABBAABB", None),  # the last block unfinished
    ],
)
def test_blocks_of_finds_the_shortest_balanced_blocks(order, blocks):
    assert run_orders.blocks_of(list(order)) == blocks


def test_the_interval_over_blocks_is_students_t():
    # mean 3, standard error sqrt(2.5 / 5), t(0.975, 4 degrees of freedom) = 2.7764
    mean, low, high = ab_score.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (mean, low, high) == pytest.approx((3.0, 1.03676, 4.96324), abs=1e-4)


def test_a_load_heavy_at_the_ends_fools_the_mirrored_order_and_cancels_in_blocks():
    """Steps 0.3 s slower at both ends of the run, none in its middle, no effect at all: the
    mirrored order puts both baseline arms at the loaded ends and calls the change FASTER; the
    blocks cancel a load quadratic in the arm's place exactly in each pair of blocks (ABBA BAAB)."""
    mirrored = loaded_arms(list("ABBA"), base_s=BASE_S, load_s=u_shaped_load(4, 0.3), steps=3)
    (delta,) = ab_score.score(mirrored, min_effect_pct=2.0).deltas
    assert delta.verdict == ab_score.FASTER
    blocked = loaded_arms(DEFAULT_ORDER, base_s=BASE_S, load_s=u_shaped_load(24, 0.3), steps=3)
    result = ab_score.score(blocked, min_effect_pct=2.0)
    (delta,) = result.deltas
    assert result.design == ab_score.BLOCKED and len(result.blocks) == 6
    assert abs(delta.delta_s) < 1e-9
    assert delta.verdict not in CLAIMS  # each block alone keeps some curvature: it widens the CI


def _shared_host(seed: int, effect_s: float = 0.0) -> dict[str, float]:
    """One seeded draw of a shared host: a load heavy at the ends (smooth, or a burst over the
    first and last arms), an offset per arm (other work coming and going) and heavy-tailed jitter
    per step. Returns the arguments of `loaded_arms` for DEFAULT_ORDER (and for mirrored)."""
    rng = np.random.default_rng(seed)
    peak, burst, ends = rng.uniform(0, 0.15), rng.uniform(0, 0.1), int(rng.integers(1, 7))

    def load(arms: int) -> list[float]:
        smooth = u_shaped_load(arms, peak)
        edge = max(1, ends * arms // 24)
        return [
            s + (burst if i < edge or i >= arms - edge else 0.0) + rng.normal(0, 0.006)
            for i, s in enumerate(smooth)
        ]

    def jitter(_arm: int, steps: int) -> np.ndarray:
        return 0.004 * rng.standard_t(3, steps)

    return {"load": load, "jitter": jitter, "effect_s": {"B": effect_s, "on": effect_s}}


def _verdict(order: str | list[str], host: dict, steps: int) -> str:
    runs = loaded_arms(
        list(order),
        base_s=BASE_S,
        load_s=host["load"](len(order)),
        steps=steps,
        effect_s=host["effect_s"],
        jitter=host["jitter"],
    )
    (delta,) = ab_score.score(runs, min_effect_pct=2.0).deltas
    return delta.verdict


def test_on_a_loaded_host_nothing_changed_is_rarely_called_an_effect():
    """40 seeded hosts, no effect: the blocks claim one in at most 2 (the 1 in 20 the design
    promises); the mirrored order with 8 steps per arm (as many steps) claims one in most."""
    blocked = [_verdict(DEFAULT_ORDER, _shared_host(seed), 3) for seed in range(40)]
    mirrored = [_verdict("ABBA", _shared_host(seed), 8) for seed in range(40)]
    assert sum(v in CLAIMS for v in blocked) <= 2
    assert sum(v in CLAIMS for v in mirrored) >= 20


def test_on_a_loaded_host_a_known_slowdown_is_found():
    """The same hosts, `on` 15 ms (10% of the unloaded step) slower: SLOWER in at least 14 of 20
    (15 today). These hosts are harsh (loads up to 1.7 times the step at the ends, an arm's
    median moved by 6 ms of other work): a verdict that only says NOISY fails here."""
    found = [_verdict(DEFAULT_ORDER, _shared_host(seed, 0.015), 3) for seed in range(20)]
    assert sum(v == ab_score.SLOWER for v in found) >= 14
