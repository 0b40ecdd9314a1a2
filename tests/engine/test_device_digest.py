"""The parameter digest computed on the device: as exact as a digest of every byte, and only its
lane sums reach the host (a turn of an A/B no longer copies the weights)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from config_payloads import config_payload

from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine import device_digest
from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.config import MeshConfig

M32 = 0xFFFFFFFF


def fmix32_reference(h: int) -> int:
    """MurmurHash3's fmix32, written apart from the module, in Python integers."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def lane_sums_reference(words: np.ndarray) -> list[int]:
    """The two lane sums of uint32 `words`, element by element in Python integers."""
    sums = [0, 0]
    lanes = ((0x2C1B3C6D, 0x68E31DA4), (0x297A2D39, 0xB5297A4D))
    for index in np.ndindex(words.shape):
        key = 0x9E3779B1
        for i in index:
            key = ((key ^ i) * 0x9E3779B1) & M32
            key ^= key >> 15
        mixed = int(words[index]) ^ key
        for lane, (odd, add) in enumerate(lanes):
            sums[lane] = (sums[lane] + fmix32_reference((mixed * odd + add) & M32)) & M32
    return sums


def test_lane_sums_match_a_reference_on_a_sharded_array():
    values = np.random.default_rng(0).standard_normal((8, 6), np.float32)
    mesh = jax.make_mesh((8,), ("rows",))
    sharded = jax.device_put(values, jax.NamedSharding(mesh, jax.P("rows")))
    got = jax.jit(device_digest.lane_sums)(sharded)
    assert [int(x) for x in got] == lane_sums_reference(values.view(np.uint32))


def test_bf16_words_are_their_bit_patterns():
    values = jnp.asarray([[1.5, -0.0], [3.0, 0.5]], jnp.bfloat16)
    expected = np.asarray([[0x3FC0, 0x8000], [0x4040, 0x3F00]], np.uint32)
    np.testing.assert_array_equal(np.asarray(device_digest.words(values)), expected)


def _tree():
    rng = np.random.default_rng(1)
    return {
        "dense": rng.standard_normal((4, 16, 8)).astype(np.float32),
        "half": rng.standard_normal((32, 8)).astype(jnp.bfloat16),
    }


def _digest(tree) -> str:
    return device_digest.hex_digest({name: jnp.asarray(value) for name, value in tree.items()})


@pytest.mark.parametrize(
    "name,index,bit",
    [
        ("dense", (0, 0, 0), 0),  # a float32's lowest mantissa bit
        ("dense", (3, 15, 7), 31),  # its sign, in the last element
        ("half", (5, 3), 0),  # a bfloat16's lowest bit
        ("half", (31, 7), 15),
    ],
)
def test_one_bit_changes_the_digest(name, index, bit):
    tree = _tree()
    before = _digest(tree)
    changed = {k: v.copy() for k, v in tree.items()}
    width = np.uint32 if changed[name].dtype.itemsize == 4 else np.uint16
    changed[name].view(width)[index] ^= width(1 << bit)
    assert _digest(changed) != before
    assert _digest({k: v.copy() for k, v in tree.items()}) == before  # same bits, same digest


def test_moved_values_change_the_digest():
    tree = _tree()
    before = _digest(tree)
    swapped = dict(tree, dense=tree["dense"][:, ::-1, :].copy())  # the same values, moved
    assert _digest(swapped) != before
    renamed = {"other": tree["dense"], "half": tree["half"]}
    assert _digest(renamed) != before


def test_a_zeros_sign_and_a_nans_payload_are_seen():
    zeros = {"w": np.zeros((4, 4), np.float32)}
    negative = {"w": zeros["w"].copy()}
    negative["w"][2, 2] = -0.0
    assert _digest(zeros) != _digest(negative)
    nans = {"w": np.full((4, 4), np.nan, np.float32)}
    other = {"w": nans["w"].copy()}
    other["w"].view(np.uint32)[1, 1] ^= 1  # another NaN, equal as a float to none
    assert _digest(nans) != _digest(other)


def test_the_digest_does_not_depend_on_the_layout():
    value = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    one = jax.device_put(value, jax.devices()[0])
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    spread = jax.device_put(value, jax.NamedSharding(mesh, jax.P("a", "b")))
    assert device_digest.hex_digest({"w": one}) == device_digest.hex_digest({"w": spread})


DENSE = dataclasses.replace(
    PRESETS["cpu-tiny-dense"].engine, mesh=MeshConfig(), micro_batch_rows=2, seq_len=64
)


def _pool(count):
    return [config_payload(DENSE, seed) for seed in range(count)]


def test_a_turn_copies_no_weights_to_the_host(monkeypatch):
    """A one-step turn (Bench.run, as an A/B turn) reads back its metrics and the digest's lane
    sums, nothing the size of the weights: every first read of a device array's value is
    counted (jax.device_get, numpy, float() all take it)."""
    preset = dataclasses.replace(PRESETS["cpu-tiny-dense"], engine=DENSE)  # the engine's one device
    config = BenchConfig(preset=preset, steps=1, micro_steps=2)
    engine = JaxEngine(DENSE, jax.devices()[:1])
    bench = Bench(config, lambda line: None, engine_factory=lambda _: engine, pool=_pool(2))
    bench.setup()
    bench.run(steps=1, stage=StageConfig(), warmup_steps=1)  # warm: its reads are not counted
    weights = sum(leaf.nbytes for leaf in engine._state.params.values())
    array_type = type(next(iter(engine._state.params.values())))
    value = array_type._value
    read: list[int] = []

    def counted(array):
        if array._npy_value is None:
            read.append(array.nbytes)
        return value.fget(array)

    monkeypatch.setattr(array_type, "_value", property(counted))
    try:
        result = bench.run(steps=1, stage=StageConfig(), warmup_steps=0)
    finally:
        bench.close()
    assert result.param_digest
    assert sum(read) < weights / 100, (sum(read), weights)
