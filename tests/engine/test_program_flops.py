"""The built-in fwd_bwd's FLOPs against the model's, by shape arithmetic worked by hand here."""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin.program_flops import builtin_fwd_bwd_flops

# cpu-tiny: full-attention layers, 8 experts, top-2, on 8 devices (checked below)
CPU_TINY = PRESETS["cpu-tiny"].engine


def _cell(factor: float):
    moe = dataclasses.replace(CPU_TINY.moe, ragged_buffer_factor=factor, token_chunks=1)
    return dataclasses.replace(CPU_TINY, moe=moe)


def test_capacity_padding_and_the_full_attention_square_are_counted_by_hand():
    config = _cell(1.5)
    m = config.model
    assert (m.num_experts, m.top_k, config.mesh.size) == (8, 2, 8)
    rows, seq = config.micro_batch_rows, config.seq_len
    # one segment of half a row in every row: real = rows x seq / 2
    ids = np.zeros((rows, seq), np.int32)
    ids[:, : seq // 2] = 1
    flops = builtin_fwd_bwd_flops(config, ids)
    # per device: rows / (fsdp x expert) rows of seq / context tokens, one group
    group = rows // (config.mesh.fsdp * config.mesh.expert) * (seq // config.mesh.context)
    slots = int(np.ceil(1.5 * group * 2 / 8))
    groups = rows * seq // group
    assert flops.expert_ratio == groups * 8 * slots / (rows * seq / 2 * 2)
    # every query scores every key of its row (seq^2) against the causal half of one segment
    assert flops.attention_ratio == rows * seq**2 / (rows * (seq / 2) ** 2 / 2)
    assert flops.attention_ratio == 8.0


def test_dropless_experts_run_the_routed_pairs_only():
    ids = np.ones((CPU_TINY.micro_batch_rows, CPU_TINY.seq_len), np.int32)
    flops = builtin_fwd_bwd_flops(_cell(-1), ids)
    assert flops.expert_ratio == 1.0
    assert flops.attention_ratio == 2.0  # one whole-row segment: the square over its half
    assert 1.0 < flops.ratio < 2.0


def test_token_sorted_capacity_program_runs_the_routed_pairs_not_the_slots():
    config = _cell(1.5)
    sorted_moe = dataclasses.replace(config.moe, expert_compute="sorted_ragged_dot")
    ids = np.ones((config.micro_batch_rows, config.seq_len), np.int32)
    padded = builtin_fwd_bwd_flops(config, ids)
    flops = builtin_fwd_bwd_flops(dataclasses.replace(config, moe=sorted_moe), ids)
    assert padded.expert_ratio == 1.5  # 8 tokens x 2 / 8 experts x 1.5 = 3 slots, no rounding
    assert flops.expert_ratio == 1.0
    assert flops.attention_ratio == padded.attention_ratio
