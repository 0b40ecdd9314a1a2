"""Packing layout: every built micro-batch is well formed, whatever the shapes and statistics."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.checks import check_payload
from rl_trainer_bench.payload.errors import ProfileError
from rl_trainer_bench.payload.packing import (
    SEGMENT_ALIGN,
    PackingLayout,
    layout_from_orchestrator_argv,
)
from rl_trainer_bench.payload.routing_profile import RoutingProfile

TINY = preset("cpu-tiny").engine


def engine_with(rows: int, seq_len: int, experts: int = 8, top_k: int = 2, layers: int = 2):
    model = dataclasses.replace(TINY.model, num_experts=experts, top_k=top_k, num_layers=layers)
    return dataclasses.replace(TINY, model=model, micro_batch_rows=rows, seq_len=seq_len)


def uniform_profile(engine) -> RoutingProfile:
    m = engine.model
    shares = np.full((m.num_layers, m.num_experts), 1.0 / m.num_experts)
    return RoutingProfile(m.num_experts, m.top_k, m.num_layers, shares)


def sequences(payload):
    """(row, start, length, prompt_tokens) of every packed sequence, read back from the arrays."""
    found = []
    for b, ids in enumerate(payload.segment_ids):
        for segment in np.unique(ids[ids > 0]):
            where = np.flatnonzero(ids == segment)
            mask = payload.completion_mask[b, where]
            found.append((b, int(where[0]), where.size, int(np.argmax(mask)) + 1))
    return found


quantiles = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4).map(sorted)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    seq_len=st.integers(2, 700),
    pad_fraction=st.floats(0.0, 0.9),
    real=quantiles.map(lambda q: [max(v, 0.0) for v in q]),
    segments=st.lists(st.floats(1.0, 40.0), min_size=1, max_size=3).map(sorted),
    prompt=quantiles,
    seed=st.integers(0, 2**31),
)
def test_any_layout_builds_a_well_formed_micro_batch(
    rows, seq_len, pad_fraction, real, segments, prompt, seed
):
    engine = engine_with(rows, seq_len)
    layout = PackingLayout(
        rows=rows,
        seq_len=seq_len,
        pad_rows=min(rows - 1, int(pad_fraction * rows)),
        real_fraction=real,
        segments_per_row=segments,
        prompt_fraction=prompt,
        group_size=4,
    )
    payload = build_micro_batch(engine, uniform_profile(engine), seed=seed, index=0, layout=layout)
    assert check_payload(payload, engine) == []
    real_rows = (payload.segment_ids > 0).any(axis=1)
    assert (~real_rows).sum() == layout.pad_rows
    for _, _, length, prompt_tokens in sequences(payload):
        assert length >= 2 and 1 <= prompt_tokens <= length - 1


def test_segments_start_on_multiples_of_64_when_the_row_allows():
    engine = engine_with(4, 4096)
    layout = PackingLayout(4, 4096, real_fraction=(1.0,), segments_per_row=(8.0,))
    payload = build_micro_batch(engine, uniform_profile(engine), seed=3, index=0, layout=layout)
    starts = [start for _, start, _, _ in sequences(payload)]
    assert len(starts) == 4 * 8
    assert all(start % SEGMENT_ALIGN == 0 for start in starts)


def test_short_rows_with_many_segments_still_build_and_pack_every_segment():
    engine = engine_with(2, 40)  # fewer aligned units than segments: cuts fall anywhere
    layout = PackingLayout(2, 40, real_fraction=(1.0,), segments_per_row=(20.0,))
    payload = build_micro_batch(engine, uniform_profile(engine), seed=0, index=0, layout=layout)
    assert check_payload(payload, engine) == []
    assert [int(ids.max()) for ids in payload.segment_ids] == [20, 20]


def test_advantages_are_group_normalized_per_sequence():
    engine = engine_with(4, 1024)
    layout = PackingLayout(4, 1024, real_fraction=(1.0,), segments_per_row=(4.0,), group_size=4)
    payload = build_micro_batch(engine, uniform_profile(engine), seed=1, index=0, layout=layout)
    per_sequence = [payload.advantages[b, start] for b, start, _, _ in sequences(payload)]
    groups = np.array(per_sequence).reshape(-1, 4)
    np.testing.assert_allclose(groups.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(groups.std(axis=1), 1.0, atol=1e-3)


def test_old_logps_start_near_a_fresh_models_log_probs():
    engine = engine_with(2, 256)
    payload = build_micro_batch(engine, uniform_profile(engine), seed=0, index=0)
    real = payload.segment_ids > 0
    expected = -np.log(engine.model.vocab_size)
    assert abs(np.median(payload.old_logps[real]) - expected) < 0.01
    assert np.all(payload.old_logps[~real] == 0)


def test_orchestrator_argv_gives_a_layout_of_whole_sequences():
    layout = PackingLayout.from_orchestrator(64, 65_536, 4096, 61_440, num_generations=16)
    assert layout.segments_per_row == (1.0, 2.0)
    assert layout.group_size == 16
    assert layout.prompt_fraction[0] < 4096 / 65_536 < layout.prompt_fraction[-1]
    short = PackingLayout.from_orchestrator(8, 8192, 512, 128)
    assert short.segments_per_row[-1] == 25.0  # 8192 tokens / a mean sequence of 320


def test_a_group_is_16_sequences_wherever_the_orchestrator_does_not_say():
    argv = ["--max_prompt_length=512", "--max_response_length=128"]
    assert layout_from_orchestrator_argv(TINY, argv).group_size == 16
    assert layout_from_orchestrator_argv(TINY, [*argv, "--num_generations=4"]).group_size == 4
    assert PackingLayout.from_orchestrator(8, 8192, 512, 128).group_size == 16
    parser = cli.build_parser(["payload"])
    assert parser.parse_args(["payload", "--out", "x.npz"]).num_generations == 16


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"pad_rows": 4}, "pad_rows"),
        ({"real_fraction": (0.9, 0.5)}, "real_fraction"),
        ({"segments_per_row": (0.0,)}, "segments_per_row"),
        ({"prompt_fraction": (1.5,)}, "prompt_fraction"),
    ],
)
def test_bad_layout_is_refused_naming_the_field(changes, field):
    with pytest.raises(ProfileError, match=f"layout.{field}"):
        PackingLayout(**{"rows": 4, "seq_len": 128, **changes})
