"""row_gather.gather_rows in Pallas's interpreter: the rows of a bfloat16 table bit for bit as
XLA's gather gives them, signed zeros, infinities and NaN included."""

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.engine.builtin.row_gather import gather_rows


def test_the_kernel_gives_xlas_rows_bit_for_bit():
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.standard_normal((300, 512)) * 10, jnp.bfloat16)
    table = table.at[0, 0].set(-0.0).at[1, 1].set(jnp.inf).at[2, 3].set(jnp.nan)
    indices = jnp.asarray(rng.integers(0, 300, 1000), jnp.int32)
    got = gather_rows(table, indices, rows_a_block=64, interpret=True)
    want = table[indices]
    bits = (jax.lax.bitcast_convert_type(x, jnp.uint16) for x in (got, want))
    np.testing.assert_array_equal(*bits)
