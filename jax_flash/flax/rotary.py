"""Rotary position embeddings (RoFormer, arXiv:2104.09864), in the half-split layout of GPT-NeoX and Llama."""

from __future__ import annotations

import jax.numpy as jnp


def apply_rotary(x, positions, base: float = 10000.0):
    """Rotates x [batch, seq, heads, head_dim] (or [seq, heads, head_dim]) by its tokens' positions.

    Feature i of the first half and feature i of the second half form a pair, turned by the angle
    position * base**(-2i / head_dim), so that q.k depends on the two tokens' positions only through their offset.
    positions: [batch, seq] or [seq], integer or float. Computed in float32 (angles of large positions lose their
    phase in 16-bit floats) and returned in x's dtype.
    """
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"rotary embeddings pair up features, so head_dim must be even, got {head_dim}")
    half = head_dim // 2
    inverse_frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * inverse_frequencies
    angles = angles[..., None, :]  # the same angle for every head
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)
