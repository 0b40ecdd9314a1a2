"""MaxText's buffer, one per expert-parallel shard: its size from the mesh, factor and trainer
keys, and the overflow chance of a shard, against numbers worked by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rl_trainer_bench.bench import plan
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.config import DROPLESS, MeshConfig, MoeConfig
from rl_trainer_bench.payload.maxtext_buffer import (
    RAGGED_ALL_TO_ALL,
    RING,
    ShardBuffer,
    shard_buffer,
    shard_overflow,
)

CELL = preset("qwen3.5-397b-cell").engine  # mesh 32 x 4 x 2, 64 rows of 65,536 tokens, 2.75, 2
RING_KEYS = (("use_ring_of_experts", "true"), ("use_ragged_sort", "true"))


def _with_keys(*keys: tuple[str, str]):
    return dataclasses.replace(CELL, trainer_maxtext_keys=keys)


def test_the_ragged_all_to_all_buffer_ignores_token_chunks():
    # 64 rows over 32 x 2 devices: 1 row each, of 65,536 / 4 = 16,384 tokens; chunks need a ring
    buffer = shard_buffer(CELL, top_k=10)
    assert buffer == ShardBuffer(2, RAGGED_ALL_TO_ALL, 16_384, 450_560)  # int(2.75 x 16,384 x 10)
    assert buffer.pool_tokens == 32_768


def test_the_ring_chunks_and_cp_as_ep_adds_the_context_axis_to_the_shards():
    buffer = shard_buffer(_with_keys(("custom_mesh_and_rule", "cp-as-ep"), *RING_KEYS), top_k=10)
    # 4 x 2 shards; 16,384 tokens in 2 chunks of 8,192; int(2.75 x 8,192 x 10) rows each
    assert buffer == ShardBuffer(8, RING, 8_192, 225_280)
    assert buffer.pool_tokens == 65_536


@pytest.mark.parametrize(
    "engine",
    [
        _with_keys(("use_ring_of_experts", "true")),  # a ring without its ragged sort
        dataclasses.replace(CELL, moe=MoeConfig(ragged_buffer_factor=DROPLESS)),
        dataclasses.replace(CELL, mesh=MeshConfig(fsdp=64, context=4, expert=1)),
    ],
    ids=["ring-without-ragged-sort", "dropless-factor", "one-shard"],
)
def test_where_maxtext_keeps_every_pair_there_is_no_buffer(engine):
    assert shard_buffer(engine, top_k=10) is None


def _overflow(shares: list[float], rows: int, real_fraction: float = 1.0) -> float:
    buffer = ShardBuffer(2, RAGGED_ALL_TO_ALL, chunk_tokens=100, rows=rows)
    shares_per_layer = np.array([shares])
    return float(shard_overflow(shares_per_layer, buffer, real_fraction=real_fraction, top_k=1)[0])


def test_a_shards_overflow_chance_by_hand():
    # 200 tokens, top-1, two shards of half the load: Binomial(200, 0.5), mean 100, sd 7.0711.
    # 100 rows: z = 0.5 / 7.0711 = 0.0707, tail 0.47181, either shard 1 - 0.52819^2 = 0.72102
    assert _overflow([0.25] * 4, rows=100) == pytest.approx(0.72102, abs=2e-4)
    # 114 rows: z = 14.5 / 7.0711 = 2.0506, tail 0.020154, either shard 1 - 0.979846^2 = 0.03990
    assert _overflow([0.25] * 4, rows=114) == pytest.approx(0.03990, abs=2e-4)
    # half the tokens real: Binomial(100, 0.5), mean 50, sd 5; 57 rows: z = 7.5 / 5 = 1.5,
    # tail 0.066807, either shard 1 - 0.933193^2 = 0.12915
    assert _overflow([0.25] * 4, rows=57, real_fraction=0.5) == pytest.approx(0.12915, abs=2e-4)


def test_a_hot_expert_costs_nothing_when_its_shard_is_not_hot():
    # experts sit on shards in contiguous blocks: 0.45 + 0.05 is the same shard load as 0.25 x 2
    assert _overflow([0.45, 0.05, 0.25, 0.25], rows=114) == pytest.approx(0.03990, abs=2e-4)
    # a hot shard (0.7 of 200 pairs: mean 140, sd 6.48) overflows 114 rows almost surely
    assert _overflow([0.4, 0.3, 0.2, 0.1], rows=114) > 0.9999


def _moe_line(env: dict[str, str]) -> str:
    env = {"PRESET": "qwen3.5-397b-cell", **env}
    lines = plan.resolve(plan.environment_config(env), env=env, rendering=True).lines()
    return next(line for line in lines if line.startswith("plan: moe: "))


def test_the_plan_forecasts_the_buffer_of_the_engine_that_runs():
    assert "(MaxText's buffer, ragged all-to-all: 450,560 rows per expert-parallel shard of 2," in (
        _moe_line({"ENGINE": "maxtext"})
    )
    built_in = _moe_line({"ENGINE": "builtin"})
    # ceil(2.75 x 8,192 x 10 / 512) slots per expert for each of the 2 chunks of 16,384 tokens
    assert "(the built-in engine's buffer: capacity 440 slots per expert per group of 8,192" in (
        built_in
    )
    ring = _moe_line(
        {"ENGINE": "maxtext", "TRAINER_ARGV": "MAXTEXT_EXTRA_FLAGS=use_ring_of_experts=true"}
    )
    assert ring.endswith(
        "never replays (MaxText's layer keeps every routed pair here: one"
        " expert-parallel shard, or a ring of experts without use_ragged_sort=true)"
    )


def test_a_preset_value_the_built_in_engine_reads_otherwise_says_so():
    def rows(engine: str) -> list[str]:
        env = {"PRESET": "qwen3.5-397b-cell", "ENGINE": engine}
        resolved = plan.resolve(plan.environment_config(env), env=env, rendering=True)
        return [text for name, text in resolved.value_rows() if name.startswith("value from")]

    built_in = [row for row in rows("builtin") if row.startswith("ragged_buffer_factor=")]
    assert "; applied with another meaning: built-in engine: ceil(factor" in built_in[0]
    chunks = [row for row in rows("builtin") if row.startswith("num_moe_token_chunks=")]
    assert chunks[0].endswith("off in the trainer's keys: there the key does nothing")
    assert not any("another meaning" in row for row in rows("maxtext"))


def test_token_chunks_maxtext_ignores_say_so_on_maxtexts_engine():
    def rows(argv: str) -> list[str]:
        env = {"PRESET": "qwen3.5-397b-cell", "ENGINE": "maxtext", "TRAINER_ARGV": argv}
        resolved = plan.resolve(plan.environment_config(env), env=env, rendering=True)
        return [text for _, text in resolved.value_rows()] + resolved.lines()

    # a cell with no trainer: the preset's value, and what one MaxText release makes of it, named
    idle = (
        "num_moe_token_chunks=2 (the measured public run's); maxtext 0.2.5 chunks tokens only in"
        " its ring of experts (use_ring_of_experts=true) and refuses the key without it; other"
        " releases differ: the image's MaxText decides"
    )
    assert any(row.startswith(idle) for row in rows(""))
    # the trainer's own key: passed, with the same words about the release
    trainer = rows("MAXTEXT_EXTRA_FLAGS=num_moe_token_chunks=4")
    assert (
        "plan: trainer key: num_moe_token_chunks=4: passed to MaxText (maxtext 0.2.5 chunks tokens"
        " only in its ring" in " ".join(trainer)
    )
    ring = rows('MAXTEXT_EXTRA_FLAGS="use_ring_of_experts=true num_moe_token_chunks=4"')
    assert "plan: trainer key: num_moe_token_chunks=4: passed to MaxText" in ring


def test_the_bench_pods_substitutions_list_a_key_applied_with_another_meaning():
    env = {
        "PRESET": "qwen3.5-397b-cell",
        "ENGINE": "builtin",
        "TRAINER_ARGV": "MAXTEXT_EXTRA_FLAGS=ragged_buffer_factor=2.0",
    }
    resolved = plan.resolve(plan.environment_config(env), env=env, rendering=True)
    assert any(
        line.startswith("trainer key ragged_buffer_factor=2.0: applied with another meaning")
        for line in resolved.substitutions()
    )
