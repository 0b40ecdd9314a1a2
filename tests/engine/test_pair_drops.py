"""The host's count of dropped pairs (`pair_drops`) against the program's own overflow flag, and
the dropless replay compiled only for a run that needs it.

cpu-tiny's 2x2x2 mesh at 16 rows of 128 tokens puts 4 rows of 64 tokens on each of its 8 devices
(rows over fsdp x expert, tokens over context), cut into two groups of 2 rows each; at buffer factor
1.0 and top 2 of 8 experts a group of 128 tokens has 32 slots an expert. Every token of the routing
below picks experts 2p mod 8 and 2p + 1 mod 8 at position p, so each expert fills each group's
slots exactly. Each case moves pairs and says, by hand, whether some group then holds 33 pairs of
one expert: a count that split or lumped rows, context shards or chunks otherwise would miss a move
across them or count one within a group.
"""

import dataclasses

import numpy as np
import pytest
from config_payloads import config_payload

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import jax_engine
from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.builtin.pair_drops import drops_pairs
from rl_trainer_bench.engine.config import MoeConfig
from rl_trainer_bench.engine.contract import ContractError

# cpu-tiny at buffer factor 1.0, each device's tokens in two groups; its two layers both of full
# attention (the mixer is not what is counted, and the delta rule's compile would double the test's)
TINY = PRESETS["cpu-tiny"].engine
CONFIG = dataclasses.replace(
    TINY,
    model=dataclasses.replace(TINY.model, layer_types=("full_attention",)),
    moe=MoeConfig(ragged_buffer_factor=1.0, expert_compute="einsum", token_chunks=2),
    micro_batch_rows=16,
)
MODEL = CONFIG.model


def routed(moves, padded=False, seed=0):
    """A payload whose routes fill every group's slots exactly, then `moves`: (row, position,
    layer, slot, expert) each. `padded`: rows end in padding (segments of 48 tokens, not 64)."""
    payload = config_payload(CONFIG, segment_len=48 if padded else 64, seed=seed)
    position = np.arange(CONFIG.seq_len)[:, None] * MODEL.top_k + np.arange(MODEL.top_k)
    routes = np.broadcast_to(
        (position % MODEL.num_experts)[None, :, None, :],
        (CONFIG.micro_batch_rows, CONFIG.seq_len, MODEL.num_layers, MODEL.top_k),
    ).copy()
    for row, pos, layer, slot, expert in moves:
        routes[row, pos, layer, slot] = expert
    return dataclasses.replace(payload, routed_experts=routes.astype(np.int16), digests={})


# Position 0 picks experts 0 and 1, position 1 experts 2 and 3, 65 (the second context shard's)
# 2 and 3. Rows 0-1 are the first group of the first row shard, rows 2-3 its second, row 4 the next
# shard's.
CASES = {  # name: (moves, padded, whether a pair drops)
    "every-slot-full": ([], False, False),
    "one-past-the-slots": ([(0, 0, 1, 0, 2)], False, True),
    "moved-within-a-group": ([(0, 0, 1, 0, 2), (1, 1, 1, 0, 0)], False, False),
    "moved-across-context-shards": ([(0, 0, 0, 0, 2), (0, 65, 0, 0, 0)], False, True),
    "moved-across-row-shards": ([(0, 0, 0, 0, 2), (4, 1, 0, 0, 0)], False, True),
    "moved-across-chunks": ([(0, 0, 1, 0, 2), (2, 1, 1, 0, 0)], False, True),
    "padding-routes-to-one-expert": (
        [(row, p, 0, 0, 5) for row in range(16) for p in range(96, 128)],
        True,
        False,
    ),
}


def test_the_replay_compiles_only_when_a_pair_drops_as_the_programs_flag_says(monkeypatch):
    """Per case, the host's count and the program's own overflow flag (the step's overflow count)
    against the hand-made answer; the replay's program compiled beside the others only for a run
    `will_run` says drops a pair, and for one micro-batch that does when it comes."""
    monkeypatch.setattr(jax_engine, "_COMPILED", {})  # no replay compiled by an earlier test
    payloads = {name: routed(moves, padded) for name, (moves, padded, _) in CASES.items()}
    keeping = [payloads[name] for name, (_, _, drops) in CASES.items() if not drops]
    engine = JaxEngine(CONFIG)
    engine.will_run(keeping)
    assert set(engine.compile(keeping[0])) == {"fwd_bwd", "update"}
    assert engine.info()["dropless_replay"].startswith("compiled once a micro-batch")
    again = JaxEngine(CONFIG)  # the same programs, and a run whose micro-batches drop pairs
    again.will_run(list(payloads.values()))
    seconds = again.compile(keeping[0])
    assert seconds["fwd_bwd"] == seconds["update"] == 0 and seconds["fwd_bwd_dropless"] > 0
    monkeypatch.setattr(jax_engine, "_COMPILED", {})  # and compiled afresh: the three side by side
    afresh = JaxEngine(CONFIG)
    afresh.will_run(list(payloads.values()))
    assert set(afresh.compile(keeping[0])) == {"fwd_bwd", "fwd_bwd_dropless", "update"}
    for name, (_, _, drops) in CASES.items():
        payload = payloads[name]
        assert drops_pairs(payload.routed_experts, payload.segment_ids, CONFIG) is drops, name
        engine.fwd_bwd(payload)
        engine.update()
        metrics = engine.get_metrics()
        assert (metrics["overflow_count"], metrics["replay_count"]) == (drops, drops), name
    # what the count reads before any program checks it, refused in one line naming the field
    out_of_range = routed([(0, 0, 0, 0, -5)])
    cut_short = dataclasses.replace(
        out_of_range, routed_experts=out_of_range.routed_experts[:, :64].copy()
    )
    for hostile, refusal in (
        (out_of_range, "field routed_experts holds expert id -5"),
        (cut_short, r"field routed_experts is int16\[16, 64, 2, 2\], expected int16\[16, 128"),
    ):
        monkeypatch.setattr(jax_engine, "_COMPILED", {})
        engine = JaxEngine(CONFIG)
        engine.will_run([hostile])
        with pytest.raises(ContractError, match=refusal):
            engine.compile(keeping[0])
