"""Which pool entry each step trains: step s, call i takes entry (s x M + i) mod the pool's size.

Every arm must train the same micro-batches in the same order, and consecutive steps must not
share micro-batches (a step that re-trains its predecessor's inputs hits warm caches a real run
never has), so the index is pinned here against entries written out by hand.
"""

from __future__ import annotations

from stand_in_engine import StandInEngine, stand_in_pool

from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS

# Pool of 5, three micro-batches a step, one warm-up step then three scored steps.
EXPECTED_ENTRIES = [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]


def test_each_step_trains_the_next_m_pool_entries_in_turn():
    engine = StandInEngine()
    pool = stand_in_pool(5)
    config = BenchConfig(preset=PRESETS["cpu-tiny"], steps=3, micro_steps=3)
    bench = Bench(config, lambda _: None, engine_factory=lambda _: engine, pool=pool)
    bench.setup()
    try:
        records = bench.run(steps=3, stage=StageConfig()).records
    finally:
        bench.close()
    entry_of = {p.digests["input_ids"]: index for index, p in enumerate(pool)}
    trained = [entry_of[digest] for digest in engine.trained]
    assert [trained[3 * s : 3 * s + 3] for s in range(4)] == EXPECTED_ENTRIES
    assert [r.micro_batches for r in records] == [
        [f"bench_{s}_{i}" for i in range(3)] for s in range(4)
    ]
