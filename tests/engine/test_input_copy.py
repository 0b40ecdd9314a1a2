"""The built-in engine's copy of a micro-batch: cut into pieces where a device's block is large,
joined on the devices into exactly the arrays and shardings the programs take; staged whole."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rl_trainer_bench.engine.builtin import input_copy, sharding
from rl_trainer_bench.engine.builtin.input_copy import InputCopy, plan_split
from rl_trainer_bench.engine.config import MeshConfig

MESH = MeshConfig(fsdp=2, context=2, expert=2)


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "filler": rng.integers(0, 255, (8, 64, 37)).astype(np.uint8),  # blocks [2, 32, 37]
        "advantages": rng.random((8, 64)).astype(np.float32),  # blocks of 256 B: whole
        "routes": rng.integers(0, 9, (8, 64, 3, 2)).astype(np.int16),  # blocks [2, 32, 3, 2]
    }


def test_a_block_is_cut_into_as_many_pieces_of_the_least_size_as_it_holds():
    assert plan_split((2, 32, 37), 1, 1000) == input_copy.Split(2, (2, 32, 37))  # 2368 B
    assert plan_split((2, 32, 37), 1, 1200) is None  # under two pieces' bytes: whole
    assert plan_split((1, 1, 4096), 1, 100) is None  # one row of one token: nothing to cut
    assert plan_split((6, 4096, 5462), 1, 2 << 20) == input_copy.Split(32, (6, 4096, 5462))
    assert plan_split((6, 4096, 2731), 1, 2 << 20).pieces == 32  # 64 MiB
    assert plan_split((6, 4096, 200), 1, 2 << 20).pieces == 2  # 4.7 MiB
    assert input_copy.piece_bytes_for("cpu") is None
    assert input_copy.piece_bytes_for("tpu") == 2 << 20


@pytest.mark.parametrize("piece_bytes", [None, 1000, 200])
def test_the_copy_arrives_bit_identical_in_the_programs_input_shardings(piece_bytes):
    mesh = sharding.make_mesh(MESH, jax.devices()[:8])
    arrays = _arrays()
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in arrays.items()}
    copier = InputCopy(mesh, spec, piece_bytes)
    try:
        for placed in (copier.copy(arrays), copier.start(arrays).result()):
            assert set(placed) == set(arrays)
            for name, array in arrays.items():
                assert placed[name].sharding == sharding.payload_sharding(mesh, array.ndim)
                np.testing.assert_array_equal(np.asarray(placed[name]), array)
    finally:
        copier.close()
    cut = {None: "none cut", 1000: "filler in 2", 200: "filler in 11, routes in 3"}[piece_bytes]
    assert copier.describe().endswith(f": {cut}")
