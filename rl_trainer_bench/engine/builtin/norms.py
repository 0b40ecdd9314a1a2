"""RMS normalization: one definition for the decoder's norms and Gated DeltaNet's output norm.

Both normalize in float32 whatever the compute dtype, so a bfloat16 run rounds only the result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_normalized(x, eps):
    """x / rms(x) over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def rms_norm(x, scale, eps):
    """x / rms(x) * scale, computed in float32, returned in x's dtype."""
    return (rms_normalized(x, eps) * scale).astype(x.dtype)
