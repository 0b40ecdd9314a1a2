"""A digest of named device arrays, computed on the device: a few words per array reach the host.

Why on the device: the digest of a chip's weights was a sha256 over every byte copied to the host,
seconds for the 2.34 GiB of tpu-v5e-1's parameters at every A/B turn
(benchmarks/reports/ab-turn-overhead_cpu-v5e_2026-12-06.md). Here one jitted program reads the
arrays where they rest and returns `LANES` uint32 words per array; the host hashes those words with
each array's name, shape and dtype (sha256), so the digest still names the whole tree. Its compile
is an engine's to schedule (`JaxEngine` compiles it beside its programs, off every turn).

Why it is exact (a change of any bit changes it):
- Every element is read as its bit pattern (`lax.bitcast_convert_type`): 32-bit types as one
  uint32 word, 8- and 16-bit types widened to one, 64-bit types split into two. No arithmetic on
  the values: a NaN's payload, the sign of a zero, a bf16's low bits all reach the digest.
- Word `w` at position `p` (its index along every dim) becomes, in lane `l`,
  `fmix32((w ^ key(p)) * ODD[l] + ADD[l])`, summed over the array modulo 2**32. `fmix32`
  (MurmurHash3's finaliser), XOR with a key, multiplying by an odd number and adding a constant
  are each a bijection of the 32-bit words, so a change confined to one word changes its term,
  and so its lane's sum, for certain, in every lane. Changes in several words cancel in a lane
  only when their terms' changes sum to 0 modulo 2**32: with terms that behave as random words,
  about 2**-32 per lane, 2**-64 over the two lanes. Two lanes, not more: each lane is one more
  pass of integer work over every array, and a TPU's compile time grows with it (the same report).
  `key(p)` mixes every index of `p`, so moving a value (a transpose, a shifted slice) changes
  the sums too, at the same odds.
- Sums modulo 2**32 are associative and commutative: the result does not depend on how XLA
  orders the reduction or splits it over devices, so the same bits give the same digest on any
  mesh and backend. Two sets of arrays with equal digests are bit-identical with overwhelming
  probability; it guards against accidents (a stale array, a wrong update), not an adversary.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_FMIX = (np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35))
_GOLDEN = np.uint32(0x9E3779B1)
# Per lane: an odd multiplier and an addend, so each lane applies its own bijection before fmix32.
_LANE_MIX = (
    (np.uint32(0x2C1B3C6D), np.uint32(0x68E31DA4)),
    (np.uint32(0x297A2D39), np.uint32(0xB5297A4D)),
)
LANES = len(_LANE_MIX)


def fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 whose output bits each depend on
    every input bit."""
    h = h ^ (h >> 16)
    h = h * _FMIX[0]
    h = h ^ (h >> 13)
    h = h * _FMIX[1]
    return h ^ (h >> 16)


def position_key(shape: tuple[int, ...]) -> jax.Array:
    """A uint32 word per position of `shape`, mixed from its index along every dim (an array of
    more than 2**32 elements still gets a key from all its indices); each lane's fmix32 mixes it
    further with the word."""
    h = jnp.full(shape, _GOLDEN, jnp.uint32)
    for dim in range(len(shape)):
        h = (h ^ lax.broadcasted_iota(jnp.uint32, shape, dim)) * _GOLDEN
        h = h ^ (h >> 15)
    return h


def words(array: jax.Array) -> jax.Array:
    """The array's bit patterns as uint32 words (64-bit elements as two words on a new last dim)."""
    size = array.dtype.itemsize
    if array.dtype == jnp.bool_:
        return array.astype(jnp.uint32)
    if size == 4:
        return lax.bitcast_convert_type(array, jnp.uint32)
    if size in (1, 2):
        unsigned = jnp.uint8 if size == 1 else jnp.uint16
        return lax.bitcast_convert_type(array, unsigned).astype(jnp.uint32)
    if size == 8:
        return lax.bitcast_convert_type(array, jnp.uint32)  # [..., 2]
    raise TypeError(f"device digest: no word layout for dtype {array.dtype}")


def lane_sums(array: jax.Array) -> jax.Array:
    """The array's LANES sums (uint32[LANES]); jit it, so the terms never reach memory."""
    w = words(array)
    mixed = w ^ position_key(w.shape)
    return jnp.stack(
        [jnp.sum(fmix32(mixed * odd + add), dtype=jnp.uint32) for odd, add in _LANE_MIX]
    )


def _all_lane_sums(arrays: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {name: lane_sums(array) for name, array in arrays.items()}


# The digest program by the arrays' names, shapes, dtypes and shardings: compiled once a process.
_COMPILED: dict[tuple, jax.stages.Compiled] = {}
_LOCK = threading.Lock()


def _signature(arrays: Mapping[str, Any]) -> tuple:
    return tuple(
        (name, tuple(arrays[name].shape), str(arrays[name].dtype), arrays[name].sharding)
        for name in sorted(arrays)
    )


def compiled_for(arrays: Mapping[str, Any]) -> jax.stages.Compiled:
    """The digest program for arrays shaped, typed and laid out as `arrays` (arrays, or
    ShapeDtypeStructs with their shardings), compiled on the first call for them."""
    key = _signature(arrays)
    with _LOCK:
        found = _COMPILED.get(key)
    if found is None:
        abstract = {
            name: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
            for name, a in arrays.items()
        }
        found = jax.jit(_all_lane_sums).lower(abstract).compile()
        with _LOCK:
            found = _COMPILED.setdefault(key, found)
    return found


def hex_digest(arrays: Mapping[str, jax.Array]) -> str:
    """sha256 over each array's name, shape, dtype and lane sums, in name order: the lane sums
    (LANES words an array) are all that is copied to the host."""
    sums = jax.device_get(compiled_for(arrays)(dict(arrays)))
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = arrays[name]
        digest.update(f"{name}:{array.dtype}:{tuple(array.shape)};".encode())
        digest.update(np.asarray(sums[name], np.uint32).tobytes())
    return digest.hexdigest()
