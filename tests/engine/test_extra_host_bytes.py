"""extra_host_bytes: every micro-batch carries the filler bytes asked for, the programs take them as
an input they read, and the loss, gradient and update stay exactly as they were (the built-in
engine on one CPU device, a dense model)."""

import dataclasses

import numpy as np
from one_update import assert_same_update, one_update

from rl_trainer_bench.bench.micro_batch_memory import micro_batch_bytes
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.payload_shapes import payload_shapes
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.checks import check_payload
from rl_trainer_bench.payload.routing_profile import load_profile

DENSE = dataclasses.replace(
    PRESETS["cpu-tiny-dense"].engine, mesh=MeshConfig(), micro_batch_rows=2, seq_len=64
)
ASKED = 1000  # 2 x 64 = 128 tokens: 8 bytes a token, 1,024 bytes in all
WITH_BYTES = dataclasses.replace(DENSE, extra_host_bytes=ASKED)


def micro_batch(config, index=0):
    return build_micro_batch(config, load_profile(None), seed=5, index=index)


def test_the_filler_is_the_fewest_whole_bytes_a_token_that_hold_the_request():
    assert payload_shapes(WITH_BYTES)["extra_host_bytes"] == ((2, 64, 8), np.dtype(np.uint8))
    assert "extra_host_bytes" not in payload_shapes(DENSE)
    assert micro_batch_bytes(WITH_BYTES) - micro_batch_bytes(DENSE) == 1024
    exact = dataclasses.replace(DENSE, extra_host_bytes=128 * 3)
    assert payload_shapes(exact)["extra_host_bytes"][0] == (2, 64, 3)


def test_the_micro_batch_carries_random_filler_and_every_other_array_as_it_was():
    plain, padded = micro_batch(DENSE), micro_batch(WITH_BYTES)
    filler = padded.extra_host_bytes
    assert filler.shape == (2, 64, 8) and filler.dtype == np.uint8
    assert len(np.unique(filler)) > 200  # random bytes, not a constant a link could compress
    for name, array in plain.arrays().items():
        np.testing.assert_array_equal(padded.arrays()[name], array, err_msg=name)
        assert padded.digests[name] == plain.digests[name]
    assert "extra_host_bytes" in padded.digests
    assert check_payload(padded, WITH_BYTES) == []
    assert any("extra_host_bytes: missing" in p for p in check_payload(plain, WITH_BYTES))


def test_the_program_reads_the_filler_and_trains_exactly_as_without_it():
    """jit drops an argument its program does not read: the filler's bytes among the compiled
    fwd_bwd's arguments show the program reads it; the loss, gradient and update are those of
    the same micro-batch without it, bit for bit."""
    plain, filler = (
        one_update(config, micro_batch(config), micro_batch(config, index=1))
        for config in (DENSE, WITH_BYTES)
    )
    assert filler.fwd_bwd_argument_bytes - plain.fwd_bwd_argument_bytes == 1024
    assert_same_update(filler, plain)
