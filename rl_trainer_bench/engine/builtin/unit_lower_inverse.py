"""(I + L)^-1 of many small strictly lower triangular L: by XLA's batched matmuls or a Pallas kernel.

The chunked gated delta rule (`linear_attention.py`) inverts one C x C matrix per chunk and head:
2,048 matrices of 128 x 128 a micro-batch on tpu-v5e-1 (4,096 of 64 at chunks of 64). Both methods
run the same doubling (blocks of s become blocks of 2s, `xla_inverse`). XLA runs each level over
all the matrices at once, so every level's operands and products pass through HBM (about 10 GiB of
a micro-batch's traffic on tpu-v5e-1 at chunks of 64,
benchmarks/reports/chip-round-4_tpu-v5e_2026-12-06.md); the kernel keeps a block of
matrices in VMEM through all the levels and reads and writes each matrix once. The gradient is the same rule for both, in XLA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Matrices a kernel program holds: 8 of 128 x 128 float32 are 512 KiB a buffer, far inside VMEM,
# and at 2,048 matrices a call, 256 programs to pipeline.
KERNEL_BLOCK = 8


def _doubling_masks(index, c):
    """For each level s = 1, 2, 4, ... below c: where `strict` enters that level's update, the
    entries below-left of the diagonal inside each 2s block; `index` gives (row, column) iotas."""
    row, col = index
    level = 0
    while (1 << level) < c:
        same_pair = jnp.right_shift(row, level + 1) == jnp.right_shift(col, level + 1)
        lower_half = jnp.bitwise_and(jnp.right_shift(row, level), 1) == 1
        upper_half = jnp.bitwise_and(jnp.right_shift(col, level), 1) == 0
        yield same_pair & lower_half & upper_half
        level += 1


def doubled(strict, index, matmul):
    """The doubling from the identity: at each level X <- X - X N_s X (see `xla_inverse`). The
    first level's X is the identity, so it gives I - N_1 without a matmul: two fewer in a chain
    of dependent matmuls (the levels run one after another)."""
    row, col = index
    identity = jnp.broadcast_to((row == col).astype(strict.dtype), strict.shape)
    inverse = identity
    for level, mask in enumerate(_doubling_masks(index, strict.shape[-1])):
        off = jnp.where(mask, strict, 0)
        inverse = identity - off if level == 0 else inverse - matmul(matmul(inverse, off), inverse)
    return inverse


def xla_inverse(strict):
    """(I + strict)^-1 for strict [..., C, C] strictly lower triangular, by blocks that double.

    With the inverses X11, X22 of the two diagonal blocks of a block [[L11, 0], [L21, L22]], its
    inverse is [[X11, 0], [-X22 L21 X11, X22]]. Starting from the identity (blocks of one), each
    level turns blocks of s into blocks of 2s at once for the whole matrix, X <- X - X N_s X, where
    N_s keeps the entries of `strict` below-left of the diagonal inside each 2s block: log2(C)
    levels of two C x C matmuls, but the first (X = I there, so X - X N_1 X = I - N_1).
    """
    c = strict.shape[-1]
    index = (jnp.arange(c)[:, None], jnp.arange(c)[None, :])
    return doubled(strict, index, lambda a, b: jnp.einsum("...ij,...jk->...ik", a, b))


def _kernel(strict_ref, out_ref, *, precision):
    """One block of matrices [block, C, C], all levels in VMEM."""
    shape = strict_ref.shape
    index = tuple(jax.lax.broadcasted_iota(jnp.int32, shape, axis) for axis in (1, 2))

    def matmul(a, b):
        return jnp.einsum(
            "bij,bjk->bik", a, b, precision=precision, preferred_element_type=jnp.float32
        )

    out_ref[...] = doubled(strict_ref[...], index, matmul)


def kernel_precision():
    """The kernel's matmul precision as the ambient default asks (`matmul_precision`): the
    default passes float32 operands once through bfloat16, as XLA's TPU matmuls do; any finer
    setting takes float32, the only finer one the Pallas TPU compiler has."""
    default = jax.config.jax_default_matmul_precision
    if default in (None, "default", "bfloat16", "fastest"):
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST


def pallas_inverse(strict, *, interpret=False):
    """`xla_inverse` by the kernel: strict [..., C, C] float32, the leading dims' product a
    multiple of KERNEL_BLOCK (padded with zero matrices otherwise). `interpret` runs Pallas's
    interpreter, to check the kernel off a TPU."""
    # Pallas, imported only where the kernel is chosen (it adds to every import of the engine)
    from jax.experimental import pallas as pl

    shape, c = strict.shape, strict.shape[-1]
    flat = strict.reshape(-1, c, c)
    count = flat.shape[0]
    padded = -(-count // KERNEL_BLOCK) * KERNEL_BLOCK
    flat = jnp.pad(flat, ((0, padded - count), (0, 0), (0, 0)))
    block = pl.BlockSpec((KERNEL_BLOCK, c, c), lambda i: (i, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, precision=kernel_precision()),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
        grid=(padded // KERNEL_BLOCK,),
        in_specs=[block],
        out_specs=block,
        interpret=interpret,
    )(flat)
    return out[:count].reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def unit_lower_inverse(strict, method="xla", interpret=False):
    """(I + strict)^-1 for strict [..., C, C] strictly lower triangular, by `method` (the engine key
    `linear_chunk_inverse`: xla or pallas); `interpret` runs the kernel in Pallas's interpreter."""
    if method == "xla":
        return xla_inverse(strict)
    return pallas_inverse(strict, interpret=interpret)


def _inverse_forward(strict, method, interpret):
    inverse = unit_lower_inverse(strict, method, interpret)
    return inverse, inverse


def _inverse_backward(method, interpret, inverse, grad):
    """d strict = -X^T G X^T below the diagonal (d M^-1 = -M^-1 dM M^-1); only X is kept."""
    del method, interpret
    transposed = jnp.swapaxes(inverse, -1, -2)
    d_strict = -jnp.einsum("...ij,...jk,...kl->...il", transposed, grad, transposed)
    return (jnp.tril(d_strict, -1),)


unit_lower_inverse.defvjp(_inverse_forward, _inverse_backward)
